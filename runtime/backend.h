// Backend: the kernel layer the executor drives. One Backend owns a device's memory (with live and
// peak byte accounting per BufferClass, and separately for the host memory used by offload) and
// provides one kernel entry per compute OpKind of core/program.h. Backends: cpu (fp32 math,
// OpenBLAS GEMMs; runtime/cpu/cpu_backend.h, and its strict variant runtime/cpu/strict_backend.h)
// and cuda (cuBLASLt GEMMs and parasol's kernels; runtime/cuda/cuda_backend.h).
//
// Conventions of every kernel entry (the executor relies on them):
//  * pointers are to memory of this Backend (alloc(); host memory only where stated); sizes are
//    element counts; matrices are row-major and dense unless a leading dimension (ld_*, elements
//    between consecutive rows) is given. Token rows: row t = b * seq + s.
//  * math is fp32 (float); integer inputs (tokens, labels, expert indices, permutations) are
//    int32; dropout masks are one byte per element (1 = kept, 0 = dropped).
//  * parameter gradients (dweight, dbias, dtable, dpos, expert dW/db) are ALWAYS accumulated
//    (+=): the executor zeroes them once per step (or per micro-batch buffer). Every other output
//    is overwritten unless its `accumulate` flag says otherwise.
//  * an output may alias an input only where the entry says so ("in place allowed").
//  * linear layers follow lower.h: W is [in x out] (k x n), so out = in * W (+ bias).
//  * dropout: element i of a mask drawn with `seed` is kept iff
//    dropout_keep(seed, i, dropout_threshold(p)) (runtime/tensor.h), and kept values are scaled
//    by 1 / (1 - p); every backend draws the same mask for the same seed.
//  * kernels run on the calling thread (the CPU backend's GEMMs use OpenBLAS threads) and are
//    ordered by call order; synchronize() waits for all of them (a no-op on the CPU).
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/device.h"
#include "core/model.h"
#include "core/program.h"

namespace parasol::runtime {

inline constexpr int kBufferClasses = 5;  // param, grad, optimizer, activation, workspace

// Bytes held in one memory space (device or host), in bytes as requested by alloc().
struct MemoryStats {
  std::array<int64_t, kBufferClasses> live{};  // bytes allocated now, per BufferClass
  std::array<int64_t, kBufferClasses> peak{};  // most bytes of that class live at once
  int64_t live_total = 0;                      // bytes allocated now, all classes
  int64_t peak_total = 0;                      // most bytes live at once, all classes
  int64_t allocations = 0;                     // live allocations

  int64_t live_of(BufferClass c) const { return live[static_cast<int>(c)]; }
  int64_t peak_of(BufferClass c) const { return peak[static_cast<int>(c)]; }
};

// The shape of one attention call: softmax(scale * Q K^T + mask) V for `heads` query heads sharing
// `kv_heads` key/value heads (GQA: query head h uses kv head h / (heads / kv_heads)). Query and key
// heads have head_dim columns, value (and output) heads v_head_dim (0: head_dim; MLA's differ).
// Q row (b, i), head h: q + (b * seq_q + i) * ld_q + h * head_dim; K row (b, j), kv head g:
// k + (b * seq_kv + j) * ld_kv + g * head_dim; V row (b, j), kv head g: v + (b * seq_kv + j) *
// ld_kv + g * v_head_dim; out and dout rows (b, i), head h: (b * seq_q + i) * ld_o + h *
// v_head_dim. dq/dk/dv use the strides of q/k/v. lse: [batch, heads, seq_q]; probs: [batch, heads,
// seq_q, seq_kv]. For a fused QKV buffer [T x (heads head_dim + kv_heads (head_dim +
// v_head_dim))] with columns Q | K | V: q = qkv, k = qkv + heads * head_dim, v = k + kv_heads *
// head_dim, ld_q = ld_kv = the QKV width.
struct AttentionDims {
  int64_t batch = 0, seq_q = 0, seq_kv = 0, heads = 0, kv_heads = 0, head_dim = 0;
  int64_t v_head_dim = 0;                 // 0: head_dim
  int64_t ld_q = 0, ld_kv = 0, ld_o = 0;  // row strides in elements
  bool causal = true;
  // Causal: key j is visible to query i iff j <= i + causal_offset (0 for self-attention of one
  // sequence chunk; a ring step attending to an earlier chunk passes the distance between the
  // chunks), and with a sliding window (window > 0) also j > i + causal_offset - window. A query
  // with no visible key has lse = -inf and contributes nothing. The window is ignored when
  // !causal.
  int64_t causal_offset = 0;
  int64_t window = 0;
  float scale = 0;      // 0: 1 / sqrt(head_dim)
  float dropout_p = 0;  // attention-probability dropout; mask index ((b*heads+h)*seq_q+i)*seq_kv+j
  uint64_t dropout_seed = 0;

