// One list of columns serves the terminal table and bench.md, so the two never disagree.
#include "apps/bench/bench_report.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <functional>
#include <sstream>

#include "apps/bench/bench.h"

namespace mixprec {

namespace {

// `value` with `significant` digits but never in exponent form (step times from 0.05 ms to
// seconds, throughputs in the millions).
std::string format_significant(double value, int significant) {
  if (!std::isfinite(value)) return std::to_string(value);
  const int magnitude =
      value == 0.0 ? 0 : static_cast<int>(std::floor(std::log10(std::abs(value))));
  const int decimals = std::clamp(significant - 1 - magnitude, 0, 6);
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", decimals, value);
  return text;
}

// Whole numbers (loss scales such as 65536) without decimals, others in the shortest form.
std::string format_plain(double value) {
  char text[64];
  if (std::isfinite(value) && value == std::floor(value) && std::abs(value) < 1e15) {
    std::snprintf(text, sizeof text, "%.0f", value);
  } else {
    std::snprintf(text, sizeof text, "%g", value);
  }
  return text;
}

std::string format_fixed(double value, int decimals) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", decimals, value);
  return text;
}

struct Column {
  const char* header;
  const char* key;
  bool text;  // left-aligned
  std::function<std::string(double)> format;
};

const std::vector<Column>& columns() {
  static const std::vector<Column> all{
      {"framework", "framework", true, nullptr},
      {"precision", "precision", true, nullptr},
      {"median ms", "median_step_ms", false, [](double v) { return format_significant(v, 4); }},
      {"min ms", "min_step_ms", false, [](double v) { return format_significant(v, 4); }},
      {"max ms", "max_step_ms", false, [](double v) { return format_significant(v, 4); }},
      {"throughput", "throughput", false, [](double v) { return format_significant(v, 4); }},
      {"peak MiB", "peak_mem_mb", false, [](double v) { return format_fixed(v, 1); }},
      {"final loss", "final_loss", false, [](double v) { return format_fixed(v, 4); }},
      {"val loss", "val_loss", false, [](double v) { return format_fixed(v, 4); }},
      {"val acc", "val_accuracy", false, [](double v) { return format_fixed(v, 4); }},
      {"skipped", "skipped_steps", false, [](double v) { return format_fixed(v, 0); }},
      {"final scale", "final_scale", false, [](double v) { return format_plain(v); }},
      {"syncs/step", "host_syncs_per_step", false, [](double v) { return format_fixed(v, 2); }},
      {"vs fp32", "speedup_vs_fp32", false, [](double v) { return format_fixed(v, 2) + "x"; }},
      {"vs mixprec fp32", "vs_mixprec_fp32", false,
       [](double v) { return format_fixed(v, 2) + "x"; }},
  };
  return all;
}

std::string cell(const nlohmann::json& row, const Column& column) {
  if (!row.is_object() || !row.contains(column.key) || row[column.key].is_null()) return "-";
  const nlohmann::json& value = row[column.key];
  if (value.is_string()) return value.get<std::string>();
  if (value.is_number() && column.format) return column.format(value.get<double>());
  return value.dump();
}

// The throughput unit when every row that has one has the same, else empty (each cell then
// says it).
std::string common_unit(const nlohmann::json& rows) {
  std::string unit;
  for (const nlohmann::json& row : rows) {
    const std::string u = row.is_object() ? row.value("throughput_unit", "") : "";
    if (u.empty()) continue;
    if (!unit.empty() && u != unit) return "";
    unit = u;
  }
  return unit;
}

// The table as cells, header first.
std::vector<std::vector<std::string>> table_cells(const nlohmann::json& bench) {
  const nlohmann::json rows = bench.value("rows", nlohmann::json::array());
  const std::string unit = common_unit(rows);
  std::vector<std::vector<std::string>> cells(1);
  for (const Column& column : columns()) {
    const std::string header = column.header;
    cells[0].push_back(header == "throughput" && !unit.empty() ? header + " " + unit : header);
  }
  for (const nlohmann::json& row : rows) {
    std::vector<std::string> line;
    for (const Column& column : columns()) {
      std::string text = cell(row, column);
      if (std::string(column.key) == "throughput" && unit.empty() && text != "-") {
        text += ' ';
        text += row.value("throughput_unit", std::string());
      }
      line.push_back(text);
    }
    cells.push_back(line);
  }
  return cells;
}

// "<framework> <precision>: <note>" for every row with a note, and "...: skipped: <reason>"
// for a compared framework's row that did not run; rows with the same text share one line
// ("torch fp32, bf16: ...").
std::vector<std::string> row_notes(const nlohmann::json& bench) {
  struct Note {
    std::string text;
    std::string who;             // "torch fp32, bf16"
    std::string last_framework;  // of the last row added to `who`
  };
  std::vector<Note> notes;
  const auto add = [&](const std::string& framework, const std::string& precision,
                       const std::string& text) {
    for (Note& note : notes) {
      if (note.text != text) continue;
      note.who += ", " + (note.last_framework == framework ? precision
                                                           : framework + " " + precision);
      note.last_framework = framework;
      return;
    }
    notes.push_back({text, framework + " " + precision, framework});
  };
  for (const nlohmann::json& row : bench.value("rows", nlohmann::json::array())) {
    if (!row.is_object()) continue;
    const std::string framework = row.value("framework", std::string("?"));
    const std::string precision = row.value("precision", std::string("?"));
    if (row.contains("skipped") && row["skipped"].is_string()) {
      add(framework, precision, "skipped: " + row["skipped"].get<std::string>());
    }
    const std::string note =
        row.contains("note") && row["note"].is_string() ? row["note"].get<std::string>() : "";
    if (!note.empty()) add(framework, precision, note);
  }
  std::vector<std::string> lines;
  for (const Note& note : notes) lines.push_back(note.who + ": " + note.text);
  return lines;
}

std::string heading(const nlohmann::json& bench) {
  std::ostringstream text;
  text << bench.value("name", std::string("bench")) << " on "
       << bench.value("device", std::string("?"));
  // A bench.json of PyTorch's (or of an older mixprec) may not say.
  if (bench.contains("tf32") && bench["tf32"].is_boolean())
    text << (bench["tf32"].get<bool>() ? " with TF32 on" : " with TF32 off");
  text << ", " << bench.value("steps", int64_t{0})
       << " steps per precision; step times leave out the first "
       << bench.value("warmup", int64_t{0}) << " steps";
  // Which instructions a CPU run's BF16 products took (core/cpu/bf16_dot_gemm.h).
  if (bench.contains("cpu_bf16_products") && bench["cpu_bf16_products"].is_string())
    text << "; BF16 products: " << bench["cpu_bf16_products"].get<std::string>();
  if (bench.contains("cpu_f16_products") && bench["cpu_f16_products"].is_string())
    text << "; FP16 products: " << bench["cpu_f16_products"].get<std::string>();
  return text.str();
}

bool needs_quotes(const std::string& word) {
  if (word.empty()) return true;
  for (const char c : word) {
    const bool plain = std::isalnum(static_cast<unsigned char>(c)) ||
                       std::string("_-./=,:+@%").find(c) != std::string::npos;
    if (!plain) return true;
  }
  return false;
}

}  // namespace

