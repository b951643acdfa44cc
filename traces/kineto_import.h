// Import of PyTorch profiler (Kineto) Chrome JSON traces, one file per rank as torch.profiler
// writes them (plain or gzip-compressed), into parasol's trace schema (traces/trace.h), so that
// `parasol trace import`, `compare --measured` and `calibrate --measured` read the measurements
// of jobs that parasol did not run.
//
// What becomes an event. Every device activity: each kernel ("cat": "kernel"), memcpy
// ("gpu_memcpy") and memset ("gpu_memset") is one TraceEvent of the file's rank (Kineto's
// "distributedInfo.rank", else the file's position in the list), on its CUDA stream ("tid"),
// with times relative to the earliest device activity of all the files. Its kind is
// classify_kernel()'s, refined by the CPU op that launched it: the kernel's "correlation" finds
// its runtime call ("cat": "cuda_runtime"), and the CPU ops ("cpu_op") that enclose that call
// on its thread are its launch stack (innermost last).
//  - GEMMs take m, n, k and batch from the stack's aten::mm / addmm / bmm / baddbmm / linear /
//    matmul "Input Dims" (FLOPs 2 batch m n k) and the dtype of their inputs ("tf32" for fp32
//    inputs when the kernel's name says tensor-core math: "tf32", "tensorop_s"); a split-k
//    reduction or epilogue kernel of a GEMM takes none (it is not the product). Attention its shape
//    from aten::_scaled_dot_product_*_attention's [batch, heads, seq, head_dim] inputs.
//  - Other compute ops take their elements from the innermost op with Input Dims (the first
//    input's); norms, activations and pointwise elementwise kernels (not gathers, scatters,
//    copies of concatenation, reductions, scans) bytes = 2 x elements x its dtype's bytes (read
//    once and written once).
//  - Collectives and send/receive take their kind, element count, dtype and group size from, in
//    this order: the kernel's own args (newer Kineto: "Collective name", "In msg nelems",
//    "Out msg nelems", "dtype", "Group size"), the stack's record_param_comms (the same args,
//    or in older traces its first "Input Dims" and "Input type"), the stack's c10d:: op
//    ("c10d::allreduce_", "c10d::_allgather_base_", ...: its dims and types), and last the
//    kernel's name (ncclDevKernel_AllReduce_..., ncclKernel_SendRecv_...: kind only). Bytes
//    follow the nccl-tests convention of core/program.h: all-reduce and broadcast the buffer,
//    all-gather the output, reduce-scatter the input, all-to-all the send buffer, send/receive
//    the message.
//  - A memcpy host -> device is a "prefetch", device -> host an "offload" (core/program.h's
//    copies), others "memcpy"; a memset is a "memset"; bytes from the activity's "bytes".
// Kinds are op_kind_name()s where parasol has the op, else "elementwise", "memcpy" and "memset".
// A kernel that no rule classifies is kept as an event of kind "unclassified" and counted by
// name: nothing is dropped.
//
// Launch gaps. Per rank, an interval in which no device activity runs between its first and
// last one is idle time; the part of it that ends with the next activity's runtime call (the
// device waited for the host to launch it: the call returned after the device went idle) is
// the host's launch gap.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/json_reader.h"
#include "traces/trace.h"

namespace parasol::traces {

// The parasol kind of a device kernel by its name alone ("linear", "attention", "norm",
// "all-reduce", "send", ...), or "" when no rule matches (see the header comment).
std::string classify_kernel(const std::string& name);

// What one imported event was shaped as, where the trace said (parallel to Trace::events).
struct KernelShape {
  int64_t m = 0, n = 0, k = 0, batch = 1;  // GEMMs
  // Attention: [batch, heads, seq_q, head_dim] of the query, kv_heads and seq_kv of the key.
  int64_t attn_batch = 0, heads = 0, kv_heads = 0, seq_q = 0, seq_kv = 0, head_dim = 0;
  double elements = 0;    // compute ops: elements of the first input; collectives: the payload's
  std::string dtype;      // parasol's dtype name ("fp32", "bf16", ...) or "" when unknown
  int group_size = 0;     // collectives: ranks of the communicator (0: unknown)
  std::string group;      // collectives: the process group's name or description, when given
  std::string size_from;  // collectives: "kernel", "record_param_comms", "c10d" or "" (unknown)
};

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

struct KinetoImport {
  Trace trace;                      // source "measured", no op ids, no plan
  std::vector<KernelShape> shapes;  // one per trace.events entry
  std::vector<std::string> files;
  int kernels = 0;  // kernel events (not memcpy or memset)
  // Training steps the trace holds: the most "ProfilerStep#N" annotations of a file (at least 1).
  int steps = 1;
  std::map<std::string, int> by_kind;     // events per kind, "unclassified" included
  std::vector<KernelCount> unclassified;  // by name, most time first
  std::vector<RankGaps> gaps;             // per rank, ascending
};

// Imports one parsed trace; `what` names it in errors, `default_rank` is its rank when it has no
// distributedInfo. Times stay absolute (microseconds from the trace's clock, in seconds) until
// import_kineto_traces shifts them. A malformed event is a parasol::Error naming
// "<what>.traceEvents[i].<field>".
KinetoImport import_kineto(const Json& j, const std::string& what, int default_rank);
// Reads, imports and merges per-rank files (gzip when the file starts with gzip's magic bytes):
// times from the earliest device activity of all files; two files of one rank are an Error.
// Unreadable, truncated or malformed files are a parasol::Error naming the file and position.
KinetoImport import_kineto_files(const std::vector<std::string>& paths);

// True when `j` looks like a Kineto trace rather than parasol's own (it has Kineto's
// "schemaVersion", "distributedInfo" or device activity categories, and no parasol generator).
bool looks_like_kineto(const Json& j);

// {"files", "ranks", "events", "steps", "kernels", "by_kind": {kind: {"events", "seconds"}},
//  "unclassified": [{"name", "count", "seconds"}], "gaps": [{"rank", "busy_s", "idle_s",
//  "launch_s", "launch_gaps"}], "collectives": [{"kind", "events", "bytes", "sized"}]}.
Json import_summary_to_json(const KinetoImport& imp);

}  // namespace parasol::traces
