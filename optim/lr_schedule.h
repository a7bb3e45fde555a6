// Learning-rate schedules as pure functions of the number of updates actually applied
// (Optimizer::steps_taken()), so a step that GradScaler skipped does not advance them and a
// resumed run needs no schedule state: after each taken step the trainer sets
// optimizer.set_lr(schedule.lr_at(optimizer.steps_taken())).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace mixprec {

class LrSchedule {
 public:
  virtual ~LrSchedule() = default;
  // The learning rate for the update that follows `steps_taken` applied updates (0 = the
  // first update). Never negative.
  virtual double lr_at(int64_t steps_taken) const = 0;
  virtual std::string describe() const = 0;
};

// base_lr for ever.
std::unique_ptr<LrSchedule> make_constant_schedule(double base_lr);
// torch StepLR: base_lr * gamma^(steps_taken / step_size). Throws for step_size < 1, gamma
// outside (0, 1], base_lr < 0.
std::unique_ptr<LrSchedule> make_step_schedule(double base_lr, int64_t step_size, double gamma);
// nanoGPT's get_lr: linear warmup from base_lr/warmup_steps... to base_lr over warmup_steps
// ((t + 1) / warmup_steps * base_lr for t < warmup_steps), then cosine decay to min_lr at
// decay_steps, then min_lr. Throws for warmup_steps < 0, decay_steps < warmup_steps,
// min_lr < 0 or min_lr > base_lr.
std::unique_ptr<LrSchedule> make_warmup_cosine_schedule(double base_lr, int64_t warmup_steps,
                                                        int64_t decay_steps, double min_lr);

}  // namespace mixprec
