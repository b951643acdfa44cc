// The Executor's internals, shared by executor.cc (construction, memory, scheduling,
// communication, copies, optimizer) and executor_ops.cc (the compute ops' mapping to Backend
// kernels). Not a public header: include runtime/executor.h.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/issue_graph.h"
#include "runtime/executor.h"

namespace parasol::runtime {

// A contiguous range of elements: one buffer, or the members of a block in order.
struct Flat {
  void* base = nullptr;
  int64_t elements = 0;  // the block's padded size for a block
  int64_t eb = 4;        // bytes per element (the buffers' dtype)
  float* f(int64_t offset = 0) const { return static_cast<float*>(base) + offset; }
  // Element `offset` of any dtype.
  char* at(int64_t offset) const { return static_cast<char*>(base) + offset * eb; }
};

// MoE routing of one micro-batch of one layer, recovered from the router probabilities. On the
// host path the indices live in host vectors and the counts come with the permutation (a host
// synchronisation on a GPU); on the device path (Backend::device_moe_routing) they live in one
// block of the backend's routing memory, with the per-expert offsets the grouped GEMMs read,
// and the counts reach the host only where a host needs them (host_counts()).
struct Routing {
  int32_t* topk_idx = nullptr;    // [tokens x top_k]
  float* topk_w = nullptr;        // [tokens x top_k]
  int32_t* row_of = nullptr;      // [tokens x top_k]: row of (token, slot) in expert order
  int32_t* offsets = nullptr;     // device path: [experts + 1] first row of each expert
  int32_t* dev_counts = nullptr;  // device path: [experts] rows per expert
  std::vector<int64_t> counts;    // rows per expert (all experts), on the host (see above)
  bool on_device = false;
  bool counts_on_host = false;  // counts holds them
  int64_t rows = 0;             // tokens x top_k
  void* block = nullptr;        // device path: the routing memory (Backend::alloc_routing)

  Routing(int64_t tokens, int64_t experts, int64_t top_k, void* device_block = nullptr)
      : counts(static_cast<size_t>(experts)), rows(tokens * top_k), block(device_block) {
    if (block != nullptr) {  // int32 and fp32 arrays, one after the other
      on_device = true;
      topk_idx = static_cast<int32_t*>(block);
      topk_w = reinterpret_cast<float*>(topk_idx + rows);
      row_of = reinterpret_cast<int32_t*>(topk_w + rows);
      dev_counts = row_of + rows;
      offsets = dev_counts + experts;
      return;
    }
    host_idx_.resize(static_cast<size_t>(rows));
    host_w_.resize(host_idx_.size());
    host_row_of_.resize(host_idx_.size());
    topk_idx = host_idx_.data();
    topk_w = host_w_.data();
    row_of = host_row_of_.data();
    counts_on_host = true;
  }
  // Bytes of the device block for (tokens, experts, top_k).
  static size_t device_bytes(int64_t tokens, int64_t experts, int64_t top_k) {
    return sizeof(int32_t) * static_cast<size_t>(3 * tokens * top_k + 2 * experts + 1);
  }

 private:
  std::vector<int32_t> host_idx_, host_row_of_;  // the host path's storage (moves keep it)
  std::vector<float> host_w_;
};

// Expert parallelism: how one micro-batch's routed rows of one MoE layer move over the ep group
// (dropless: the expert region holds as many rows as were routed to this rank's experts).
struct EpExchange {
  std::vector<int64_t> send_rows;                 // rows this rank routes to each ep member
  std::vector<int64_t> recv_rows;                 // rows each ep member routes here
  std::vector<std::vector<int64_t>> recv_counts;  // [member][local expert] rows received
  int64_t region_rows = 0;                        // sum of recv_rows
};

// The key of per-(layer, micro-batch) state: the layer and micro-batch of OpTags.
inline int64_t ep_key(int layer, int micro_batch) { return int64_t{layer} * 65536 + micro_batch; }

// The operands of one attention op: its kernel dims, and Q, K and V (the fused Q | K | V buffer,
// a received ring chunk's K | V, or the local chunk packed in the ring's layout).
// Typed (bf16 storage through the Backend's bf16 entries): the operands are bf16, else fp32.
struct AttnOperands {
  AttentionDims d;
  const void *q = nullptr, *k = nullptr, *v = nullptr;
  int64_t q_cols = 0, k_cols = 0, kv_width = 0;  // Q's columns, K's, K's and V's
  int step = 0;                                  // ring step (0: the local chunk)
  void* packed = nullptr;                        // workspace holding the packed local K | V
  bool typed = false;
  int64_t eb = 4;  // bytes per element of the operands (2 when typed)
  // The element `i` elements after p.
  const void* at(const void* p, int64_t i) const { return static_cast<const char*>(p) + i * eb; }
};

struct Executor::Impl {
  Impl(const Model& m, const Plan& p, const Program& prog, Backend& b, CommSet& c);
  ~Impl();

