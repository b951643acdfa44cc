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
//    from the innermost attention op of the stack that holds q, k, v, as PyTorch's schema for it
//    places them: aten::_flash_attention_forward/backward and _efficient_attention_forward/
//    backward (under SDPA, after its transpose) as [batch, seq, heads, head_dim], the
//    aten::*scaled_dot_product* ops as [batch, heads, seq, head_dim]; a backward's query is its
//    second input (after grad_out). Causal from its "Concrete Inputs" (is_causal, or the efficient
//    kernels' custom_mask_type), else from an enclosing attention op's, else unstated (counted
//    causal). Backward when the op is a backward or the kernel's name says so
//    (is_backward_kernel). FLOPs: attention_kernel_flops (core's attention_flops, x 2.5 backward);
//    FlashAttention's backward helper kernels take none.
//  - Other compute ops take their elements from the innermost op with Input Dims (the first
//    input's); norms, activations and pointwise elementwise kernels (not gathers, scatters,
//    copies of concatenation, reductions, scans) their bytes from every tensor input read once
//    and the output written once (shaped as the largest input; see streamed_bytes), except a
//    dtype conversion: fbgemm's HFP8 quantize and dequantize write their output's dtype (1 and 4
//    bytes an element), and other fbgemm "...Quantized..." ops, whose output dtype the trace does
//    not say, get no bytes.
//  - Collectives and send/receive take their kind, element count, dtype and group size from, in
//    this order: the kernel's own args (newer Kineto: "Collective name", "In msg nelems",
//    "Out msg nelems", "dtype", "Group size"), the stack's record_param_comms (the same args,
//    or in older traces its first "Input Dims" and "Input type"), the stack's c10d:: op
//    ("c10d::allreduce_", "c10d::_allgather_base_", ...: its dims and types; so too the
//    functional "_c10d_functional::" and symmetric-memory "symm_mem::" ops, but for their
//    all-gathers), and last the kernel's name (ncclDevKernel_AllReduce_...,
//    ncclKernel_SendRecv_...: kind only; ncclDevKernel_Generic says none: "collective"). Bytes
//    follow the nccl-tests convention of core/program.h: all-reduce and broadcast the buffer,
//    all-gather the output, reduce-scatter the input, all-to-all the send buffer, send/receive
//    the message.
//  - A memcpy is a "memcpy" (label_copies_by_plan makes a plan's offloads and prefetches of
//    them), a memset a "memset"; bytes from the activity's "bytes".
// Formats: PyTorch 1.8-1.9's categories ("Kernel", "Operator", "Runtime", "Memcpy", "Memset";
// string tids; its GPUs under "computeProperties"); a rank's steps are its "ProfilerStep#N" ranges
// (user_annotation, or an "Operator" in 1.8-1.9), its step time imported_trace.h's
// profiler_step_seconds. A trace without device activities is a CPU job's when its profiler saw
// no GPU, else refused saying what it has instead (CPU ops only; CUPTI range-profiler kernels;
// another accelerator's events).
// A GEMM kernel launched by aten::_grouped_mm or _scaled_grouped_mm, or under vLLM's
// vllm::moe_forward or a fused_moe op, is an "expert-linear".
// Kinds are op_kind_name()s where parasol has the op, else "elementwise", "reduction", "memcpy"
// and "memset"
// (kernel_kinds.h). A kernel that no rule classifies is kept as an event of kind "unclassified"
// and counted by name: nothing is dropped. Launch gaps as imported_trace.h says, the launch being
// the kernel's runtime call.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include "core/json_reader.h"
#include "traces/imported_trace.h"

namespace parasol::traces {

// Imports one parsed trace; `what` names it in errors, `default_rank` is its rank when it has no
// distributedInfo. Times stay absolute (microseconds from the trace's clock, in seconds) until
// merge_imported (imported_trace.h) shifts them. A malformed event is a parasol::Error naming
// "<what>.traceEvents[i].<field>".
ImportedTrace import_kineto(const Json& j, const std::string& what, int default_rank);
// The same import streamed from a trace's text (nlohmann's SAX parser): each event is converted
// to what the import reads of it (see KinetoImporter in the .cc) and dropped as it is read, so
// the memory held is that of the kept CPU ops, runtime calls and device activities, never the
// document's. The imported trace equals import_kineto's of the parsed text (a duplicated
// top-level "traceEvents" is read twice here, once there). With `require_kineto`, a text that
// looks_like_kineto would refuse is an Error saying so (as import_framework_traces words it), and
// a top-level array of events is one; but where `written_by_parasol` is given, a trace that
// parasol wrote (otherData.generator "parasol") sets *written_by_parasol and imports as nothing
// (the caller reads it as parasol's: imported_trace.h's import_parasol_trace). Malformed JSON is
// an Error as parse_json words it.
ImportedTrace import_kineto_stream(std::istream& in, const std::string& what, int default_rank,
                                   bool require_kineto, bool* written_by_parasol = nullptr);
// import_kineto_stream of a file, plain or gzip, inflated as it is read (text_file.h's
// TextFileBuf); errors name the file.
ImportedTrace import_kineto_file(const std::string& path, int default_rank, bool require_kineto,
                                 bool* written_by_parasol = nullptr);
// Reads, imports and merges per-rank files (gzip when the file starts with gzip's magic bytes):
// times from the earliest device activity of all files; two files of one rank are an Error.
// Unreadable, truncated or malformed files are a parasol::Error naming the file and position.
ImportedTrace import_kineto_files(const std::vector<std::string>& paths);

// True when `j` looks like a Kineto trace rather than parasol's own (it has Kineto's
// "schemaVersion", "distributedInfo" or device activity categories, and no parasol generator).
bool looks_like_kineto(const Json& j);

}  // namespace parasol::traces