  int64_t vd() const { return v_head_dim > 0 ? v_head_dim : head_dim; }
  // The keys query i sees: [first, last) (empty when first >= last).
  int64_t first_key(int64_t i) const {
    if (!causal || window <= 0) return 0;
    const int64_t f = i + causal_offset - window + 1;
    return f < 0 ? 0 : (f > seq_kv ? seq_kv : f);
  }
  int64_t last_key(int64_t i) const {
    if (!causal) return seq_kv;
    const int64_t l = i + causal_offset + 1;
    return l < 0 ? 0 : (l > seq_kv ? seq_kv : l);
  }
};

// How a linear layer's weight is stored: kInOut, W[k x n] (every weight core/lower.h emits; out =
// in * W); kOutIn, W[n x k] (the embedding table [vocab x hidden] used as the output layer when
// the embeddings are tied; out = in * W^T). A weight gradient has its weight's layout.
enum class WeightLayout { kInOut, kOutIn };

// AdamW (Loshchilov & Hutter; PyTorch's torch.optim.AdamW): with g = grad * grad_scale,
//   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2;
//   p -= lr * ((m / (1 - beta1^step)) / (sqrt(v / (1 - beta2^step)) + eps) + weight_decay * p).
// The hyperparameters are doubles (as PyTorch's) so that 1 - beta2 keeps its digits; the update
// itself is fp32.
struct AdamWConfig {
  double lr = 3e-4;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  int64_t step = 1;  // 1 for the first update (bias correction)
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;  // "cpu", "cuda"

  // ---- Memory.

  // Device memory of `bytes` bytes (64-byte aligned, contents undefined), counted under `cls`;
  // nullptr for 0 bytes. Throws parasol::Error when the memory cannot be allocated.
  void* alloc(size_t bytes, BufferClass cls);
  // Releases memory from alloc(); nullptr is ignored. Throws parasol::Error for a pointer this
  // Backend did not allocate (or already freed).
  void free(void* p);
  // Host memory for offloaded buffers (pinned where the device supports it), counted apart.
  void* alloc_host(size_t bytes, BufferClass cls);
  void free_host(void* p);
  MemoryStats device_memory() const;
  MemoryStats host_memory() const;
  void reset_peaks();  // peaks := live, in every space
  // Widened operands of low-precision storage (mixed precision, runtime/executor.h): the kernels
  // compute in fp32, so for the duration of one kernel the executor widens each bf16 / fp16
  // operand into fp32 here and rounds what the kernel wrote back into the 16-bit buffer; this is
  // the per-kernel staging a GPU's bf16 kernels hold in registers and shared memory. Device
  // memory, counted apart (widened_memory()), so that device_memory() counts the Program's
  // buffers at their stored dtype, as liveness (core/liveness.h) predicts them.
  void* alloc_widened(size_t bytes);
  void free_widened(void* p);
  MemoryStats widened_memory() const;
  // MoE routing indices the Program does not list as buffers (the top-k experts and gates, the
  // permutation into expert order and its per-expert offsets, runtime/executor_impl.h Routing):
  // device memory for the step, counted apart (routing_memory()) as the widened operands are.
  void* alloc_routing(size_t bytes);
  void free_routing(void* p);
  MemoryStats routing_memory() const;
  // The step's staging (runtime/executor.h): every micro-batch's tokens and labels uploaded in
  // one copy before the step, and the loss accumulator read once after it, at addresses fixed
  // across steps so that a captured step reads and writes the same memory at every replay.
  // Device memory the Program does not list, counted apart (staging_memory()).
  void* alloc_staging(size_t bytes);
  void free_staging(void* p);
  MemoryStats staging_memory() const;

  // Copies `bytes` bytes between any two memories of this Backend (device or host); the ranges
  // must not overlap.
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  virtual void zero(void* dst, size_t bytes) = 0;
  virtual void synchronize() = 0;

  // ---- Timing of the kernels (trace timestamps). mark() notes the point that the work issued so
  // far has reached and returns the mark's index: the host clock now on the cpu (its kernels run
  // on the calling thread), an event on the compute stream on cuda. mark_seconds(i): mark i's
  // time in seconds after mark 0, valid once synchronize() has returned. clear_marks() starts a
  // new series.
  virtual int mark();
  virtual double mark_seconds(int i);
  virtual void clear_marks();
  // True where marks read the host's steady clock (the cpu): the executor then times kernels by
  // that clock directly, the one it times transfers by, so that one trace holds one clock.
  virtual bool marks_on_host_clock() const { return true; }