std::string bench_table(const nlohmann::json& bench) {
  const std::vector<std::vector<std::string>> cells = table_cells(bench);
  std::vector<size_t> widths(columns().size(), 0);
  for (const auto& line : cells) {
    for (size_t i = 0; i < line.size(); ++i) widths[i] = std::max(widths[i], line[i].size());
  }
  std::ostringstream text;
  text << heading(bench) << "\n";
  for (size_t r = 0; r < cells.size(); ++r) {
    std::string line;
    for (size_t i = 0; i < cells[r].size(); ++i) {
      const std::string& value = cells[r][i];
      const std::string pad(widths[i] - value.size(), ' ');
      line += (i == 0 ? "" : "  ") + (columns()[i].text ? value + pad : pad + value);
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    text << line << "\n";
    if (r == 0) {
      size_t total = 0;
      for (const size_t w : widths) total += w;
      text << std::string(total + 2 * (widths.size() - 1), '-') << "\n";
    }
  }
  for (const std::string& note : row_notes(bench)) text << "note: " << note << "\n";
  return text.str();
}

std::string shell_command(const std::vector<std::string>& args) {
  std::string line;
  for (const std::string& arg : args) {
    if (!line.empty()) line += ' ';
    if (!needs_quotes(arg)) {
      line += arg;
      continue;
    }
    line += '\'';
    for (const char c : arg) line += c == '\'' ? std::string("'\\''") : std::string(1, c);
    line += '\'';
  }
  return line;
}

std::string bench_markdown(const nlohmann::json& bench, const std::vector<std::string>& charts,
                           const std::vector<std::string>& commands) {
  const std::vector<std::vector<std::string>> cells = table_cells(bench);
  std::ostringstream text;
  text << "# Bench: " << bench.value("name", std::string("bench")) << "\n\n"
       << heading(bench) << ". Config: `" << bench.value("config", std::string()) << "`.\n\n";
  for (size_t r = 0; r < cells.size(); ++r) {
    text << "|";
    for (const std::string& value : cells[r]) text << " " << value << " |";
    text << "\n";
    if (r == 0) {
      text << "|";
      for (const Column& column : columns()) text << (column.text ? "---|" : "---:|");
      text << "\n";
    }
  }
  const std::vector<std::string> notes = row_notes(bench);
  if (!notes.empty()) {
    text << "\n";
    for (const std::string& note : notes) text << "- " << note << "\n";
  }
  text << "\nStep times are wall-clock per optimizer step, evaluations and checkpoints left out; "
          "throughput is from the median; \"vs fp32\" is the fp32 row's median over this row's, "
          "within one framework.\n";
  for (const std::string& chart : charts) text << "\n![" << chart << "](" << chart << ")\n";
  text << "\n## Commands\n\n```sh\n";
  for (const std::string& command : commands) text << command << "\n";
  text << "```\n";
  return text.str();
}

}  // namespace mixprec
