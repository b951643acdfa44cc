// StrictCpuBackend: the CPU backend with device memory the host cannot touch, so that the CPU
// tests see what a GPU would (issue 16). Its device allocations live in one arena that is
// inaccessible (PROT_NONE) except inside a DeviceAccess scope (runtime/device_access.h), which its
// kernels, copies and zeroing open, and so does the MPI communicator while it moves a buffer's
// bytes. Host code that reads or writes device memory (a std::fill on a parameter, a pwrite from
// a device pointer) gets SIGSEGV here, as it would on a GPU server. The kernels are CpuBackend's;
// host memory (alloc_host) stays ordinary. One StrictCpuBackend per process (the arena and the
// access hooks are process-wide). For tests: the protection toggles twice per kernel.
#pragma once

#include <cstddef>
#include <map>
#include <string>

#include "runtime/cpu/cpu_backend.h"

namespace parasol::runtime {

class StrictCpuBackend final : public Backend {
 public:
  // gemm_threads: as CpuBackend's. arena_bytes: the device memory this backend can hand out.
  explicit StrictCpuBackend(int gemm_threads = 0, size_t arena_bytes = size_t{4} << 30);
  ~StrictCpuBackend() override;
  StrictCpuBackend(const StrictCpuBackend&) = delete;
  StrictCpuBackend& operator=(const StrictCpuBackend&) = delete;

  std::string name() const override { return "cpu"; }

  void copy(void* dst, const void* src, size_t bytes) override;
  void zero(void* dst, size_t bytes) override;
  void synchronize() override {}
  // Copies between host memory and the arena, counted in copy() (either way).
  HostTraffic host_traffic() const override { return traffic_; }

