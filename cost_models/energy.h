// Energy of a job: the GPUs' datasheet power scaled by how busy they are, the rest of each server
// (CPUs, memory, NICs, NVSwitches, fans), the fabric's switches, and the facility around them
// (power usage effectiveness, PUE). Each default figure's source is in energy.cc.
#pragma once

#include "core/cluster.h"
#include "core/json_reader.h"

namespace parasol::cost {

struct PowerFigures {
  double gpu_w = 0;              // a GPU's board power at full load (datasheet TDP), watts
  double gpu_idle_fraction = 0;  // an idle GPU's power as a fraction of gpu_w
  double host_w_per_gpu = 0;     // the rest of a server at load, per GPU, watts
  double switch_w = 0;           // a fabric switch, watts
  double pue = 0;                // facility power / IT power
};

// parasol's defaults for the cluster's device (energy.cc cites each).
PowerFigures default_power(const Cluster& c);

// IT power of the whole cluster (watts, before PUE) with its GPUs busy a fraction `busy` of the
// time (0: idle, waiting on a checkpoint or a restart; 1: computing all the time).
// REQUIRES: 0 <= busy <= 1.
double cluster_it_power_w(const Cluster& c, const PowerFigures& p, double busy);
// The same for `gpus` GPUs and `switches` fabric switches.
double it_power_w(double gpus, double switches, const PowerFigures& p, double busy);

// The fraction of a step its GPUs compute: compute_s / step_s, within [0, 1].
double busy_fraction(double compute_s, double step_s);

// Facility energy (joules: IT power x PUE) of `gpus` GPUs and `switches` fabric switches running
// steps for `stepping_s` seconds with their GPUs busy a fraction `busy`, then idle for `idle_s`
// seconds (checkpoint writes, restarts). REQUIRES: 0 <= busy <= 1.
double facility_energy_j(double gpus, double switches, const PowerFigures& p, double busy,
                         double stepping_s, double idle_s = 0);
// The same for the cluster's GPUs and switches.
double cluster_energy_j(const Cluster& c, const PowerFigures& p, double busy, double stepping_s,
                        double idle_s = 0);

// {"gpu_W", "gpu_idle_fraction", "host_W_per_gpu", "switch_W", "pue"}.
Json power_figures_to_json(const PowerFigures& p);

}  // namespace parasol::cost