  // ---- Memory: one allocation unit per block or standalone buffer.
  struct Unit {
    std::vector<int> buffers;
    size_t bytes = 0;
    bool host = false, persistent = false;
    BufferClass cls = BufferClass::kActivation;
    int touches = 0;  // ops that read or write a member
    void* base = nullptr;
  };
  void allocate(int unit);
  void release(int unit);
  void ensure(const Op& op);    // allocates every unit op touches
  void finished(const Op& op);  // counts down the units op touches; frees the dead ones
  int64_t elements(int buffer) const { return elements_[buffer]; }
  void* ptr(int buffer) const { return ptr_[buffer]; }
  float* fptr(int buffer) const { return static_cast<float*>(ptr_[buffer]); }
  // The list as one contiguous range (a single buffer, or a whole block in order).
  Flat flat(const std::vector<int>& ids) const;

  // ---- Construction (executor.cc), in the constructor's order.
  void check_supported() const;  // throws parasol::Error for what this runtime cannot execute
  void init_shapes();            // tp, cp, dp indices and this rank's token and vocabulary sizes
  void build_units();            // per-buffer tables and one allocation unit per block or buffer
  void index_ops();      // distinct units per op, touch counts, and per-buffer tags from the ops
  void index_buckets();  // bucket_of_
  void allocate_persistent();  // the persistent units and the grad-norm scalars

  // ---- The step (executor.cc).
  struct Scheduler;  // one step's walk over the streams by prog's issue rules (executor.cc)
  // Per-step state reset; the gradients zeroed (they accumulate over micro-batches).
  void begin_step(const StepConfig& config, StepResult& res);
  // The global gradient norm into result; the step's config and result forgotten.
  void end_step(StepResult& res);
  void run_local(const Op& op);  // a compute, copy or optimizer op, issued on the calling thread

