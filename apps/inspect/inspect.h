// `mixprec inspect CONFIG [--steps N] [--batches B] [--out DIR]`: the histogram that
// motivated loss scaling (Micikevicius et al., Mixed Precision Training, ICLR 2018: the
// magnitudes of activation gradients, most of them below FP16's range), reproduced on the
// config's own model.
//
// 1. The model trains `steps` optimizer steps exactly as `mixprec train` would start the run
//    (its precision, loss scaling, optimizer, LR schedule, accumulation and clipping); nothing
//    of that training is saved, and the config's debug settings are not applied.
// 2. An FP32 copy of the model (the same FP32 master weights and buffers, in train mode) runs
//    forward and backward with the unscaled loss on the next `batches` training batches. Every
//    layer output's gradient (each leaf module and each transformer block, named by module
//    path) and every parameter's gradient is counted in log2 bins of |g| (2^-40 .. 2^20, plus
//    an underflow bin, an overflow bin and the exact zeros), with the fraction of non-zero
//    values that FP16 (core/half.h's rounding) would flush to zero without scaling and with
//    the current scale S, would overflow with S, and would hold as subnormals.
// 3. S is the scaler's scale after those steps; under a config without loss scaling it is 1,
//    except for fp32 configs, where it is the scale FP16's default policy starts with
//    (65536), so that the report says what switching to fp16 would do. The recommended scale
//    is the smallest power of two 2^k (k in -24..40) under which at least 99.9% of all
//    gathered non-zero gradients fit FP16 and none overflows (apps/inspect/grad_histogram.h).
//
// Outputs in out_dir: inspect.json (keys in apps/inspect/inspect_report.h), summary.txt, and
// activation_gradients.png / weight_gradients.png with their data (.dat) and gnuplot scripts
// (.gp); without gnuplot the PNGs are missing and `log` says how to draw them later. With
// log.tensorboard (the default) also a TensorBoard event file of the same histograms
// (apps/inspect/tensorboard_histograms.h). The
// folder may exist, but not with an earlier report in it. Nothing is written until every
// measurement is done, so bad input or a failure while training or measuring writes nothing.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mixprec {

struct InspectOptions {
  std::string config_path;
  std::vector<std::string> overrides;  // --set
  int64_t steps = 0;      // optimizer steps trained first, as the config says (its precision and loss scaling), before measuring
  int64_t batches = 1;    // training batches whose gradients are gathered
  std::string out_dir;    // empty: runs/<name>-inspect-<YYYYmmdd-HHMMSS>
};
// Writes inspect.json, the charts and summary.txt into out_dir and returns inspect.json's object.
// Throws mixprec::Error for bad input before writing anything.
nlohmann::json run_inspect(const InspectOptions& options, std::ostream& log);

}  // namespace mixprec