  // ---- Ordering other streams after the kernels. record_fence() marks the point the work issued
  // so far has reached and returns an opaque fence for a Communicator's wait_fence() (a CUDA event
  // on cuda); release_fence() drops it once the wait is issued. Backends whose kernels finish on
  // the calling thread (cpu) return nullptr: everything issued is already done.
  virtual void* record_fence() { return nullptr; }
  virtual void release_fence(void* fence) { (void)fence; }
  // The other way: compute work issued from now on waits for `fence`, a transfer's completion
  // (Request::fence(), a CUDA event on a communicator's stream). nullptr, and backends whose
  // transfers have finished when the host sees them complete (cpu): nothing to do.
  virtual void wait_fence(void* fence) { (void)fence; }

  // ---- Whole-step graphs (Plan::cuda_graphs full_iteration; runtime/step_graph.h). A backend
  // that records_graphs() records the work issued on it between begin_capture() and
  // end_capture() (kernels, device-to-device copies, memsets, and the transfers of communicators
  // whose streams joined the capture through fences) without running it; end_capture() returns
  // the graph's id and replay(id) runs the recorded work, ordered like a kernel. A call that
  // cannot be recorded (a copy to or from host memory, a synchronisation, an allocation the
  // caches cannot serve) throws parasol::Error naming it and abandons the capture. The recorded
  // work keeps the addresses it was captured with. The defaults throw parasol::Error.
  virtual bool records_graphs() const { return false; }
  virtual void begin_capture();
  virtual int end_capture();
  virtual void replay(int graph);
  // Copies so far between host memory and this backend's device memory, counted by the backend
  // from where the pointers lie: `reads` device to host (a host synchronisation on a GPU),
  // `writes` host to device. -1 each where device memory is host memory and the backend cannot
  // tell (cpu; the strict cpu backend and cuda can).
  struct HostTraffic {
    int64_t reads = -1, writes = -1;
  };
  virtual HostTraffic host_traffic() const { return {}; }

  // ---- Embedding (OpKind::kEmbedding).

  // Vocab-parallel lookup of rows = batch * seq tokens: out[t] = table[tokens[t] - vocab_start]
  // when vocab_start <= tokens[t] < vocab_start + vocab_rows, else 0; then, when pos is not null,
  // out[t] += pos[t % seq + pos_offset] (pass pos on one tensor-parallel rank only, so that the
  // all-reduce adds it once). table: [vocab_rows x cols]; pos: [positions x cols].
  virtual void embedding_forward(float* out, const int32_t* tokens, const float* table,
                                 int64_t vocab_start, int64_t vocab_rows, const float* pos,
                                 int64_t pos_offset, int64_t rows, int64_t seq, int64_t cols) = 0;
  // dtable[tokens[t] - vocab_start] += dout[t] for tokens of this shard; dpos (nullable)
  // [t % seq + pos_offset] += dout[t].
  virtual void embedding_backward(float* dtable, float* dpos, const float* dout,
                                  const int32_t* tokens, int64_t vocab_start, int64_t vocab_rows,
                                  int64_t pos_offset, int64_t rows, int64_t seq, int64_t cols) = 0;

  // ---- Norm (OpKind::kNorm).

  // Per row of x [rows x cols]: layernorm out = (x - mean) / sqrt(var + eps) * weight + bias
  // (bias nullable; var is the biased variance), rmsnorm out = x / sqrt(mean(x^2) + eps) * weight
  // (bias ignored). A layernorm weight buffer of shape {2, cols} holds weight then bias.
  virtual void norm_forward(Norm kind, float* out, const float* x, const float* weight,
                            const float* bias, int64_t rows, int64_t cols, float eps) = 0;
  // dx = d out/dx applied to dout, plus dresidual when not null (the gradient reaching x by the
  // residual path; dx may alias dresidual). dweight += ..., dbias (nullable) += ... . The
  // statistics are recomputed from x.
  virtual void norm_backward(Norm kind, float* dx, float* dweight, float* dbias, const float* dout,
                             const float* x, const float* weight, const float* dresidual,
                             int64_t rows, int64_t cols, float eps) = 0;

  // ---- Linear (OpKind::kLinear) and bias (OpKind::kBias).

  // out[m x n] = in[m x k] * W (+ bias[n] when not null); W is w[k x n] (kInOut) or w[n x k]
  // transposed (kOutIn).
  virtual void linear_forward(float* out, const float* in, const float* w, WeightLayout layout,
                              const float* bias, int64_t m, int64_t n, int64_t k) = 0;
  // Data gradient: din[m x k] (+)= dout[m x n] * W^T.
  virtual void linear_backward_data(float* din, const float* dout, const float* w,
                                    WeightLayout layout, int64_t m, int64_t n, int64_t k,
                                    bool accumulate) = 0;
  // Weight gradient in w's layout: dw[k x n] += in^T * dout (kOutIn: dw[n x k] += dout^T * in);
  // dbias[n] (nullable) += column sums of dout.
  virtual void linear_backward_weight(float* dw, float* dbias, const float* in, const float* dout,
                                      WeightLayout layout, int64_t m, int64_t n, int64_t k) = 0;
  // out[r][c] += bias[c] over [rows x cols]; dbias[c] += sum_r dout[r][c].
  virtual void bias_forward(float* out, const float* bias, int64_t rows, int64_t cols) = 0;
  virtual void bias_backward(float* dbias, const float* dout, int64_t rows, int64_t cols) = 0;

