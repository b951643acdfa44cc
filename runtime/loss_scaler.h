// LossScaler: dynamic loss scaling for fp16 training, as Megatron-LM's DynamicGradScaler and
// torch.cuda.amp.GradScaler do it. The loss gradient is multiplied by scale() before the backward
// pass and the gradients are unscaled before clipping and the optimizer (Executor: StepConfig::
// loss_scale); a step whose gradients are not finite (the global norm is inf or NaN) is skipped,
// optimizer state included, and update(true) counts it: after `hysteresis` such steps the scale is
// multiplied by backoff_factor (never below min_scale). After growth_interval finite steps in a
// row it is multiplied by growth_factor and the hysteresis is restored. With the factors powers of
// two and a power-of-two scale, scaling and unscaling are exact in floating point.
#pragma once

#include <cstdint>

namespace parasol::runtime {

struct LossScalerConfig {
  bool enabled = false;
  double initial_scale = 65536.0;  // 2^16 (torch's GradScaler; Megatron starts at 2^32)
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 1000;  // Megatron's default (torch: 2000)
  int hysteresis = 1;  // overflowing steps before a back-off (torch: 1; Megatron's default: 2)
  double min_scale = 1.0;
};

// The scaler's state, as a checkpoint keeps it.
struct LossScalerState {
  double scale = 1.0;
  int64_t growth_tracker = 0;  // finite steps since the last overflow or growth
  int hysteresis_tracker = 1;  // overflows left before the next back-off
};

class LossScaler {
 public:
  // Throws parasol::Error naming the field of a config out of range.
  explicit LossScaler(const LossScalerConfig& config = {});

  bool enabled() const { return config_.enabled; }
  // The factor of the loss gradient: 1 when disabled.
  double scale() const { return config_.enabled ? state_.scale : 1.0; }
  // After a step: overflow = its gradients were not finite (the step was skipped).
  void update(bool overflow);

  const LossScalerState& state() const { return state_; }
  // Throws parasol::Error when the state is not one this config can reach (scale not finite or
  // below min_scale, negative trackers).
  void restore(const LossScalerState& s);

 private:
  LossScalerConfig config_;
  LossScalerState state_;
};

}  // namespace parasol::runtime
