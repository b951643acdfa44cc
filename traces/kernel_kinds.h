// Which parasol op kind a device kernel is, by its name: the rules the trace imports
// (kineto_import.h, nsys_import.h) share. GEMMs from cuBLAS, cuBLASLt, CUTLASS and cuDNN names
// (gemm, gemv, cutlass, xmma, nvjet, ampere_/sm90_..., not fbgemm's sparse kernels), attention
// (flash, fmha, sdpa, cuDNN's fused attention), norms, activations, AdamW, gradient norms,
// cross-entropy, embedding lookups, other elementwise and reduction kernels, and NCCL's
// collectives and send/receive.
#pragma once

#include <string>

namespace parasol::traces {

// The parasol kind of a device kernel by its name alone ("linear", "attention", "norm",
// "all-reduce", "send", ...), or "" when no rule matches (see the header comment).
std::string classify_kernel(const std::string& name);

// The parasol kind of a collective named by NCCL's kernel or PyTorch's c10d ("AllReduce",
// "allreduce_", "_allgather_base", "all_to_allv", "recv"): "all-reduce", "all-gather",
// "reduce-scatter", "all-to-all", "broadcast", "send", "recv", or "".
std::string collective_kind(const std::string& name);

}  // namespace parasol::traces
