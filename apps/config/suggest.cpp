#include "apps/config/suggest.h"

#include <algorithm>
#include <numeric>

namespace mixprec {
namespace {

char lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

}  // namespace

size_t edit_distance(std::string_view a, std::string_view b) {
  // One row of the dynamic-programming table at a time: row[j] is the distance between the
  // first i characters of a and the first j of b.
  std::vector<size_t> row(b.size() + 1);
  std::iota(row.begin(), row.end(), size_t{0});
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      const size_t substitution = diagonal + (lower(a[i - 1]) == lower(b[j - 1]) ? 0 : 1);
      row[j] = std::min({above + 1, row[j - 1] + 1, substitution});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::optional<std::string> closest_match(std::string_view word,
                                         const std::vector<std::string>& candidates,
                                         size_t max_distance) {
  std::vector<std::pair<std::string, std::string>> spellings;
  spellings.reserve(candidates.size());
  for (const std::string& candidate : candidates) spellings.emplace_back(candidate, candidate);
  return closest_match(word, spellings, max_distance);
}

std::optional<std::string> closest_match(
    std::string_view word, const std::vector<std::pair<std::string, std::string>>& spellings,
    size_t max_distance) {
  std::optional<std::string> best;
  size_t best_distance = max_distance + 1;
  for (const auto& [spelling, suggestion] : spellings) {
    const size_t distance = edit_distance(word, spelling);
    if (distance < best_distance) {
      best_distance = distance;
      best = suggestion;
    }
  }
  return best;
}

}  // namespace mixprec
