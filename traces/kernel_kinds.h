// Which parasol op kind a device kernel is, by its name: the rules the trace imports
// (kineto_import.h, nsys_import.h) share, one ordered table of patterns (kernel_kinds.cc), each
// naming the libraries whose kernels it matches. Communication: NCCL/RCCL collectives and
// send/receive (an NCCL kernel that does not name its collective, ncclDevKernel_Generic, is a
// "collective"), PyTorch's symmetric-memory collectives (multimem_all_reduce_kernel, ...), vLLM's
// and TensorRT-LLM's custom all-reduces, DeepEP's dispatch/combine/notify kernels (an all-to-all,
// as parasol's deepep dispatcher models them). Attention: FlashAttention 2/3, FlashMLA, PyTorch's
// memory-efficient and cuDNN's fused kernels, ROCm CK, FlashInfer's prefill/decode, vLLM's paged
// attention. MoE routing ("router"), token permutation ("dispatch") and un-permutation
// ("combine") kernels of TensorRT-LLM, triton_kernels, vLLM and Transformer Engine. Expert
// (grouped) GEMMs as "expert-linear"; GEMMs of cuBLAS(Lt), CUTLASS, cuDNN,
// Inductor and ROCm's hipBLASLt/Tensile (Cijk_*) as "linear" (not fbgemm's, not helper kernels of
// a *gemm namespace); norms, activations, AdamW, gradient norms, cross-entropy, embedding lookups;
// reductions, sorts and scans as "reduction"; rotary embeddings, transposes and other pointwise
// kernels as "elementwise".
#pragma once

#include <string>

namespace parasol::traces {

// The text rules the kernel-name matchers here and in the trace imports share: `s` lower-cased;
// whether `s` contains `part`; the letters and digits of `s`, lower-cased ("_allgather_base_" ->
// "allgatherbase").
std::string lower_case(std::string s);
bool name_has(const std::string& s, const char* part);
std::string squash_name(const std::string& s);

// The parasol kind of a device kernel by its name alone ("linear", "expert-linear",
// "attention", "norm", "reduction", "all-reduce", "all-to-all", "send", ...), or "" when no rule
// matches (see the header comment).
std::string classify_kernel(const std::string& name);

// Whether an attention kernel is a backward, by its name: FlashAttention's flash_bwd_*,
// PyTorch's memory-efficient fmha_cutlassB_* (fmha_cutlassF_* is the forward), cuDNN's *bprop*/
// dgrad, Triton's *_bwd*, anything named "backward".
bool is_backward_kernel(const std::string& name);

// Whether an attention kernel is a helper of a fused backward rather than its main kernel:
// FlashAttention's flash_bwd_dot_do_o (the dot(dO, O) preprocessing) and flash_bwd_convert_dq/dkv
// (the fp32 accumulator's conversion).
bool is_attention_helper_kernel(const std::string& name);

// The parasol kind of a collective named by NCCL's kernel or PyTorch's c10d ("AllReduce",
// "allreduce_", "_allgather_base", "all_to_allv", "recv"): "all-reduce", "all-gather",
// "reduce-scatter", "all-to-all", "broadcast", "send", "recv", or "".
std::string collective_kind(const std::string& name);

}  // namespace parasol::traces