  // ---- Activation (OpKind::kActivation).

  // gelu (tanh approximation, GPT-2): out[rows x cols] = gelu(in[rows x cols]).
  // swiglu: in is [rows x 2 cols], columns gate | up: out = silu(gate) * up (Megatron/Llama).
  // In place allowed for gelu.
  virtual void activation_forward(Activation kind, float* out, const float* in, int64_t rows,
                                  int64_t cols) = 0;
  // din (the shape of in) = dout through the activation at `in`; in place (din == dout) allowed
  // for gelu.
  virtual void activation_backward(Activation kind, float* din, const float* dout, const float* in,
                                   int64_t rows, int64_t cols) = 0;

  // ---- Attention (OpKind::kAttention).

  // out = softmax(scale Q K^T + mask) V (with dropout on the probabilities when dims.dropout_p >
  // 0); writes lse (log-sum-exp of each query's scaled, masked scores; nullable) and probs (the
  // softmax before dropout; nullable). accumulate: out and lse already hold the result over other
  // keys (an earlier ring step) and are merged with this call's keys (requires lse).
  virtual void attention_forward(const AttentionDims& d, float* out, float* lse, float* probs,
                                 const float* q, const float* k, const float* v,
                                 bool accumulate) = 0;
  // Gradients of the forward above: out and lse are the final (merged) forward results; the
  // probabilities come from probs when not null, else from lse. dq (+)= when accumulate_dq;
  // dk, dv (+)= when accumulate_dkv.
  virtual void attention_backward(const AttentionDims& d, float* dq, float* dk, float* dv,
                                  const float* dout, const float* q, const float* k, const float* v,
                                  const float* out, const float* lse, const float* probs,
                                  bool accumulate_dq, bool accumulate_dkv) = 0;

  // ---- Rotary position embedding (Su et al. 2021; Llama's rotate-half pairing), applied by the
  // executor to Q and K inside the QKV GEMM's output (models without learned positions).

  // In place on `heads` heads of head_dim columns each, starting at x, in rows = batch * seq
  // token rows of stride ld: the pair (x[j], x[j + head_dim / 2]) of row t, head h, j <
  // head_dim / 2, is rotated by the angle p * theta^(-2 j / head_dim), p = t % seq + pos_offset
  // (angles formed in double). inverse: rotated by minus the angle, which is also the backward
  // (the rotation is orthogonal: its gradient is its transpose). Other columns are untouched.
  virtual void rope(float* x, int64_t ld, int64_t rows, int64_t seq, int64_t pos_offset,
                    int64_t heads, int64_t head_dim, double theta, bool inverse) = 0;

  // ---- Residual add with dropout (OpKind::kResidualAdd).

  // out = x + dropout(y + bias) over [rows x cols]; x (the residual) and bias nullable. When
  // dropout_p > 0 the mask is drawn with `seed` and written to mask (not null then).
  // In place allowed (out == x or out == y).
  virtual void residual_forward(float* out, uint8_t* mask, const float* x, const float* y,
                                const float* bias, int64_t rows, int64_t cols, float dropout_p,
                                uint64_t seed) = 0;
  // dy = dout * mask / (1 - p) (dout itself when mask is null); dbias (nullable) += column sums
  // of dy. The residual's own gradient is dout (folded into the next norm's backward). In place
  // allowed.
  virtual void residual_backward(float* dy, float* dbias, const float* dout, const uint8_t* mask,
                                 int64_t rows, int64_t cols, float dropout_p) = 0;

  // ---- Vocab-parallel cross-entropy (OpKind::kCrossEntropy).

