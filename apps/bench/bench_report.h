// bench.md and the terminal table: the rows of bench.json as text.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mixprec {

// bench.md: a title with the config, device and step count, the rows as a markdown table
// (the same columns as bench_table), the rows' notes, the charts named in `charts` (PNG
// files beside bench.md), and `commands` as a shell block.
std::string bench_markdown(const nlohmann::json& bench, const std::vector<std::string>& charts,
                           const std::vector<std::string>& commands);

// `args` as one shell command line, each word quoted when the shell would change it.
std::string shell_command(const std::vector<std::string>& args);

}  // namespace mixprec
