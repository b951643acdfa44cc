// defines: LossScaler (runtime/loss_scaler.h): Megatron-LM's DynamicGradScaler update rule.
#include "runtime/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"

namespace parasol::runtime {

LossScaler::LossScaler(const LossScalerConfig& c) : config_(c) {
  const std::string f = "loss_scaling.";
  if (!(std::isfinite(c.initial_scale) && c.initial_scale > 0))
    throw Error(f + "initial_scale", "must be a finite number > 0");
  if (!(std::isfinite(c.growth_factor) && c.growth_factor >= 1))
    throw Error(f + "growth_factor", "must be a finite number >= 1");
  if (!(c.backoff_factor > 0 && c.backoff_factor < 1))
    throw Error(f + "backoff_factor", "must be in (0, 1)");
  if (c.growth_interval < 1) throw Error(f + "growth_interval", "must be >= 1");
  if (c.hysteresis < 1) throw Error(f + "hysteresis", "must be >= 1");
  if (!(std::isfinite(c.min_scale) && c.min_scale > 0 && c.min_scale <= c.initial_scale))
    throw Error(f + "min_scale", "must be a finite number in (0, initial_scale]");
  state_.scale = c.initial_scale;
  state_.hysteresis_tracker = c.hysteresis;
}

void LossScaler::update(bool overflow) {
  if (!config_.enabled) return;
  if (overflow) {
    state_.growth_tracker = 0;
    state_.hysteresis_tracker -= 1;
    if (state_.hysteresis_tracker <= 0)
      state_.scale = std::max(state_.scale * config_.backoff_factor, config_.min_scale);
    return;
  }
  if (++state_.growth_tracker == config_.growth_interval) {
    state_.growth_tracker = 0;
    state_.hysteresis_tracker = config_.hysteresis;
    state_.scale *= config_.growth_factor;
  }
}

void LossScaler::restore(const LossScalerState& s) {
  if (!(std::isfinite(s.scale) && s.scale >= config_.min_scale))
    throw Error("loss_scaling.scale",
                "must be a finite number >= min_scale (" + std::to_string(config_.min_scale) + ")");
  if (s.growth_tracker < 0 || s.growth_tracker >= config_.growth_interval)
    throw Error("loss_scaling.growth_tracker", "must be in [0, growth_interval)");
  if (s.hysteresis_tracker > config_.hysteresis)
    throw Error("loss_scaling.hysteresis_tracker", "must be <= hysteresis");
  state_ = s;
}

}  // namespace parasol::runtime
