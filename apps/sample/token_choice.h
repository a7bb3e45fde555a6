// How `mixprec sample` picks the next token from a row of logits: nanoGPT's sampling
// (temperature, then top-k, then a draw from the softmax), in double, from one uniform
// number so that a seed fixes the text.
#pragma once

#include <cstdint>
#include <span>

namespace mixprec {

struct TokenChoice {
  double temperature = 0.8;  // > 0: logits are divided by it
  int64_t top_k = 200;       // >= 1: only the top_k largest logits stay (all when >= the row)
};

// The id drawn from softmax(logits / temperature) restricted to the top_k largest logits
// (ties with the k-th largest stay, as nanoGPT's `logits < v[-1]` keeps them), by inverting
// the cumulative distribution at `u` in [0, 1). Logits that are -inf never win. Throws
// mixprec::Error for an empty row, a NaN or +inf logit (naming its index), a row of -inf
// only, and temperature or top_k out of range.
int32_t choose_token(std::span<const float> logits, const TokenChoice& choice, double u);

// The uniform number of token `index` under `seed` (53 random bits from Philox).
double token_uniform(uint64_t seed, uint64_t index);

}  // namespace mixprec