  // ---- Compute ops (executor_ops.cc): a short switch over op kinds, one function per kind.
  // Mixed precision: the kernels compute in fp32; run_widened gives run_compute fp32 views of
  // op's bf16 / fp16 buffers (Backend::alloc_widened) and rounds what it wrote back.
  void run_widened(const Op& op);
  // The ops with a typed bf16 entry of the Backend (linear GEMMs but the router's, norms,
  // activations, unmasked residual adds and sums, embedding; RoPE inside the QKV GEMMs);
  // run_typed runs op on it when the backend has the entries and every buffer of op has the
  // entry's dtype (true), else leaves it to the widening path (false).
  bool typed_kind(const Op& op) const;
  bool run_typed(const Op& op);
  bool run_typed_norm(const Op& op);
  bool run_typed_linear(const Op& op);
  bool run_typed_gelu_gemm(const Op& op);  // Plan::gemm_gelu_epilogue's two GEMMs
  bool run_typed_moe(const Op& op);        // dispatch, combine, grouped expert GEMMs
  void rotate_qk_bf16(int qkv, bool inverse);
  void run_compute(const Op& op);
  void run_embedding(const Op& op);      // token (and learned position) embedding
  void run_cross_entropy(const Op& op);  // vocabulary-parallel cross-entropy and the loss
  void run_tiled_loss(const Op& op);     // the same under plan.tiled_loss, on the stored dtype
  void add_losses(const float* dev_loss, const int32_t* labels);  // into result
  void inject_inf(void* p, Dtype dt);
  bool tiled_loss() const { return plan.tiled_loss && !plan.eager_loss; }
  void run_norm(const Op& op);        // LayerNorm / RMSNorm
  void run_activation(const Op& op);  // GELU / SwiGLU
  void run_residual(const Op& op);    // residual adds and the kResidualAdd rearrangements
  void run_linear(const Op& op);      // dense GEMMs: forward, data and weight gradients
  // The experts' grouped GEMMs; typed (the next two too): on bf16 storage (run_typed_moe).
  void run_expert_linear(const Op& op, bool typed = false);
  void run_expert_linear_dev(const Op& op, Routing& r);  // from the routing's device offsets
  // Rows per local expert of each block of op's expert region, in order.
  std::vector<const int64_t*> expert_blocks(const Op& op);
  // typed: on bf16 storage (Backend::attention_*_bf16; run_typed checked the dtypes).
  void run_attention(const Op& op, bool typed = false);
  // op's dims and Q, K, V (may pack: free it).
  AttnOperands attention_operands(const Op& op, bool typed);
  void attention_forward(const Op& op, const AttnOperands& x);
  void attention_backward(const Op& op, const AttnOperands& x);
  void run_router(const Op& op);  // router probabilities and the routing from them
  void run_dispatch(const Op& op, bool typed = false);  // tokens to expert order
  void run_combine(const Op& op, bool typed = false);   // expert outputs back to token order
  // The compute ops' operands: the i-th buffer op reads (R) or writes (W), as floats.
  float* R(const Op& op, size_t i) const { return fptr(op.reads.at(i)); }
  float* W(const Op& op, size_t i) const { return fptr(op.writes.at(i)); }
  int64_t cols_of(int buffer) const { return prog.buffers[buffer].shape.back(); }
  int64_t rows_of(int buffer) const { return elements_[buffer] / cols_of(buffer); }
  // The first of `ids` whose buffer has `role`, else -1.
  int with_role(const std::vector<int>& ids, BufferRole role) const;

  // ---- The optimizer's gradients (executor.cc).
  // `n` gradient elements at `src`, of dtype `dt`, as fp32 for the optimizer's kernels (gradient
  // norm, AdamW): `src` itself when fp32, else a widened copy (Backend::alloc_widened, counted in
  // StepResult::widened_bytes), which *widened is set to for the caller to free_widened (else
  // nullptr). A bf16 gradient buffer (Megatron's under grad_reduce_in_bf16) is read so: Megatron's
  // optimizers take main_grad.float().
  const float* grads_fp32(const void* src, Dtype dt, int64_t n, void** widened);
  // A copy between buffers of different dtypes: bf16 gradients into the fp32 host gradient.
  void run_widening_copy(const Op& op, Dtype src_dt, Dtype dst_dt);

  // ---- Communication (executor.cc): a short switch over op kinds, one function per kind.
  // The dtype op moves: its buffer's, but a data-parallel gradient reduction's is the plan's
  // grad_reduce_dtype (the lowering's op.bytes count that dtype).
  Dtype comm_dtype(const Op& op) const;
  // A data-parallel gradient reduction in a dtype narrower than the gradients' (bf16 over fp32
  // gradients, Megatron's grad_reduce_in_bf16): `n` elements at `src` rounded into a staging
  // buffer, which the reduction runs on; `finish` (run when it completes) widens the result
  // from the staging's element `from` into `dst` and frees the staging.
  void* stage_narrow(const Op& op, const void* src, int64_t n, Dtype src_dt, Dtype dt);
  void unstage_on_complete(const Op& op, void* staging, int64_t from, void* dst, int64_t n,
                           Dtype dst_dt, Dtype dt);
  Request start_comm(const Op& op);
  Request start_all_reduce(const Op& op, Communicator& comm, int64_t count, Dtype dt);
  // Buffers of several buckets (the SP norm gradients): packed, reduced, unpacked on completion.
  Request start_packed_all_reduce(const Op& op, Communicator& comm, int64_t count, Dtype dt);
  Request start_all_gather(const Op& op, Communicator& comm, int64_t count, Dtype dt);
  Request start_reduce_scatter(const Op& op, Communicator& comm, int64_t count, Dtype dt);
  Request start_send(const Op& op, Communicator& comm, int64_t count, Dtype dt);
  Request start_recv(const Op& op, Communicator& comm, int64_t count, Dtype dt);
  Request start_all_to_all(const Op& op);  // executor_ops.cc (MoE token exchange)
  // Makes comm's next transfers wait for the kernels issued so far (Backend::record_fence).
  void after_kernels(Communicator& comm);