  // logits: this rank's [rows x vocab] columns, global vocabulary ids vocab_start ... ; labels:
  // global ids, < 0 = ignored row. The pieces combine over tensor-parallel ranks as Megatron's:
  // max -> all-reduce(max) -> sum_exp and target -> all-reduce(sum) -> loss.
  virtual void xent_row_max(float* row_max, const float* logits, int64_t rows, int64_t vocab) = 0;
  // sum_exp[r] = sum_v exp(logits[r][v] - row_max[r]).
  virtual void xent_sum_exp(float* sum_exp, const float* logits, const float* row_max, int64_t rows,
                            int64_t vocab) = 0;
  // target[r] = logits[r][labels[r] - vocab_start] when the label is in this shard, else 0.
  virtual void xent_target(float* target, const float* logits, const int32_t* labels, int64_t rows,
                           int64_t vocab, int64_t vocab_start) = 0;
  // loss[r] = log(sum_exp[r]) + row_max[r] - target[r] (global figures); 0 for ignored rows.
  virtual void xent_loss(float* loss, const float* row_max, const float* sum_exp,
                         const float* target, const int32_t* labels, int64_t rows) = 0;
  // probs[r][v] = exp(logits[r][v] - row_max[r]) / sum_exp[r]. In place allowed.
  virtual void xent_softmax(float* probs, const float* logits, const float* row_max,
                            const float* sum_exp, int64_t rows, int64_t vocab) = 0;
  // dlogits = dloss * (probs - onehot(label)) per row (0 for ignored rows): the gradient of
  // dloss * sum_r loss[r]. In place allowed.
  virtual void xent_backward(float* dlogits, const float* probs, const int32_t* labels,
                             int64_t rows, int64_t vocab, int64_t vocab_start, float dloss) = 0;

  // The step's loss on the device (read by the host once, after the step): acc[0] += loss[r] and
  // acc[1] += 1 for each row r < rows with labels[r] >= 0, in row order, summed in double (the
  // sum the host formed from the per-token fp32 losses before; acc is two device doubles, the
  // one double output of the kernel layer).
  virtual void loss_accumulate(double* acc, const float* loss, const int32_t* labels,
                               int64_t rows) = 0;

  // ---- MoE: router (OpKind::kRouter), dispatch and combine, expert linear.

  // probs[t] = softmax(logits[t]) over `experts`, then router_topk of probs.
  virtual void router_forward(float* probs, int32_t* topk_idx, float* topk_w, const float* logits,
                              int64_t tokens, int64_t experts, int64_t top_k, bool renormalize) = 0;
  // topk_idx[t] / topk_w[t]: the top_k experts by probability (ties: the lower index) in
  // descending order and their weights, p / (sum of the top_k p) when renormalize, else p. (The
  // Program keeps only the probabilities; this recovers the routing from them.)
  virtual void router_topk(int32_t* topk_idx, float* topk_w, const float* probs, int64_t tokens,
                           int64_t experts, int64_t top_k, bool renormalize) = 0;
  // dlogits[t] from dtopk_w[t] (the gradient of the weights) through renormalisation and softmax.
  virtual void router_backward(float* dlogits, const float* dtopk_w, const float* probs,
                               const int32_t* topk_idx, int64_t tokens, int64_t experts,
                               int64_t top_k, bool renormalize) = 0;
  // The permutation of the tokens * top_k routed rows into expert order (by expert, then token,
  // then slot): row_of[t * top_k + s] = the row of (token t, slot s); counts_host[e] = rows of
  // expert e (host memory, `experts` entries, for the grouped GEMM).
  virtual void moe_permutation(int32_t* row_of, int64_t* counts_host, const int32_t* topk_idx,
                               int64_t tokens, int64_t experts, int64_t top_k) = 0;
  // out[row_of[t * top_k + s]] = x[t]: out is [tokens * top_k x cols].
  virtual void dispatch_forward(float* out, const float* x, const int32_t* row_of, int64_t tokens,
                                int64_t top_k, int64_t cols) = 0;
  // dx[t] = sum_s dout[row_of[t * top_k + s]].
  virtual void dispatch_backward(float* dx, const float* dout, const int32_t* row_of,
                                 int64_t tokens, int64_t top_k, int64_t cols) = 0;
  // out[t] = sum_s w[t * top_k + s] * expert_out[row_of[t * top_k + s]].
  virtual void combine_forward(float* out, const float* expert_out, const float* w,
                               const int32_t* row_of, int64_t tokens, int64_t top_k,
                               int64_t cols) = 0;
  // dexpert_out[row_of[t, s]] = w[t, s] * dout[t]; dw[t, s] = dot(dout[t], expert_out[row_of]).
  virtual void combine_backward(float* dexpert_out, float* dw, const float* dout,
                                const float* expert_out, const float* w, const int32_t* row_of,
                                int64_t tokens, int64_t top_k, int64_t cols) = 0;
  // Grouped GEMM: expert e's rows (counts_host[e] consecutive rows of in, experts in order)
  // times w[e] ([k x n]; w is [experts x k x n]), plus bias[e] ([experts x n], nullable).
  virtual void expert_linear_forward(float* out, const float* in, const float* w, const float* bias,
                                     const int64_t* counts_host, int64_t experts, int64_t n,
                                     int64_t k) = 0;
  virtual void expert_linear_backward_data(float* din, const float* dout, const float* w,
                                           const int64_t* counts_host, int64_t experts, int64_t n,
                                           int64_t k, bool accumulate) = 0;
  // dw[e] += in_e^T dout_e; dbias[e] (nullable) += column sums of dout_e.
  virtual void expert_linear_backward_weight(float* dw, float* dbias, const float* in,
                                             const float* dout, const int64_t* counts_host,
                                             int64_t experts, int64_t n, int64_t k) = 0;

