#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <catch2/catch.hpp>

#include "apps/plot/gnuplot.h"
#include "scratch_dir.h"

namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Sets PATH for the scope of one test and restores it after.
class PathOverride {
 public:
  explicit PathOverride(const char* value) : old_(std::getenv("PATH") ? std::getenv("PATH") : "") {
    setenv("PATH", value, 1);
  }
  ~PathOverride() { setenv("PATH", old_.c_str(), 1); }

 private:
  std::string old_;
};

const char* kLineScript = "plot 'line.dat' using 1:2 with lines title 'y = 2x'\n";

void write_line_data(const std::string& folder) {
  std::ofstream data(folder + "/line.dat");
  for (int x = 0; x < 5; ++x) data << x << ' ' << 2 * x << '\n';
}

}  // namespace

TEST_CASE("render_chart draws a PNG with gnuplot when it is installed", "[apps][plot]") {
  if (!mixprec::gnuplot_available()) {
    WARN("gnuplot is not installed: skipped (scripts/setup.sh installs gnuplot-nox)");
    return;
  }
  mixprec_test::ScratchDir dir("chart");
  write_line_data(dir.path().string());
  const mixprec::ChartResult result = mixprec::render_chart(dir.path().string(), "line", kLineScript, 320, 200);
  REQUIRE(result.rendered);
  const std::string png = read_all(result.png_path);
  REQUIRE(png.size() > 8);
  CHECK(png.substr(1, 3) == "PNG");
  const std::string script = read_all(result.script_path);
  CHECK(script.find("size 320,200") != std::string::npos);
  CHECK(script.find("set output 'line.png'") != std::string::npos);
  CHECK(script.find(kLineScript) != std::string::npos);
}

TEST_CASE("render_chart keeps the script and says how to render it without gnuplot",
          "[apps][plot]") {
  mixprec_test::ScratchDir dir("chart-nognuplot");
  write_line_data(dir.path().string());
  PathOverride empty_path(dir.path().string().c_str());  // a folder with no gnuplot in it
  REQUIRE_FALSE(mixprec::gnuplot_available());
  const mixprec::ChartResult result = mixprec::render_chart(dir.path().string(), "line", kLineScript);
  CHECK_FALSE(result.rendered);
  CHECK_FALSE(std::filesystem::exists(result.png_path));
  CHECK(std::filesystem::exists(result.script_path));
  CHECK(result.message.find("gnuplot line.gp") != std::string::npos);
  CHECK(result.message.find("gnuplot-nox") != std::string::npos);
}

TEST_CASE("render_chart reports a script gnuplot rejects instead of throwing", "[apps][plot]") {
  if (!mixprec::gnuplot_available()) {
    WARN("gnuplot is not installed: skipped");
    return;
  }
  mixprec_test::ScratchDir dir("chart-bad");
  const mixprec::ChartResult result =
      mixprec::render_chart(dir.path().string(), "bad", "plot 'no-such-file.dat' using 1:2\n");
  CHECK_FALSE(result.rendered);
  CHECK(result.message.find("gnuplot failed") != std::string::npos);
  CHECK(result.message.find("no-such-file") != std::string::npos);
}

TEST_CASE("gnuplot_quote doubles single quotes", "[apps][plot]") {
  CHECK(mixprec::gnuplot_quote("it's") == "it''s");
  CHECK(mixprec::gnuplot_quote("plain") == "plain");
}
