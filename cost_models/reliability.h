// Reliability: how often a training job is interrupted. Failure rates per component (GPU, HBM,
// NIC, host, fabric switch, fabric link, and the software of each rank), each derived from a
// public count of interruptions, times the number of such components in the job's cluster graph,
// give the job's interruption rate and its mean time between interruptions (MTBI). Failures are
// taken as independent with constant rates (a Poisson process), the model behind Young/Daly.
#pragma once

#include <array>
#include <string>

#include "core/cluster.h"
#include "core/json_reader.h"

namespace parasol::cost {

enum class Component { kGpu, kHbm, kNic, kHost, kSwitch, kLink, kSoftware };
inline constexpr int kComponents = 7;
const char* component_name(Component c);

// Interruptions per component-hour, indexed by Component.
struct FailureRates {
  std::array<double, kComponents> per_hour{};
  double rate(Component c) const { return per_hour[static_cast<int>(c)]; }
};

// parasol's defaults: the Llama 3 405B pre-training run's unexpected interruptions (Llama 3 paper,
// arXiv 2407.21783, section 3.3.4, Table 5: 419 in 54 days on 16,384 H100s in 2,048 hosts),
// divided by that cluster's components and hours (see reliability.cc for each figure).
FailureRates default_failure_rates();

// How many of each component a cluster graph holds: GPUs (kGpu, kHbm and kSoftware: one stack
// and one training process per GPU), NIC vertices, servers (kHost), fabric switches (switch
// vertices outside any server) and fabric links (links with a fabric switch at one end).
std::array<double, kComponents> count_components(const Cluster& c);

struct JobReliability {
  std::array<double, kComponents> count{};     // components of the job's cluster
  std::array<double, kComponents> per_hour{};  // interruptions per hour they cause
  double interruptions_per_hour = 0;           // their sum
  double mtbi_s = 0;                           // mean time between interruptions (seconds)
};

// The job that holds every GPU of `c`. REQUIRES: at least one rate > 0 for a finite MTBI (else
// mtbi_s is +infinity).
JobReliability job_reliability(const Cluster& c, const FailureRates& rates);

// {"mtbi_h", "interruptions_per_day", "by_component": {name: {"count", "per_day"}}}.
Json job_reliability_to_json(const JobReliability& r);

}  // namespace parasol::cost