  // ---- Typed bf16 entries: the linear and norm kernels on bf16 storage (uint16_t, the high half
  // of an fp32, runtime/tensor.h) with fp32 accumulation, for backends that compute on it without
  // widening a buffer into fp32 (cuda: cuBLASLt bf16 GEMMs and bf16_norm.cu; cpu: tiles widened
  // inside the kernel, runtime/cpu/bf16_ops.cc). Each has the contract of its fp32 entry above,
  // every operand bf16 unless stated, each output rounded to nearest even once. The executor calls
  // them where bf16_kernels() is true and every buffer of the op is bf16 (runtime/executor_ops.cc,
  // run_typed); the defaults throw parasol::Error.
  virtual bool bf16_kernels() const { return false; }
  // out = in * W + bias, with gelu_pre not null: gelu_pre = in * W + bias, out = gelu(gelu_pre)
  // (tanh form). bias nullable.
  virtual void linear_forward_bf16(uint16_t* out, const uint16_t* in, const uint16_t* w,
                                   WeightLayout layout, const uint16_t* bias, uint16_t* gelu_pre,
                                   int64_t m, int64_t n, int64_t k);
  // din (+)= dout * W^T (gelu_pre not null: din = gelu'(gelu_pre) * (dout W^T), accumulate false,
  // and dbias_of_din (fp32, nullable) += its column sums).
  virtual void linear_backward_data_bf16(uint16_t* din, const uint16_t* dout, const uint16_t* w,
                                         WeightLayout layout, const uint16_t* gelu_pre,
                                         float* dbias_of_din, int64_t m, int64_t n, int64_t k,
                                         bool accumulate);
  // Weight gradient from bf16 in and dout into dw of dw_type (kFp32 or kBf16: the plan's gradient
  // dtype; +=, rounded once when bf16) and dbias (fp32, nullable, +=).
  virtual void linear_backward_weight_bf16(void* dw, Dtype dw_type, float* dbias,
                                           const uint16_t* in, const uint16_t* dout,
                                           WeightLayout layout, int64_t m, int64_t n, int64_t k);
  // norm_forward on bf16 x, weight and bias (bias nullable).
  virtual void norm_forward_bf16(Norm kind, uint16_t* out, const uint16_t* x,
                                 const uint16_t* weight, const uint16_t* bias, int64_t rows,
                                 int64_t cols, float eps);
  // norm_backward on bf16 dout, x, weight and dresidual (nullable; dx may alias it); dweight and
  // dbias fp32 (+=, the parameters' gradients).
  virtual void norm_backward_bf16(Norm kind, uint16_t* dx, float* dweight, float* dbias,
                                  const uint16_t* dout, const uint16_t* x, const uint16_t* weight,
                                  const uint16_t* dresidual, int64_t rows, int64_t cols, float eps);
  // activation_forward / activation_backward on bf16 (in place as theirs).
  virtual void activation_forward_bf16(Activation kind, uint16_t* out, const uint16_t* in,
                                       int64_t rows, int64_t cols);
  virtual void activation_backward_bf16(Activation kind, uint16_t* din, const uint16_t* dout,
                                        const uint16_t* in, int64_t rows, int64_t cols);
  // residual_forward / residual_backward without dropout (no mask): out = x + (y + bias);
  // dy = dout, dbias (fp32, nullable) += its column sums. In place allowed.
  virtual void residual_forward_bf16(uint16_t* out, const uint16_t* x, const uint16_t* y,
                                     const uint16_t* bias, int64_t rows, int64_t cols);
  virtual void residual_backward_bf16(uint16_t* dy, float* dbias, const uint16_t* dout,
                                      int64_t rows, int64_t cols);
  // rope on bf16 in place: each rotated pair computed in fp32 from the stored values and rounded
  // once.
  virtual void rope_bf16(uint16_t* x, int64_t ld, int64_t rows, int64_t seq, int64_t pos_offset,
                         int64_t heads, int64_t head_dim, double theta, bool inverse);
  // embedding_forward from a bf16 table (and positions) into bf16 out; embedding_backward from
  // bf16 dout into fp32 dtable and dpos (+=).
  virtual void embedding_forward_bf16(uint16_t* out, const int32_t* tokens, const uint16_t* table,
                                      int64_t vocab_start, int64_t vocab_rows, const uint16_t* pos,
                                      int64_t pos_offset, int64_t rows, int64_t seq, int64_t cols);
  virtual void embedding_backward_bf16(float* dtable, float* dpos, const uint16_t* dout,
                                       const int32_t* tokens, int64_t vocab_start,
                                       int64_t vocab_rows, int64_t pos_offset, int64_t rows,
                                       int64_t seq, int64_t cols);
  // attention_forward / attention_backward (flash: from the log-sum-exp, never the
  // probabilities) on bf16 Q, K, V, out, dout, dq, dk and dv, with the strides of `d`; lse stays
  // fp32 (nullable in the forward, required by the backward and by `accumulate`). Scores,
  // softmax statistics and every sum are fp32; each output element is rounded once per call (a
  // ring step's merge, `accumulate`, combines the stored bf16 output with this call's fp32 one
  // and rounds the result; dk, dv and accumulate_dq likewise add in fp32 and round once).
  virtual void attention_forward_bf16(const AttentionDims& d, uint16_t* out, float* lse,
                                      const uint16_t* q, const uint16_t* k, const uint16_t* v,
                                      bool accumulate);
  virtual void attention_backward_bf16(const AttentionDims& d, uint16_t* dq, uint16_t* dk,
                                       uint16_t* dv, const uint16_t* dout, const uint16_t* q,
                                       const uint16_t* k, const uint16_t* v, const uint16_t* out,
                                       const float* lse, bool accumulate_dq, bool accumulate_dkv);
  // MoE on bf16 storage: dispatch, combine and the grouped expert GEMMs with the contracts of
  // their fp32 entries; token and expert rows bf16, the gates w and their gradient dw fp32, sums in
  // fp32, each output rounded once. The router itself stays fp32 (its logits and probabilities
  // are fp32 buffers, as Megatron-Core's router computes in fp32).
  virtual void dispatch_forward_bf16(uint16_t* out, const uint16_t* x, const int32_t* row_of,
                                     int64_t tokens, int64_t top_k, int64_t cols);
  virtual void dispatch_backward_bf16(uint16_t* dx, const uint16_t* dout, const int32_t* row_of,
                                      int64_t tokens, int64_t top_k, int64_t cols);
  virtual void combine_forward_bf16(uint16_t* out, const uint16_t* expert_out, const float* w,
                                    const int32_t* row_of, int64_t tokens, int64_t top_k,
                                    int64_t cols);
  virtual void combine_backward_bf16(uint16_t* dexpert_out, float* dw, const uint16_t* dout,
                                     const uint16_t* expert_out, const float* w,
                                     const int32_t* row_of, int64_t tokens, int64_t top_k,
                                     int64_t cols);
  // The grouped expert GEMMs: expert e's counts_host[e] rows through linear_forward_bf16,
  // linear_backward_data_bf16 and linear_backward_weight_bf16 with w[e] ([k x n], kInOut), bias[e]
  // (bf16, nullable), dw[e] (dw_type kFp32 or kBf16, +=) and dbias[e] (fp32, nullable, +=). The
  // defaults call those entries once per expert with rows (so every backend with the linear
  // entries has them); a backend may group them into one call.
  virtual void expert_linear_forward_bf16(uint16_t* out, const uint16_t* in, const uint16_t* w,
                                          const uint16_t* bias, const int64_t* counts_host,
                                          int64_t experts, int64_t n, int64_t k);
  virtual void expert_linear_backward_data_bf16(uint16_t* din, const uint16_t* dout,
                                                const uint16_t* w, const int64_t* counts_host,
                                                int64_t experts, int64_t n, int64_t k,
                                                bool accumulate);
  virtual void expert_linear_backward_weight_bf16(void* dw, Dtype dw_type, float* dbias,
                                                  const uint16_t* in, const uint16_t* dout,
                                                  const int64_t* counts_host, int64_t experts,
                                                  int64_t n, int64_t k);