  void embedding_forward(float* out, const int32_t* tokens, const float* table, int64_t vocab_start,
                         int64_t vocab_rows, const float* pos, int64_t pos_offset, int64_t rows,
                         int64_t seq, int64_t cols) override;
  void embedding_backward(float* dtable, float* dpos, const float* dout, const int32_t* tokens,
                          int64_t vocab_start, int64_t vocab_rows, int64_t pos_offset, int64_t rows,
                          int64_t seq, int64_t cols) override;
  void norm_forward(Norm kind, float* out, const float* x, const float* weight, const float* bias,
                    int64_t rows, int64_t cols, float eps) override;
  void norm_backward(Norm kind, float* dx, float* dweight, float* dbias, const float* dout,
                     const float* x, const float* weight, const float* dresidual, int64_t rows,
                     int64_t cols, float eps) override;
  void linear_forward(float* out, const float* in, const float* w, WeightLayout layout,
                      const float* bias, int64_t m, int64_t n, int64_t k) override;
  void linear_backward_data(float* din, const float* dout, const float* w, WeightLayout layout,
                            int64_t m, int64_t n, int64_t k, bool accumulate) override;
  void linear_backward_weight(float* dw, float* dbias, const float* in, const float* dout,
                              WeightLayout layout, int64_t m, int64_t n, int64_t k) override;
  void bias_forward(float* out, const float* bias, int64_t rows, int64_t cols) override;
  void bias_backward(float* dbias, const float* dout, int64_t rows, int64_t cols) override;
  void activation_forward(Activation kind, float* out, const float* in, int64_t rows,
                          int64_t cols) override;
  void activation_backward(Activation kind, float* din, const float* dout, const float* in,
                           int64_t rows, int64_t cols) override;
  void attention_forward(const AttentionDims& d, float* out, float* lse, float* probs,
                         const float* q, const float* k, const float* v, bool accumulate) override;
  void attention_backward(const AttentionDims& d, float* dq, float* dk, float* dv,
                          const float* dout, const float* q, const float* k, const float* v,
                          const float* out, const float* lse, const float* probs,
                          bool accumulate_dq, bool accumulate_dkv) override;
  void rope(float* x, int64_t ld, int64_t rows, int64_t seq, int64_t pos_offset, int64_t heads,
            int64_t head_dim, double theta, bool inverse) override;
  void residual_forward(float* out, uint8_t* mask, const float* x, const float* y,
                        const float* bias, int64_t rows, int64_t cols, float dropout_p,
                        uint64_t seed) override;
  void residual_backward(float* dy, float* dbias, const float* dout, const uint8_t* mask,
                         int64_t rows, int64_t cols, float dropout_p) override;
  void xent_row_max(float* row_max, const float* logits, int64_t rows, int64_t vocab) override;
  void xent_sum_exp(float* sum_exp, const float* logits, const float* row_max, int64_t rows,
                    int64_t vocab) override;
  void xent_target(float* target, const float* logits, const int32_t* labels, int64_t rows,
                   int64_t vocab, int64_t vocab_start) override;
  void xent_loss(float* loss, const float* row_max, const float* sum_exp, const float* target,
                 const int32_t* labels, int64_t rows) override;
  void xent_softmax(float* probs, const float* logits, const float* row_max, const float* sum_exp,
                    int64_t rows, int64_t vocab) override;
  void xent_backward(float* dlogits, const float* probs, const int32_t* labels, int64_t rows,
                     int64_t vocab, int64_t vocab_start, float dloss) override;
  // The step's loss accumulated on the device.
  void loss_accumulate(double* acc, const float* loss, const int32_t* labels,
                       int64_t rows) override;
  void xent_max_typed(float* row_max, const void* logits, Dtype dtype, int64_t rows,
                      int64_t vocab) override;
  void xent_sums_typed(float* sum_exp, float* target, const void* logits, Dtype dtype,
                       const float* row_max, const int32_t* labels, int64_t rows, int64_t vocab,
                       int64_t vocab_start) override;
  void xent_backward_typed(void* dlogits, const void* logits, Dtype dtype, const float* row_max,
                           const float* sum_exp, const int32_t* labels, int64_t rows, int64_t vocab,
                           int64_t vocab_start, float dloss) override;
  void router_forward(float* probs, int32_t* topk_idx, float* topk_w, const float* logits,
                      int64_t tokens, int64_t experts, int64_t top_k, bool renormalize) override;
  void router_topk(int32_t* topk_idx, float* topk_w, const float* probs, int64_t tokens,
                   int64_t experts, int64_t top_k, bool renormalize) override;
  void router_backward(float* dlogits, const float* dtopk_w, const float* probs,
                       const int32_t* topk_idx, int64_t tokens, int64_t experts, int64_t top_k,
                       bool renormalize) override;
  void moe_permutation(int32_t* row_of, int64_t* counts_host, const int32_t* topk_idx,
                       int64_t tokens, int64_t experts, int64_t top_k) override;
  void dispatch_forward(float* out, const float* x, const int32_t* row_of, int64_t tokens,
                        int64_t top_k, int64_t cols) override;
  void dispatch_backward(float* dx, const float* dout, const int32_t* row_of, int64_t tokens,
                         int64_t top_k, int64_t cols) override;
  void combine_forward(float* out, const float* expert_out, const float* w, const int32_t* row_of,
                       int64_t tokens, int64_t top_k, int64_t cols) override;
  void combine_backward(float* dexpert_out, float* dw, const float* dout, const float* expert_out,
                        const float* w, const int32_t* row_of, int64_t tokens, int64_t top_k,
                        int64_t cols) override;
  void expert_linear_forward(float* out, const float* in, const float* w, const float* bias,
                             const int64_t* counts_host, int64_t experts, int64_t n,
                             int64_t k) override;
  void expert_linear_backward_data(float* din, const float* dout, const float* w,
                                   const int64_t* counts_host, int64_t experts, int64_t n,
                                   int64_t k, bool accumulate) override;
  void expert_linear_backward_weight(float* dw, float* dbias, const float* in, const float* dout,
                                     const int64_t* counts_host, int64_t experts, int64_t n,
                                     int64_t k) override;
  void adamw(const AdamWConfig& c, float* param, float* m, float* v, const float* grad, int64_t n,
             const float* grad_scale) override;
  void grad_sumsq(float* sumsq, const float* grad, int64_t n) override;
  void clip_scale(float* scale, const float* sumsq, float max_norm, float loss_scale) override;
  void cast(void* dst, Dtype dst_type, const void* src, Dtype src_type, int64_t n) override;

 protected:
  void* raw_alloc(size_t bytes) override;
  void raw_free(void* p) override;
  void* raw_alloc_host(size_t bytes) override;
  void raw_free_host(void* p) override;

 private:
  static void open_arena();
  static void close_arena();
  CpuBackend inner_;
  char* reserved_ = nullptr;  // the mapping; arena_ is its first huge-page boundary
  char* arena_ = nullptr;
  size_t arena_bytes_ = 0;
  size_t high_water_ = 0;          // bytes of the arena ever handed out (rounded to huge pages)
  std::map<size_t, size_t> free_;  // offset -> bytes of the free ranges below high_water_
  std::map<size_t, size_t> allocated_;  // offset -> bytes
  HostTraffic traffic_{0, 0};
  bool in_arena(const void* p) const;
};

}  // namespace parasol::runtime
