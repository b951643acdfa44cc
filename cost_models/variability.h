// Stragglers in the closed form: a synchronous job waits for its slowest GPU. When each GPU's
// compute takes (1 + cv z) times the median GPU's, z standard normal and independent across GPUs
// (Profile::gpu_speed_cv), a step whose ranks meet in collectives every step lasts its
// communication plus the compute of the slowest of its n GPUs, in expectation
// compute x (1 + cv E[max of n standard normals]).
#pragma once

namespace parasol::cost {

// E[max of n independent standard normals] (0 for n = 1; 0.5642 for n = 2; ~3.9 for 16,384), by
// numerical integration. REQUIRES: n >= 1.
double expected_max_standard_normal(int n);

// The expected step time of `gpus` synchronous GPUs whose median GPU takes `step_s`, of which
// `compute_s` is compute, under the per-GPU variability `cv`.
// REQUIRES: 0 <= compute_s <= step_s, cv >= 0, gpus >= 1.
double expected_step_time_s(double step_s, double compute_s, double cv, int gpus);

}  // namespace parasol::cost