  // ---- MoE routing kept on the device: the expert GEMMs sized from device offsets, so that no
  // host synchronisation sizes them (Megatron-Core's grouped GEMM takes its per-expert sizes as a
  // tensor; a host read of the counts blocks the host until the router has run). Every pointer is
  // device memory. The executor takes this path where device_moe_routing() is true and no host
  // needs the counts (no expert-parallel exchange, no gather over the experts' tensor-parallel
  // group; runtime/executor_ops.cc). The defaults throw parasol::Error.
  virtual bool device_moe_routing() const { return false; }
  // The permutation of moe_permutation, where the indices are: row_of [tokens * top_k], counts
  // [experts] and offsets [experts + 1] (exclusive scan of counts; offsets[experts] = tokens *
  // top_k). An index outside [0, experts) gets row -1 and adds 1 to *bad (a device int32 the
  // caller reads once, when the step ends).
  virtual void moe_permutation_device(int32_t* row_of, int32_t* counts, int32_t* offsets,
                                      int32_t* bad, const int32_t* topk_idx, int64_t tokens,
                                      int64_t experts, int64_t top_k);
  // The grouped expert GEMMs of expert_linear_*_bf16 with expert e's rows offsets[e] <= r <
  // offsets[e + 1] (device offsets, experts + 1 entries); max_rows >= offsets[experts] (the
  // rows the buffers hold) bounds the launch.
  virtual void expert_linear_forward_bf16_dev(uint16_t* out, const uint16_t* in, const uint16_t* w,
                                              const uint16_t* bias, const int32_t* offsets,
                                              int64_t experts, int64_t max_rows, int64_t n,
                                              int64_t k);
  virtual void expert_linear_backward_data_bf16_dev(uint16_t* din, const uint16_t* dout,
                                                    const uint16_t* w, const int32_t* offsets,
                                                    int64_t experts, int64_t max_rows, int64_t n,
                                                    int64_t k);
  virtual void expert_linear_backward_weight_bf16_dev(void* dw, Dtype dw_type, float* dbias,
                                                      const uint16_t* in, const uint16_t* dout,
                                                      const int32_t* offsets, int64_t experts,
                                                      int64_t max_rows, int64_t n, int64_t k);

