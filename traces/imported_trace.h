// What a trace import returns, whichever tool wrote the trace (PyTorch profiler:
// kineto_import.h; Nsight Systems: nsys_import.h): the device activities as a parasol Trace of
// "measured" events without op ids, each event's shape where the trace said it, the events per
// kind, the kernels no rule classified (named and counted), and each rank's launch gaps.
//
// Launch gaps. Per rank, an interval in which no device activity runs between its first and
// last one is idle time; the part of it until the next activity's launch call returned (the
// device waited for the host to launch it) is the host's launch gap.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/json_reader.h"
#include "traces/trace.h"

namespace parasol::traces {

// What one imported event was shaped as, where the trace said (parallel to Trace::events).
struct KernelShape {
  int64_t m = 0, n = 0, k = 0, batch = 1;  // GEMMs
  // Attention: [batch, heads, seq_q, head_dim] of the query, kv_heads and seq_kv of the key (as
  // the op that defines them holds them, kineto_import.h); causal: 1 or 0 as the trace states it,
  // -1 unstated; backward: the kernel is an attention backward (by its op or its name).
  int64_t attn_batch = 0, heads = 0, kv_heads = 0, seq_q = 0, seq_kv = 0, head_dim = 0;
  int causal = -1;
  bool backward = false;
  double elements = 0;  // compute ops: elements of the first input; collectives: the payload's
  std::string dtype;    // parasol's dtype name ("fp32", "bf16", ...) or "" when unknown
  int group_size = 0;   // collectives: ranks of the communicator (0: unknown)
  std::string group;    // collectives: the process group's name or description, when given
  std::vector<int> group_ranks;  // collectives: the global ranks of the communicator, when given
  std::string size_from;  // collectives: "kernel", "record_param_comms", "c10d" or "" (unknown)
};

// FLOPs of an imported attention kernel of shape `s` (attn_batch > 0): core's attention_flops of a
// fused kernel, causal unless the trace said otherwise (`causal_if_unstated`), times
// kFlashBackwardFlopRatio for a backward.
double attention_kernel_flops(const KernelShape& s, bool causal_if_unstated = true);

struct KernelCount {
  std::string name;
  int count = 0;
  double seconds = 0;  // summed over the occurrences
};

struct RankGaps {
  int rank = 0;
  double busy_s = 0;    // the union of the rank's device activities
  double idle_s = 0;    // between its first and last activity, nothing ran
  double launch_s = 0;  // the part of idle_s that waited for the host's launch
  int launch_gaps = 0;  // idle intervals with a launch wait
};

struct ImportedTrace {
  Trace trace;                      // source "measured", no op ids, no plan
  std::vector<KernelShape> shapes;  // one per trace.events entry
  std::vector<std::string> files;
  int kernels = 0;  // kernel events (not memcpy or memset)
  // Training steps the trace holds: the most "ProfilerStep#N" annotations of a file (at least 1).
  int steps = 1;
  std::map<std::string, int> by_kind;     // events per kind, "unclassified" included
  std::vector<KernelCount> unclassified;  // by name, most time first
  std::vector<RankGaps> gaps;             // per rank, ascending
  // What the trace says of the job, where it says it: the world size (Kineto's
  // distributedInfo.world_size; 0: unstated) and the GPUs' names (deviceProperties, Nsight's
  // TARGET_INFO_GPU), deduplicated.
  int world_size = 0;
  std::vector<std::string> devices;
  // Per rank, its step time from its "ProfilerStep#N" ranges (each timed on its own host's
  // clock; ranks' clocks are not synchronised), where it has any: Kineto's, the period of the
  // device work the ranges launched (kineto_import.cc's step_seconds), else their mean duration.
  std::map<int, double> step_s;
};

// Copies as the plan makes them: when it offloads (`plan_offloads`: optimizer state,
// parameters or activations in host memory), each host-to-device memcpy ("HtoD" in its name) is
// a "prefetch" and each device-to-host one ("DtoH") an "offload", as core/program.h's copies;
// otherwise they stay "memcpy" (a job that does not offload copies its inputs and reads back its
// loss). by_kind follows.
void label_copies_by_plan(ImportedTrace& imp, bool plan_offloads);

// The traced step time: the median over ranks of step_s (the ranks of a synchronous job step
// together; the median is not moved by one rank's outlier), or 0 when no rank timed its steps.
double step_time_s(const ImportedTrace& imp);

// Where an imported trace contradicts the plan it is priced with, each naming both: the GPU (a
// device family named in the trace's device names, "V100", "H100", "MI300X", ..., that the
// cluster's device name does not have), the world size (distributedInfo against the plan's
// ranks), the ranks (a traced rank >= the plan's world size, or more ranks than it), the
// precision (the dtype of most of the traced GEMM time against the plan's; fp32 traces' tf32
// GEMMs agree with an fp32 plan), the step (a trace whose launching ops put kernels in the
// forward and none in a backward or an optimizer step is an inference or forward-only trace,
// while the plan's step trains: the vLLM and SGLang traces of TraceLens's tests). An empty device
// name or dtype is not checked. Empty when nothing contradicts it.
std::vector<std::string> plan_mismatches(const ImportedTrace& imp, const std::string& device_name,
                                         int plan_world, const std::string& plan_dtype);

// Throws a parasol::Error at "traces" listing plan_mismatches (and that --allow-mismatch
// prices the trace anyway) when there are any and !allow; returns them otherwise.
std::vector<std::string> check_against_plan(const ImportedTrace& imp,
                                            const std::string& device_name, int plan_world,
                                            const std::string& plan_dtype, bool allow);

// One device activity of a rank, in microseconds of the trace's clock: its interval and when the
// host call that launched it returned (< 0: unknown).
struct DeviceSpan {
  double start = 0, end = 0, launch_end = -1;
};

// A rank's step time (seconds) from its "ProfilerStep#N" ranges (`ranges`: start and end, in
// microseconds on the clock of `spans`) and its device activities (`spans`, each in the range
// whose span holds the end of its launch call). Where two or more ranges launched device work:
// the steady period of the device, from the end of the first such range's work to the end of the
// last's, over the ranges between: a host that runs ahead of its GPU (no sync each step) closes
// its ranges before the GPU ends their work, so their mean is short of the step (TraceLens's
// MI300X resnet trace: 16.2 ms ranges, 18.8 ms apart on the device), and ranges that launched
// nothing (warm-up) do not count. Else the ranges' mean, or the one range's device work where
// that is longer.
double profiler_step_seconds(std::vector<std::pair<double, double>> ranges,
                             const std::vector<DeviceSpan>& spans);

// Completes a rank's import whose trace.events (all of `rank`) are filled: by_kind,
// unclassified (events of kind "unclassified", by name), gaps from `spans`, the streams named by
// what they ran ("compute", "comm" or "copy (cuda stream N)") and the process "rank N".
void finish_rank(ImportedTrace& imp, int rank, const std::vector<DeviceSpan>& spans);

// A trace that parasol wrote (a `parasol run --trace` measurement, its op ids kept or stripped),
// read as a measured trace of another tool: one part per rank, for merge_imported. Its events
// keep their kinds, phases, bytes and FLOPs and lose their op ids (they are set beside a plan by
// kind, as imported kernels are); its streams keep their names ("compute", "comm0", "copy");
// steps are the steps the trace states (Trace::steps), else those summary.h counts by op id.
// Shapes, launch gaps' host waits, the world size and devices are unknown.
std::vector<ImportedTrace> import_parasol_trace(const Trace& trace);

// Merges per-rank imports (parts[i] read from files[i]): times from the earliest activity of all,
// events (with their shapes) by (rank, stream, start); two parts of one rank are a
// parasol::Error naming the file. REQUIRES: parts.size() == files.size().
ImportedTrace merge_imported(std::vector<ImportedTrace> parts,
                             const std::vector<std::string>& files);

// {"files", "ranks", "events", "steps", "kernels", "by_kind": {kind: {"events", "seconds"}},
//  "unclassified": [{"name", "count", "seconds"}], "gaps": [{"rank", "busy_s", "idle_s",
//  "launch_s", "launch_gaps"}], "collectives": [{"kind", "events", "bytes", "sized"}],
//  "step_time_s" (0: untimed), "world_size" (0: unstated), "devices"}.
Json import_summary_to_json(const ImportedTrace& imp);

}  // namespace parasol::traces
