// Power figures with their sources, and the cluster's IT power.
#include "cost_models/energy.h"

#include <algorithm>

#include "core/device_family.h"
#include "core/error.h"
#include "cost_models/reliability.h"

namespace parasol::cost {

PowerFigures default_power(const Cluster& c) {
  PowerFigures p;
  const DeviceSpec& d = c.gpu_device(0);
  // GPU: the datasheet board power (device.cc: H100 SXM 700 W, A100 SXM 400 W, ...).
  p.gpu_w = d.tdp_watts;
  // Idle: an estimate, not a datasheet figure: an idle H100 SXM or A100 SXM reads about 60-90 W
  // in nvidia-smi, ~0.1 of its board power.
  p.gpu_idle_fraction = 0.1;
  // The rest of a server: the DGX datasheets' maximum system power less the GPUs' board power.
  // DGX H100 (and DGX H200, the same chassis): 10.2 kW - 8 x 700 W = 4.6 kW, 575 W per GPU; DGX
  // A100: 6.5 kW - 8 x 400 W = 3.3 kW, 412 W per GPU. Other servers take the DGX H100 figure.
  const DeviceFamily family = device_family(d);
  p.host_w_per_gpu = family == DeviceFamily::kAmpere ? 3300.0 / 8 : 4600.0 / 8;
  if (family == DeviceFamily::kHostCpu) p.host_w_per_gpu = 0;  // the host is the device
  // A fabric switch: an estimate, not a datasheet figure: a 64-port 400 Gb/s 1U switch with its
  // transceivers draws about 1 kW.
  p.switch_w = 1000;
  // PUE 1.1: Google's fleet-wide trailing figure (1.10 in 2021; Google's data-centre efficiency
  // reports); hyperscale AI data centres report 1.08-1.2.
  p.pue = 1.1;
  return p;
}

double it_power_w(double gpus, double switches, const PowerFigures& p, double busy) {
  PARASOL_CHECK(0 <= busy && busy <= 1, "busy fraction " + std::to_string(busy));
  const double gpu = p.gpu_w * (p.gpu_idle_fraction + (1 - p.gpu_idle_fraction) * busy);
  return gpus * (gpu + p.host_w_per_gpu) + switches * p.switch_w;
}

namespace {
double fabric_switches(const Cluster& c) {
  return count_components(c)[static_cast<int>(Component::kSwitch)];
}
}  // namespace

double cluster_it_power_w(const Cluster& c, const PowerFigures& p, double busy) {
  return it_power_w(c.num_gpus(), fabric_switches(c), p, busy);
}

double busy_fraction(double compute_s, double step_s) {
  return std::clamp(compute_s / std::max(1e-30, step_s), 0.0, 1.0);
}

double facility_energy_j(double gpus, double switches, const PowerFigures& p, double busy,
                         double stepping_s, double idle_s) {
  return (it_power_w(gpus, switches, p, busy) * stepping_s +
          it_power_w(gpus, switches, p, 0) * idle_s) *
         p.pue;
}

double cluster_energy_j(const Cluster& c, const PowerFigures& p, double busy, double stepping_s,
                        double idle_s) {
  return facility_energy_j(c.num_gpus(), fabric_switches(c), p, busy, stepping_s, idle_s);
}

Json power_figures_to_json(const PowerFigures& p) {
  return {{"gpu_W", p.gpu_w},
          {"gpu_idle_fraction", p.gpu_idle_fraction},
          {"host_W_per_gpu", p.host_w_per_gpu},
          {"switch_W", p.switch_w},
          {"pue", p.pue}};
}

}  // namespace parasol::cost
