// Op kinds of device kernels by their names (see kernel_kinds.h).
#include "traces/kernel_kinds.h"

#include <cctype>

namespace parasol::traces {

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool has(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

// Letters and digits of `s`, lower-cased ("_allgather_base_" -> "allgatherbase").
std::string squash(const std::string& s) {
  std::string out;
  for (char c : s)
    if (std::isalnum(static_cast<unsigned char>(c)))
      out.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  return out;
}

}  // namespace

std::string collective_kind(const std::string& name) {
  const std::string s = squash(name);
  if (has(s, "allreduce")) return "all-reduce";
  if (has(s, "allgather")) return "all-gather";
  if (has(s, "reducescatter")) return "reduce-scatter";
  if (has(s, "alltoall")) return "all-to-all";
  if (has(s, "broadcast")) return "broadcast";
  if (has(s, "sendrecv") || s.rfind("send", 0) == 0 || s == "isend") return "send";
  if (s.rfind("recv", 0) == 0 || s == "irecv") return "recv";
  return "";
}

std::string classify_kernel(const std::string& name) {
  const std::string s = lower(name);
  if (s.rfind("nccl", 0) == 0 || has(s, " nccl") || has(s, "::nccl")) {
    const std::string k = collective_kind(name);
    return k.empty() ? "" : k;
  }
  if (has(s, "flash") || has(s, "fmha") || has(s, "sdpa") || has(s, "attention") ||
      has(s, "attn_fwd") || has(s, "attn_bwd"))
    return "attention";
  if (has(s, "layer_norm") || has(s, "layernorm") || has(s, "rms_norm") || has(s, "rmsnorm") ||
      has(s, "rowwisemoments") || has(s, "gammabetabackward") || has(s, "batch_norm") ||
      has(s, "batchnorm") || has(s, "cudnn::bn_") || has(s, "group_norm"))
    return "norm";
  // "gemm" but not fbgemm's (Facebook's sparse and embedding library) kernels.
  bool gemm = false;
  for (size_t p = s.find("gemm"); p != std::string::npos && !gemm; p = s.find("gemm", p + 1))
    gemm = p < 2 || s.compare(p - 2, 2, "fb") != 0;
  if (gemm || has(s, "gemv") || has(s, "cublas") || has(s, "cutlass") || has(s, "xmma") ||
      has(s, "nvjet") || has(s, "splitkreduce") || has(s, "scudnn") || has(s, "epilogue::impl") ||
      has(s, "triton_tem_fused_mm") ||
      (s.rfind("ampere_", 0) == 0 || s.rfind("volta_", 0) == 0 || s.rfind("turing_", 0) == 0 ||
       s.rfind("sm90_", 0) == 0 || s.rfind("sm80_", 0) == 0 || s.rfind("sm100_", 0) == 0))
    return "linear";
  if (has(s, "adam") || has(s, "sgdmath") || has(s, "fused_sgd")) return "adamw";
  if (has(s, "l2norm") || has(s, "lpnorm") || has(s, "norm_kernel")) return "grad-norm";
  if (has(s, "cross_entropy") || has(s, "nll_loss") || has(s, "log_softmax") ||
      has(s, "logsoftmax"))
    return "cross-entropy";
  if (has(s, "embedding") || has(s, "indexselect") || has(s, "index_select")) return "embedding";
  if (has(s, "gelu") || has(s, "silu") || has(s, "swiglu") || has(s, "relu") || has(s, "sigmoid") ||
      has(s, "tanh") || has(s, "glu_kernel"))
    return "activation";
  if (has(s, "elementwise") || has(s, "reduce_kernel") || has(s, "catarraybatchedcopy") ||
      has(s, "fillfunctor") || has(s, "copy_kernel") || has(s, "softmax") || has(s, "cub::") ||
      has(s, "multi_tensor_apply") || has(s, "triton_poi") || has(s, "triton_red") ||
      has(s, "triton_per") || has(s, "nchwtonhwc") || has(s, "nhwctonchw") ||
      has(s, "index_elementwise") || has(s, "scatter_gather") || has(s, "radixsort") ||
      has(s, "dropout") || has(s, "memcpy") || has(s, "memset") || has(s, "max_pool") ||
      has(s, "avg_pool") || has(s, "scan"))
    return "elementwise";
  return "";
}

}  // namespace parasol::traces
