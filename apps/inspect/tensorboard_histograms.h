// `mixprec inspect`'s gradient histograms as TensorBoard histograms, so that the layers can be
// browsed in TensorBoard's histogram dashboard beside the charts.
//
// The x axis is log2 |g|, as in the charts: bin k of a GradHistogram ([2^k, 2^(k+1))) is the
// bucket with upper edge k + 1. Zeros have no logarithm and are left out (inspect.json counts
// them); the underflow bin (|g| < 2^-40) is the bucket (-41, -40] and the overflow bin
// (|g| >= 2^20, infinities and NaN) the bucket (20, 21]. Only the buckets from the first to the
// last non-empty one are written; min and max are their outer edges, num the non-zero values,
// and sum and sum_squares are those of the buckets' centres (k + 0.5).
#pragma once

#include <optional>
#include <string>

#include "apps/inspect/grad_histogram.h"
#include "apps/inspect/inspect_report.h"
#include "apps/tensorboard/event_file.h"

namespace mixprec::inspect {

// `histogram` as above; nullopt when it holds no non-zero value.
std::optional<tensorboard::Histogram> log2_histogram(const GradHistogram& histogram);

// One event file in `dir` with one Event at step findings.steps holding a histogram per layer
// output (tag "grad_log2/activation/<layer>") and per parameter ("grad_log2/weight/<name>"),
// in inspect.json's order, each with at least one non-zero value. Returns the file's path.
std::string write_tensorboard_histograms(const std::string& dir, const InspectFindings& findings);

}  // namespace mixprec::inspect