  // ---- Helpers of the compute and communication ops.
  // K | V of a fused QKV buffer [T x (q_cols + kv_width)] packed into [T x kv_width] (the
  // layout of the ring's chunks: each row its keys then its values).
  void pack_kv(const void* qkv, void* kv, int64_t q_cols, int64_t kv_width, int64_t eb = 4);
  // dst[r][0, cols) = src[r][0, cols) for r < rows, rows ld_dst and ld_src elements apart.
  void copy_rows(float* dst, int64_t ld_dst, const float* src, int64_t ld_src, int64_t rows,
                 int64_t cols) {
    copy_rows_of(dst, ld_dst, src, ld_src, rows, cols, sizeof(float));
  }
  // The same for elements of `eb` bytes.
  void copy_rows_of(void* dst, int64_t ld_dst, const void* src, int64_t ld_src, int64_t rows,
                    int64_t cols, int64_t eb);
  // Multi-head latent attention: Q | K | V of this rank's heads from q_up, kv_up and the rotary
  // key (RoPE applied), and the backward (executor_ops.cc).
  void mla_pack(const Op& op);
  void mla_unpack(const Op& op);
  // A norm whose weight covers the first columns of its input (MLA's kv_norm; executor_ops.cc).
  void partial_norm(const Op& op, int64_t width);
  // Expert grid without SP: the first row of this rank's slice of a replicated token buffer of
  // `buffer_rows` rows when the op routes `rows` of them, else 0.
  int64_t routed_row0(int64_t buffer_rows, int64_t rows) const;

  // ---- Copies, the optimizer and completion work (executor.cc).
  void run_copy(const Op& op);
  void run_grad_norm(const Op& op);
  void run_adamw(const Op& op);
  void run_cast(const Op& op);
  void after_complete(const Op& op);  // completion work (grad-norm capture)

  // ---- Lookups: dropout seeds, buckets, MoE routing, rotary embeddings, expert regions.
  uint64_t seed_for(const Op& op, bool per_tp_rank) const;
  const ParamBucket* bucket_of(int buffer) const;
  int group_index(const ParamBucket& b) const;
  // The routing in router probabilities `rprobs_buffer` of op's layer and micro-batch (recovered
  // from them when they are a new buffer: recompute, prefetch); executor_ops.cc.
  Routing& routing(const Op& op, int rprobs_buffer);
  // Top-k weights renormalised over the chosen experts (Mixtral, top-k > 1); top-1 keeps the
  // router probability as the gate (Switch Transformer), which also keeps its gradient.
  bool renormalize() const { return model.moe.top_k > 1; }
  Routing& routing_of(const Op& op);  // the routing of op's layer and micro-batch
  // A new routing of `tokens` rows: on the device where the backend keeps it there
  // (Backend::device_moe_routing), else on the host.
  Routing new_routing(int64_t tokens);
  // The permutation and counts of r from its top-k indices, where r lives.
  void permute(Routing& r, int64_t tokens);
  // r.counts on the host: read from the device (a host synchronisation, counted in
  // StepResult::moe_count_syncs) the first time a host needs them.
  const std::vector<int64_t>& host_counts(Routing& r);
  // Frees the step's device routings (and checks their expert indices: moe_bad_).
  void clear_routing();
  int32_t* moe_bad_ = nullptr;  // device int32: expert indices out of range this step
  // Whole-step CUDA graphs: the step-by-step decision (runtime/step_graph.h), its blockers found
  // once from the Program, the plan and what this runtime can capture.
  StepGraphPolicy graph_;
  // This step's action and reason (the policy's, or eager for what the step's config changes:
  // a traced step, dropout's per-step seeds, the staging off); a capture starts here.
  GraphAction decide_graph(const StepConfig& config, StepResult& res);
  int graph_id_ = -1;              // the captured graph (Backend::end_capture), -1: none
  std::vector<double> graph_key_;  // what the captured kernels took by value (loss scale, ...)
  int64_t graph_peak_ = 0;         // the captured step's peak device bytes
  StepResult graph_counts_;        // the captured step's op counts, which its replays repeat
  std::vector<double> graph_key(const StepConfig& c) const;
  bool has_dropout_ = false;  // a kernel of the step draws a dropout mask (seeded per step)