  // ---- The vocab-tiled loss (plan.tiled_loss; runtime/cpu/tiled_xent.h): the cross-entropy's
  // pieces read straight from the logits in their storage dtype (kFp32 or kBf16; another throws
  // parasol::Error), in tiles of the vocabulary, fp32 statistics; no fp32 copy of the logits or
  // their probabilities is made. Contracts as the xent_* entries above.
  // row_max[r] = max over this shard's logits of row r.
  virtual void xent_max_typed(float* row_max, const void* logits, Dtype dtype, int64_t rows,
                              int64_t vocab) = 0;
  // sum_exp[r] = sum_v exp(logits[r][v] - row_max[r]) with row_max[r] >= every logit of the row
  // (this shard's or the global maximum); target[r] as xent_target.
  virtual void xent_sums_typed(float* sum_exp, float* target, const void* logits, Dtype dtype,
                               const float* row_max, const int32_t* labels, int64_t rows,
                               int64_t vocab, int64_t vocab_start) = 0;
  // dlogits = dloss * (exp(logits - row_max) / sum_exp - onehot(label)) per row (0 for ignored
  // rows), written in `dtype`; in place (dlogits == logits) allowed.
  virtual void xent_backward_typed(void* dlogits, const void* logits, Dtype dtype,
                                   const float* row_max, const float* sum_exp,
                                   const int32_t* labels, int64_t rows, int64_t vocab,
                                   int64_t vocab_start, float dloss) = 0;

  // ---- Optimizer (OpKind::kAdamW, kGradNorm, kCast).

  // One AdamW step over n elements; grad_scale (device scalar, nullable = 1) multiplies grad
  // (the clip scale). param is the fp32 master copy.
  virtual void adamw(const AdamWConfig& c, float* param, float* m, float* v, const float* grad,
                     int64_t n, const float* grad_scale) = 0;
  // *sumsq (a device scalar) += sum of grad[i]^2 (summed in double inside one call).
  virtual void grad_sumsq(float* sumsq, const float* grad, int64_t n) = 0;
  // The factor of the gradients, which carry the loss scale: with norm = sqrt(*sumsq) / loss_scale
  // (the unscaled gradients' norm), *scale = (max_norm / (norm + 1e-6) when max_norm > 0 and
  // norm > max_norm, else 1) / loss_scale (device scalars; scale may alias sumsq).
  virtual void clip_scale(float* scale, const float* sumsq, float max_norm, float loss_scale) = 0;
  // dst[i] = src[i] converted (fp32 <-> bf16 / fp16, round to nearest even; fp32 -> fp32 copies).
  // Throws parasol::Error for other dtypes.
  virtual void cast(void* dst, Dtype dst_type, const void* src, Dtype src_type, int64_t n) = 0;

 protected:
  // Raw memory of the backend; the accounting above is done here in the base class.
  virtual void* raw_alloc(size_t bytes) = 0;
  virtual void raw_free(void* p) = 0;
  virtual void* raw_alloc_host(size_t bytes) = 0;
  virtual void raw_free_host(void* p) = 0;
  // Frees every block still allocated (both spaces) through raw_free/raw_free_host; a derived
  // destructor calls it (the base destructor cannot reach the derived raw_free).
  void release_all();

 private:
  struct Space {
    MemoryStats stats;
    std::unordered_map<void*, std::pair<size_t, BufferClass>> blocks;
  };
  void* alloc_in(Space& s, size_t bytes, BufferClass cls, bool host);
  void free_in(Space& s, void* p, bool host);

  mutable std::mutex mu_;
  Space device_, host_, widened_, routing_, staging_;
  std::vector<std::chrono::steady_clock::time_point> marks_;
};

}  // namespace parasol::runtime
