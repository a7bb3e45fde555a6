// "Did you mean" for config keys and enum values: the closest known spelling within a small
// edit distance.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mixprec {

// Levenshtein distance (insertions, deletions, substitutions, each cost 1), ignoring ASCII
// case.
size_t edit_distance(std::string_view a, std::string_view b);

// The candidate closest to `word` with distance <= max_distance (the first on ties), or
// nothing. An exact match counts (distance 0).
std::optional<std::string> closest_match(std::string_view word,
                                         const std::vector<std::string>& candidates,
                                         size_t max_distance = 2);

// The same over (spelling, suggestion) pairs: a spelling within max_distance of `word`
// suggests its paired name, so that synonyms such as learning_rate can point at lr.
std::optional<std::string> closest_match(
    std::string_view word, const std::vector<std::pair<std::string, std::string>>& spellings,
    size_t max_distance = 2);

}  // namespace mixprec