  // ---- The step's staging (StepConfig::stage_host_traffic; executor.cc).
  // Per buffer: its slot in the staging memory (micro-batch * 2, + 1 for labels) for the token and
  // label buffers, else -1.
  std::vector<int> stage_slot_;
  int stage_slots_ = 0;
  void* staging_ = nullptr;     // Backend::alloc_staging: [stage_slots_ x T] int32, then loss_acc_
  double* loss_acc_ = nullptr;  // two device doubles: the loss sum and the labelled tokens
  bool staged() const { return cfg != nullptr && cfg->stage_host_traffic; }
  void stage_inputs();  // before the step's first op: the one upload, the accumulator zeroed
  void fill_input(int buffer, int micro_batch);  // a token or label buffer just allocated
  // Rotary position embeddings (models without learned positions) on the Q and K columns of a
  // QKV buffer (or its gradient: inverse), positions of this rank's sequence chunk.
  bool rotary() const { return !model.learned_positions; }
  void rotate_qk(int qkv_buffer, bool inverse);
  // Rows of an expert-region buffer (BufferRole::kExpertRows) under expert parallelism, else -1.
  int64_t region_rows(int buffer) const;

  const Model& model;
  const Plan& plan;
  const Program& prog;
  // prog's execution rules (core/issue_graph.h), built and checked once: a malformed Program is
  // parasol's bug (InternalError) before any op runs.
  const IssueGraph graph;
  Backend& be;
  CommSet& comms;
  const StepConfig* cfg = nullptr;
  StepResult* result = nullptr;

  // Shapes of this rank (as core/lower.cc computes them).
  int tp = 1, tp_idx = 0, cp = 1, cp_idx = 0, dp_idx = 0;
  int64_t T = 0, Sl = 0, h = 0, vocab_t = 0, vocab_start = 0;
  float norm_eps = 1e-5f;

  std::vector<int64_t> elements_;
  std::vector<void*> ptr_;
  std::vector<int> unit_of_;
  std::vector<Unit> units_;
  std::vector<int> live_touches_;             // per unit, this step
  std::unordered_map<int, int> bucket_of_;    // persistent bucket buffer -> Program::buckets index
  std::vector<int> op_units_;                 // flattened distinct units per op
  std::vector<int> op_units_begin_;           // op i: op_units_[begin[i] .. begin[i+1])
  std::unordered_map<int, Routing> routing_;  // by router-probabilities buffer
  // The router-probabilities buffer of the latest routing of each (layer, micro-batch), by the
  // key of ep_.
  std::unordered_map<int64_t, int> routing_probs_;
  std::unordered_map<int64_t, EpExchange> ep_;  // by layer * 65536 + micro-batch
  // Per buffer: the ep_ key of an expert-region buffer (the layer and micro-batch of the first op
  // that touches it), else -1.
  std::vector<int64_t> region_key_;
  // Without expert parallelism, the routed rows gathered over the experts' tensor-parallel
  // group: each member's rows per expert (the grouped GEMMs' blocks), by the key of ep_.
  std::unordered_map<int64_t, std::vector<std::vector<int64_t>>> gathered_;
  void gather_counts(const Op& op, Communicator& comm);  // executor_ops.cc
  std::vector<int64_t> nominal_elements_;  // elements_ as lowered (region buffers vary)
  // Device scalars from the step's gradient norm to its end (ensure_scalars(); zeroed there).
  float* sumsq_ = nullptr;  // the grad norm's sum of squares, once reduced
  float* scale_ = nullptr;  // the clip scale
  void ensure_scalars();
  bool scale_ready_ = false;
  bool skip_update_ = false;  // this step's gradients overflowed and skip_on_overflow is set
  int grad_norm_buffer_ = -1;
  std::vector<void*> scratch_;  // backend memory kept until the step ends (send staging)
  std::unordered_map<int, int> ring_step_;
  // Work to do when a communication op completes (unpacking a packed payload), by op id.
  std::unordered_map<int, std::function<void()>>
      on_complete_;  // K/V chunk buffer -> the ring step that uses it
};

}  // namespace parasol::runtime
