// Op kinds of device kernels by their names (see kernel_kinds.h).
#include "traces/kernel_kinds.h"

#include <cctype>

namespace parasol::traces {

std::string lower_case(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool name_has(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

std::string squash_name(const std::string& s) {
  std::string out;
  for (char c : s)
    if (std::isalnum(static_cast<unsigned char>(c)))
      out.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  return out;
}

std::string collective_kind(const std::string& name) {
  const std::string s = squash_name(name);
  if (name_has(s, "allreduce")) return "all-reduce";
  if (name_has(s, "allgather")) return "all-gather";
  if (name_has(s, "reducescatter")) return "reduce-scatter";
  if (name_has(s, "alltoall")) return "all-to-all";
  if (name_has(s, "broadcast")) return "broadcast";
  if (name_has(s, "sendrecv") || s.rfind("send", 0) == 0 || s == "isend") return "send";
  if (s.rfind("recv", 0) == 0 || s == "irecv") return "recv";
  return "";
}

bool is_backward_kernel(const std::string& name) {
  const std::string s = lower_case(name);
  return name_has(s, "bwd") || name_has(s, "backward") || name_has(s, "bprop") ||
         name_has(s, "dgrad") || name_has(s, "cutlassb");
}

bool is_attention_helper_kernel(const std::string& name) {
  const std::string s = lower_case(name);
  return name_has(s, "flash_bwd_dot_do_o") || name_has(s, "flash_bwd_convert_dq") ||
         name_has(s, "flash_bwd_convert_dkv");
}

namespace {

// How a rule's pattern matches a kernel's lower-cased name.
enum class Match {
  kContains,  // anywhere
  kPrefix,    // at the start
  kGemm,      // "gemm" as a GEMM says it: not fbgemm's, not a namespace ("grouped_gemm::")
};

// One rule of the classifier: a kernel whose name matches `pattern` is of `kind`. A kind of
// "*collective" takes collective_kind() of the name. Rules are tried in order; the first match
// wins. Each names the library whose kernels it matches.
struct Rule {
  const char* kind;
  const char* pattern;
  Match match = Match::kContains;
};

constexpr Rule kRules[] = {
    // NCCL and RCCL collectives and send/receive: ncclDevKernel_AllReduce_Sum_bf16_RING_LL,
    // ncclKernel_SendRecv_... (RCCL keeps NCCL's names).
    {"*collective", "nccl", Match::kPrefix},
    {"*collective", " nccl"},
    {"*collective", "::nccl"},
    // PyTorch symmetric memory (torch/csrc/distributed/c10d/symm_mem): multimem_all_reduce_kernel,
    // one_shot_all_reduce_kernel, two_shot_all_reduce_kernel, multimem_all_gather_kernel.
    {"*collective", "multimem_all"},
    {"*collective", "one_shot_all_reduce"},
    {"*collective", "two_shot_all_reduce"},
    {"*collective", "symmetric_memory::"},
    // vLLM's and TensorRT-LLM's custom all-reduces.
    {"all-reduce", "cross_device_reduce"},
    {"all-reduce", "allreduce_fusion_kernel"},
    {"all-reduce", "custom_all_reduce"},
    // DeepEP (deepseek-ai/DeepEP): deep_ep::intranode::dispatch/combine/notify_dispatch,
    // internode and internode_ll: the MoE token exchange that parasol's deepep dispatcher models
    // as its all-to-all; its layout kernel (get_dispatch_layout) counts the tokens, locally.
    {"elementwise", "deep_ep::layout::"},
    {"elementwise", "get_dispatch_layout"},
    {"all-to-all", "deep_ep::"},
    // MoE routing, permutation and its GEMMs outside grouped-GEMM libraries, as real traces name
    // them: TensorRT-LLM's trtllm-gen MoE (moe::dev::routing::*, moe::dev::finalize::*, as vLLM
    // runs it on B200), OpenAI's triton_kernels (_topk_forward, _combined_routing_compute,
    // _sum_bitmatrix_rows, _matmul_ogs_*: the gather/scatter expert GEMM, _finalize_matmul_scatter,
    // as vLLM runs gpt-oss), vLLM's topkGatingSoftmax and moe_align_block_size, Transformer
    // Engine's moe_permute/moe_unpermute (Megatron's fused permutation).
    {"router", "moe::dev::routing"},
    {"router", "topkgatingsoftmax"},
    {"router", "_topk_forward"},
    {"router", "_combined_routing"},
    {"router", "_sum_bitmatrix_rows"},
    {"combine", "moe::dev::finalize"},
    {"combine", "_finalize_matmul_scatter"},
    {"combine", "moe_unpermute"},
    {"dispatch", "moe_permute"},
    {"dispatch", "moe_align_block_size"},
    {"expert-linear", "_matmul_ogs"},
    // Rotary position embeddings are pointwise kernels, not embedding lookups (vLLM's
    // rotary_embedding_kernel, FlashAttention's and Transformer Engine's apply_rotary).
    {"elementwise", "rotary"},
    {"elementwise", "rope_"},
    // Fused attention: FlashAttention 2/3 (flash_fwd_kernel, flash_bwd_*, flash::FlashAttn*),
    // FlashMLA (flash_fwd_splitkv_mla_kernel), xFormers/PyTorch memory-efficient (fmha_cutlassF/B),
    // cuDNN (..._sdpa_..._fprop/bprop), ROCm CK (ck_tile::FmhaFwdKernel), Triton (_attn_fwd),
    // FlashInfer's prefill/decode kernels (not its norm, activation or sampling kernels), vLLM's
    // paged attention.
    {"attention", "flash_fwd"},
    {"attention", "flash_bwd"},
    {"attention", "flashattn"},
    {"attention", "flash_attn"},
    {"attention", "fmha"},
    {"attention", "sdpa"},
    {"attention", "attn_fwd"},
    {"attention", "attn_bwd"},
    {"attention", "batchprefill"},
    {"attention", "batchdecode"},
    {"attention", "singleprefill"},
    {"attention", "singledecode"},
    {"attention", "mergestate"},
    {"attention", "attention"},
    // Norms: PyTorch's layer_norm kernels, RMSNorm (Apex, FlashInfer, vLLM), batch and group norm.
    {"norm", "layer_norm"},
    {"norm", "layernorm"},
    {"norm", "rms_norm"},
    {"norm", "rmsnorm"},
    {"norm", "rowwisemoments"},
    {"norm", "gammabetabackward"},
    {"norm", "batch_norm"},
    {"norm", "batchnorm"},
    {"norm", "cudnn::bn_"},
    {"norm", "group_norm"},
    // PyTorch's layer-norm backward (layer_norm_kernel.cu: cuComputePartGradGammaBeta,
    // cuComputeGradGammaBeta) and group-norm kernels (group_norm_kernel.cu).
    {"norm", "cucomputepartgradgammabeta"},
    {"norm", "cucomputegradgammabeta"},
    {"norm", "computeinternalgradients"},
    {"norm", "computefusedparams"},
    {"norm", "computebackwardfusedparams"},
    // Expert (grouped) GEMMs of MoE layers: CUTLASS's GemmGrouped (the grouped_gemm library that
    // Megatron's GroupedMLP calls), DeepGEMM's m_grouped GEMMs, TensorRT-LLM's moe_gemm, vLLM's
    // Triton fused_moe.
    {"expert-linear", "gemmgrouped"},
    {"expert-linear", "grouped_gemm_kernel"},
    {"expert-linear", "m_grouped"},
    {"expert-linear", "groupedcontiguous"},
    {"expert-linear", "groupedmasked"},
    {"expert-linear", "moe_gemm"},
    {"expert-linear", "fused_moe_kernel"},
    // GEMMs: cuBLAS/cuBLASLt (sm90_xmma_gemm_*, ampere_sgemm_*, nvjet_*, gemv, splitKreduce),
    // CUTLASS (cutlass_80_tensorop_s1688gemm, GemmUniversal), cuDNN's scudnn, TorchInductor's
    // triton_tem_fused_mm, ROCm's hipBLASLt/Tensile (Cijk_Ailk_Bljk_...), not fbgemm's sparse and
    // embedding kernels or helper kernels in a *gemm namespace (grouped_gemm::, deep_gemm::).
    {"linear", "gemm", Match::kGemm},
    {"linear", "gemv"},
    {"linear", "cublas"},
    {"linear", "xmma"},
    {"linear", "nvjet"},
    {"linear", "splitkreduce"},
    {"linear", "reducesplitk"},
    {"linear", "scudnn"},
    {"linear", "epilogue::impl"},
    {"linear", "triton_tem_fused_mm"},
    {"linear", "cijk_", Match::kPrefix},
    // TensorRT-LLM's trtllm-gen batched GEMMs (bmm_Bfloat16_MxE2m1MxE4m3_Fp32_t128x16x256u2_...).
    {"linear", "bmm_", Match::kPrefix},
    {"linear", "ampere_", Match::kPrefix},
    {"linear", "volta_", Match::kPrefix},
    {"linear", "turing_", Match::kPrefix},
    {"linear", "sm80_", Match::kPrefix},
    {"linear", "sm90_", Match::kPrefix},
    {"linear", "sm100_", Match::kPrefix},
    // Optimizers: PyTorch's fused and foreach Adam(W), Apex's multi_tensor_adam, SGD.
    {"adamw", "adam"},
    {"adamw", "sgdmath"},
    {"adamw", "fused_sgd"},
    // Gradient-norm clipping's norms.
    {"grad-norm", "l2norm"},
    {"grad-norm", "lpnorm"},
    {"grad-norm", "norm_kernel"},
    {"cross-entropy", "cross_entropy"},
    {"cross-entropy", "nll_loss"},
    {"cross-entropy", "log_softmax"},
    {"cross-entropy", "logsoftmax"},
    {"embedding", "embedding"},
    {"embedding", "indexselect"},
    {"embedding", "index_select"},
    // Activations: PyTorch's GELU/SiLU/GLU functors, FlashInfer's act_and_mul, vLLM's silu_and_mul.
    {"activation", "gelu"},
    {"activation", "silu"},
    {"activation", "swiglu"},
    {"activation", "relu"},
    {"activation", "sigmoid"},
    {"activation", "tanh"},
    {"activation", "glu_kernel"},
    {"activation", "act_and_mul"},
    // Reductions (sum, mean, max, argmax) and scans are not pointwise: they read their input and
    // write far less.
    {"reduction", "reduce_kernel"},
    {"reduction", "triton_red"},
    {"reduction", "triton_per"},
    {"reduction", "cub::"},
    {"reduction", "radixsort"},
    // torch.topk and torch.sort (ATen's sbtopk::gatherTopK, bitonicSortKVInPlace), as an MoE
    // router written in plain PyTorch launches them.
    {"reduction", "gathertopk"},
    {"reduction", "bitonicsort"},
    {"reduction", "scan"},
    // Other elementwise, copy and layout kernels.
    {"elementwise", "elementwise"},
    {"elementwise", "catarraybatchedcopy"},
    {"elementwise", "fillfunctor"},
    {"elementwise", "copy_kernel"},
    {"elementwise", "softmax"},
    {"elementwise", "multi_tensor_apply"},
    {"elementwise", "triton_poi"},
    {"elementwise", "nchwtonhwc"},
    {"elementwise", "nhwctonchw"},
    {"elementwise", "scatter_gather"},
    {"elementwise", "transpose"},
    {"elementwise", "dropout"},
    {"elementwise", "memcpy"},
    {"elementwise", "memset"},
    {"elementwise", "max_pool"},
    {"elementwise", "avg_pool"},
    // MIOpen's tensor ops (SubTensorOpWithScalar1d, SubTensorOpWithCastTensor1d: ROCm's
    // batch-norm and bias helpers); KV-cache writes (vLLM's reshape_and_cache_flash_kernel,
    // SGLang's store_kvcache); activation quantization (vLLM's scaled_fp8_quant_kernel,
    // TensorRT-LLM's quantize_with_block_size).
    {"elementwise", "subtensorop"},
    // ATen's indexing kernels (vectorized_gather_kernel of index and gather, indexFuncLargeIndex
    // of index_add/index_copy): gathers, whose bytes stay unknown (streams_its_tensors).
    {"elementwise", "vectorized_gather_kernel"},
    {"elementwise", "indexfunc"},
    {"elementwise", "reshape_and_cache"},
    {"elementwise", "store_kvcache"},
    {"elementwise", "fp8_quant"},
    {"elementwise", "quantize_with_block_size"},
};

// Whether `s` says "gemm" as a GEMM kernel does: not in fbgemm (Facebook's sparse and embedding
// library) and not as a namespace ("grouped_gemm::", "deep_gemm::", "cutlass::gemm::"), whose
// kernels may be transposes or argument setup.
bool says_gemm(const std::string& s) {
  for (size_t p = s.find("gemm"); p != std::string::npos; p = s.find("gemm", p + 1)) {
    if (p >= 2 && s.compare(p - 2, 2, "fb") == 0) continue;
    if (s.compare(p + 4, 2, "::") == 0) continue;
    return true;
  }
  return false;
}

bool matches(const Rule& r, const std::string& s) {
  switch (r.match) {
    case Match::kPrefix:
      return s.rfind(r.pattern, 0) == 0;
    case Match::kGemm:
      return says_gemm(s);
    case Match::kContains:
      break;
  }
  return name_has(s, r.pattern);
}

}  // namespace

std::string classify_kernel(const std::string& name) {
  const std::string s = lower_case(name);
  for (const Rule& r : kRules) {
    if (!matches(r, s)) continue;
    if (std::string(r.kind) != "*collective") return r.kind;
    // An NCCL kernel that does not name its collective (ncclDevKernel_Generic, as NCCL 2.19+ and
    // RCCL launch batched or ROCm collectives) is communication of a kind the name cannot say.
    const std::string k = collective_kind(name);
    return k.empty() ? "collective" : k;
  }
  return "";
}

}  // namespace parasol::traces
