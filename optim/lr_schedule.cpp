// LR schedules: closed-form functions of the step count, computed in double.
#include "optim/lr_schedule.h"

#include <cmath>
#include <numbers>
#include <sstream>

#include "core/error.h"

namespace mixprec {
namespace {

void check_steps(const char* schedule, int64_t steps_taken) {
  MIXPREC_CHECK(steps_taken >= 0, schedule, " schedule: steps_taken must not be negative, got ",
                steps_taken);
}

void check_base_lr(const char* schedule, double base_lr) {
  MIXPREC_CHECK(std::isfinite(base_lr) && base_lr >= 0.0, schedule,
                " schedule: base_lr must be finite and non-negative, got ", base_lr);
}

class ConstantSchedule final : public LrSchedule {
 public:
  explicit ConstantSchedule(double base_lr) : base_lr_(base_lr) {}
  double lr_at(int64_t steps_taken) const override {
    check_steps("constant", steps_taken);
    return base_lr_;
  }
  std::string describe() const override {
    std::ostringstream out;
    out << "constant(lr=" << base_lr_ << ")";
    return out.str();
  }

 private:
  double base_lr_;
};

class StepSchedule final : public LrSchedule {
 public:
  StepSchedule(double base_lr, int64_t step_size, double gamma)
      : base_lr_(base_lr), step_size_(step_size), gamma_(gamma) {}
  double lr_at(int64_t steps_taken) const override {
    check_steps("step", steps_taken);
    // Integer division: the rate changes exactly at multiples of step_size, as StepLR does.
    return base_lr_ * std::pow(gamma_, static_cast<double>(steps_taken / step_size_));
  }
  std::string describe() const override {
    std::ostringstream out;
    out << "step(lr=" << base_lr_ << ", step_size=" << step_size_ << ", gamma=" << gamma_ << ")";
    return out.str();
  }

 private:
  double base_lr_;
  int64_t step_size_;
  double gamma_;
};

class WarmupCosineSchedule final : public LrSchedule {
 public:
  WarmupCosineSchedule(double base_lr, int64_t warmup_steps, int64_t decay_steps, double min_lr)
      : base_lr_(base_lr), warmup_(warmup_steps), decay_(decay_steps), min_lr_(min_lr) {}
  double lr_at(int64_t steps_taken) const override {
    check_steps("cosine", steps_taken);
    const int64_t t = steps_taken;
    // With warmup 0 this branch never runs: the first update already gets base_lr.
    if (t < warmup_) return base_lr_ * static_cast<double>(t + 1) / static_cast<double>(warmup_);
    if (t > decay_) return min_lr_;
    // decay_ == warmup_ leaves no cosine phase; the one step t == decay_ gets min_lr, as the
    // end of every other decay does (ratio 1), instead of dividing 0 by 0.
    const double ratio = decay_ == warmup_ ? 1.0
                                           : static_cast<double>(t - warmup_) /
                                                 static_cast<double>(decay_ - warmup_);
    const double coeff = 0.5 * (1.0 + std::cos(std::numbers::pi * ratio));
    return min_lr_ + coeff * (base_lr_ - min_lr_);
  }
  std::string describe() const override {
    std::ostringstream out;
    out << "cosine(lr=" << base_lr_ << ", warmup=" << warmup_ << ", decay_steps=" << decay_
        << ", min_lr=" << min_lr_ << ")";
    return out.str();
  }

 private:
  double base_lr_;
  int64_t warmup_;
  int64_t decay_;
  double min_lr_;
};

}  // namespace

std::unique_ptr<LrSchedule> make_constant_schedule(double base_lr) {
  check_base_lr("constant", base_lr);
  return std::make_unique<ConstantSchedule>(base_lr);
}

std::unique_ptr<LrSchedule> make_step_schedule(double base_lr, int64_t step_size, double gamma) {
  check_base_lr("step", base_lr);
  MIXPREC_CHECK(step_size >= 1, "step schedule: step_size must be at least 1, got ", step_size);
  MIXPREC_CHECK(std::isfinite(gamma) && gamma > 0.0 && gamma <= 1.0,
                "step schedule: gamma must be in (0, 1], got ", gamma);
  return std::make_unique<StepSchedule>(base_lr, step_size, gamma);
}

std::unique_ptr<LrSchedule> make_warmup_cosine_schedule(double base_lr, int64_t warmup_steps,
                                                        int64_t decay_steps, double min_lr) {
  check_base_lr("cosine", base_lr);
  MIXPREC_CHECK(warmup_steps >= 0, "cosine schedule: warmup_steps must not be negative, got ",
                warmup_steps);
  MIXPREC_CHECK(decay_steps >= warmup_steps, "cosine schedule: decay_steps (", decay_steps,
                ") must not be less than warmup_steps (", warmup_steps, ")");
  MIXPREC_CHECK(std::isfinite(min_lr) && min_lr >= 0.0 && min_lr <= base_lr,
                "cosine schedule: min_lr must be in [0, base_lr = ", base_lr, "], got ", min_lr);
  return std::make_unique<WarmupCosineSchedule>(base_lr, warmup_steps, decay_steps, min_lr);
}

}  // namespace mixprec
