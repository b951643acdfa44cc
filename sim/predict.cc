// The event simulator as a predictor of published runs.
#include "sim/predict.h"

#include <algorithm>

#include "core/lower.h"
#include "cost_models/memory.h"
#include "sim/engine.h"

namespace parasol::sim {

cost::Prediction simulate_prediction(const Model& m, const Cluster& c, const Plan& p,
                                     const cost::Profile& prof, cost::Reserved reserved) {
  Simulator sim(m, c, prof);
  sim.set_reserved(reserved);
  SimResult r = sim.simulate(lower(m, c, p), false);
  cost::Prediction out;
  out.step_time_s = r.step_time_s;
  const double tokens = static_cast<double>(p.global_batch) * p.seq(m);
  out.mfu = flops_per_token(m, p.seq(m)).model * tokens /
            (c.gpu_device(0).peak_flops(p.precision) * c.num_gpus() * r.step_time_s);
  out.stage_memory = r.memory_per_stage;
  out.memory_per_gpu_bytes = r.memory_per_stage[r.peak_stage].device_used();
  out.device_memory_bytes = c.gpu_device(0).hbm_bytes;
  out.fits = out.memory_per_gpu_bytes <= out.device_memory_bytes;
  // The search's verdict on the worst stage (kFits < kNotByReserved < kNotByAllocated).
  out.memory_fit = cost::MemoryFit::kFits;
  for (const cost::FrameworkMemory& f : r.memory_per_stage)
    out.memory_fit = std::max(out.memory_fit, cost::memory_fit(f, out.device_memory_bytes));
  return out;
}

}  // namespace parasol::sim
