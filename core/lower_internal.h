// The Lowerer: builds the Program of one pipeline stage (core/lower.h states the conventions it
// keeps). Private to the lowering; its members are defined by concern:
//   lower_emit.cc      shared state, buffers, ops and their dependencies, TP operators
//   lower_layer.cc     a decoder layer's attention and MLP, forward and backward
//   lower_mla.cc       multi-head latent attention's projections, forward and backward
//   lower_moe.cc       a mixture-of-experts MLP (routed and shared experts), forward and backward
//   lower_recompute.cc selective recompute of the plan's modules (what is dropped, what re-runs)
//   lower_edges.cc     the embedding, the head and the vocab-parallel cross-entropy
//   lower_schedule.cc  the pipeline schedule and its forward/backward units
//   lower_buckets.cc   parameter buckets, ZeRO gathers and gradient reductions
//   lower_offload.cc   activation offload and prefetch
//   lower_optimizer.cc the optimizer step (gradient norm, AdamW, cast, ZeRO gathers)
//   lower_fragment.cc  one layer alone for one micro-batch (lower_layer_fragment)
#pragma once

#include <array>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/layer_shapes.h"
#include "core/lower.h"
#include "core/model.h"
#include "core/pipeline_schedule.h"
#include "core/plan.h"
#include "core/program.h"
#include "core/zero3_live.h"

namespace parasol::lowering {

// Weight slots of a layer (and of the embedding and head buckets). A linear's bias slot follows
// its weight slot; a slot's name is core/layer_shapes.h's name of the linear or norm.
enum Slot : int {
  kNorm1,
  kQkv,
  kQkvB,
  kOut,
  kOutB,
  kNorm2,
  kFc1,
  kFc1B,
  kFc2,
  kFc2B,
  kRouter,
  kEfc1,
  kEfc1B,
  kEfc2,
  kEfc2B,
  kTable,
  kPos,
  kFnorm,
  kHead,
  // Multi-head latent attention.
  kQDown,
  kQDownB,
  kQUp,
  kQUpB,
  kQ,  // the query projection without query compression
  kQB,
  kKvDown,
  kKvDownB,
  kKvUp,
  kKvUpB,
  kQNorm,
  kKvNorm,
  // Shared experts (one fused MLP).
  kSfc1,
  kSfc1B,
  kSfc2,
  kSfc2B,
  // LoRA adapters (Plan::lora_rank, core/lower_lora.cc): A [in x r] and B [r x out] of each target
  // linear, in LoraTarget order.
  kLoraQkvA,
  kLoraQkvB,
  kLoraOutA,
  kLoraOutB,
  kLoraFc1A,
  kLoraFc1B,
  kLoraFc2A,
  kLoraFc2B,
  kSlots
};
inline constexpr const char* kSlotName[kSlots] = {
    "ln1",        "qkv",        "qkv.b",        "out",        "out.b",        "ln2",
    "fc1",        "fc1.b",      "fc2",          "fc2.b",      "router",       "efc1",
    "efc1.b",     "efc2",       "efc2.b",       "table",      "pos",          "lnf",
    "head",       "q_down",     "q_down.b",     "q_up",       "q_up.b",       "q",
    "q.b",        "kv_down",    "kv_down.b",    "kv_up",      "kv_up.b",      "q_norm",
    "kv_norm",    "shared_fc1", "shared_fc1.b", "shared_fc2", "shared_fc2.b", "lora.qkv.a",
    "lora.qkv.b", "lora.out.a", "lora.out.b",   "lora.fc1.a", "lora.fc1.b",   "lora.fc2.a",
    "lora.fc2.b"};
using WSet = std::array<int, kSlots>;  // buffer id per slot, -1 when absent
inline WSet no_weights() {
  WSet w;
  w.fill(-1);
  return w;
}

// Buffers one layer's backward reads, for one micro-batch.
enum SavedSlot : int {
  sX,      // layer input = norm1 input
  sXn,     // norm1 output = QKV input (sequence shard under SP)
  sQkv,    // Q, K, V
  sAo,     // attention output = out-projection input
  sLse,    // flash: softmax log-sum-exp (fp32)
  sProbs,  // materialised: softmax output
  sPmask,  // materialised with dropout: attention dropout mask
  sPdrop,  // materialised with dropout: dropped probabilities
  sAoRc,   // selective recompute (flash): recomputed attention output
  sMask1,  // residual dropout masks
  sX1,     // norm2 input
  sX1n,    // norm2 output = FC1 / router input
  sFc1,    // FC1 output(s) = activation input
  sAct,    // activation output = FC2 input
  sMask2,
  sRprobs,  // MoE: router probabilities (fp32)
  sDisp,    // MoE: dispatched tokens = expert FC1 input
  sEret,    // MoE: expert outputs returned to their tokens (router gradient)
  sQLat,    // MLA: the query latent before its norm (q_down output; sequence shard under SP)
  sKvLat,   // MLA: the kv latent and the rotary key before the norm (kv_down output)
  sSfc1,    // shared experts: FC1 output(s) = activation input
  sSact,    // shared experts: activation output = FC2 input
  // MLA under mla_up_proj recompute: the normed latents and the rotary key the backward's
  // recompute formed (never kept; -1 when the backward recomputes them itself).
  sQn,
  sKvn,
  sKpe,
  // Under torchtitan's op-level policy (Recompute::kSelectiveOp, core/lower_recompute.cc), the
  // tensors its mm count splits apart: K (wk, the 2nd mm: not kept; sQkv then holds Q and V),
  // the w3 output (the 6th: not kept; sFc1 then holds the w1 output), the w2 output (the 7th:
  // kept though no backward reads it), and under SP the reduce-scatter outputs of wo and w2
  // (kept: _save_list names reduce_scatter_tensor).
  sK,
  sFc3,
  sFc2o,
  sOutRs,
  sMlpRs,
  // LoRA adapters, one of each per LoraTarget (core/lower_lora.cc): A's input (the linear's input,
  // or its dropout output under Plan::lora_dropout), the dropout mask, and u = x A [T x r].
  sLoraX,
  sLoraMask = sLoraX + 4,
  sLoraU = sLoraMask + 4,
  sSlots = sLoraU + 4
};
using Saved = std::array<int, sSlots>;
inline Saved no_saved() {
  Saved s;
  s.fill(-1);
  return s;
}

struct Spec {
  Slot slot;
  std::vector<int64_t> shape;
  bool fp8 = false;         // an fp8 parameter under Plan::fp8_param_gather (core/fp8_params.h)
  bool fp8_linear = false;  // a linear's weight Transformer Engine runs in fp8 (fp8_param_linear)
};

// Parameters reduced and updated together: a layer's dense or expert weights, the embedding,
// the head.
// Whether `s` is a linear's bias (it follows its weight's slot).
inline bool is_bias_slot(Slot s) {
  switch (s) {
    case kQkvB:
    case kOutB:
    case kFc1B:
    case kFc2B:
    case kEfc1B:
    case kEfc2B:
    case kQDownB:
    case kQUpB:
    case kQB:
    case kKvDownB:
    case kKvUpB:
    case kSfc1B:
    case kSfc2B:
      return true;
    default:
      return false;
  }
}

struct Bucket {
  int layer = -1;          // model layer; -1 for the embedding and head buckets
  int chunk = 0;           // virtual pipeline chunk holding it
  const char* label = "";  // name of an embedding/head bucket
  bool expert = false;
  // Plan::lora_rank: a frozen base bucket: parameters only (no gradients, optimizer state,
  // reduction or update).
  bool frozen = false;
  Group group = Group::kDpCp;  // ranks its state is sharded over (gradients reduced over)
  int ways = 1;                // their number
  int zero = 0;                // effective ZeRO stage (0 when ways == 1)
  // HSDP: the replicas of this rank's shard (the same position in the other shard groups),
  // over which the reduce-scattered gradient shard is all-reduced; rways == 1 without HSDP.
  Group rgroup = Group::kDpReplicate;
  int rways = 1;
  // ZeRO-3 resharding after the step: the gradients accumulate unsharded in `acc` (one fp32
  // block for the step) and are reduce-scattered once, after the last micro-batch.
  bool step_grads = false;
  WSet acc = no_weights();
  // ZeRO-Offload (core/offload_rules.h): each micro-batch's gradients go to host_grad as soon as
  // they are reduced; the device keeps no gradient shard (grad_shard is -1).
  bool stream_grads = false;
  std::vector<Spec> specs;
  double elements = 0;         // parameters on this rank before ZeRO sharding
  int64_t shard = 0;           // parameters this rank updates
  WSet params = no_weights();  // ZeRO < 3: one buffer per weight
  WSet grads = no_weights();   // ZeRO < 2: one fp32 buffer per weight
  int param_shard = -1, grad_shard = -1, opt = -1, host_grad = -1;
  bool master_in_opt = false;  // opt row 0 is the fp32 master copy
  // Elements a ZeRO gather or scatter moves: the shards of all ways (the tail is padding).
  double padded() const { return static_cast<double>(shard) * ways; }
  // Plan::fp8_param_gather: elements of the fp8 parameters before sharding (0 otherwise).
  double fp8_elements = 0;
  // Elements of each module's parameters, in spec (forward) order: a linear's bias joins its
  // weight (one module, fetched together), a norm is a module of its own.
  std::vector<double> weight_elements() const {
    std::vector<double> out;
    out.reserve(specs.size());
    for (const Spec& s : specs) {
      double n = 1;
      for (int64_t d : s.shape) n *= static_cast<double>(d);
      if (is_bias_slot(s.slot) && !out.empty())
        out.back() += n;
      else
        out.push_back(n);
    }
    return out;
  }
  std::vector<int> list(const WSet& w) const {
    std::vector<int> out;
    out.reserve(specs.size());
    for (const Spec& s : specs) out.push_back(w[s.slot]);
    return out;
  }
};

// One forward or backward pass of a micro-batch through a chunk of the stage; a stage's units in
// order: core/pipeline_schedule.h.
using Unit = PipelineUnit;

// "L<layer>.<what>[.m<mb>]" (no layer prefix when layer < 0, no suffix when mb < 0).
std::string name(int layer, const char* what, int mb = -1);

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Streams: compute; layer communication (TP, CP, EP); copy; data-parallel gradient and ZeRO
// traffic; pipeline sends and receives. Separate streams keep a gradient all-reduce from
// delaying the next layer's TP collective or a pipeline send (as separate NCCL streams do).
inline constexpr int kCompute = 0, kComm = 1, kCopy = 2, kDpComm = 3, kPpComm = 4;
// The host's own ops (device-to-host syncs: core/host_issue.h) are on the host stream. Under
// plan.ep_comm_overlap the expert all-to-alls have a stream of their own, the last (Megatron's
// combined 1F1B issues them on a communication stream beside the other micro-batch's compute).
inline constexpr int kHost = 5, kEpComm = 6, kStreams = 7;

// The stream of a communication op on group `g`.
int comm_stream(Group g);

class Lowerer {
 public:
  // `fp8_weight_transpose`: whether the device keeps a transposed copy of each fp8 weight
  // (core/fp8_params.h fp8_weight_transpose_kept).
  Lowerer(const Model& m, const Plan& p, int stage, bool fp8_weight_transpose);
  Program run();
  // The fragment of model layer `layer` (core/lower.h's lower_layer_fragment; lower_fragment.cc),
  // from a Lowerer of the fragment's one-stage plan.
  LayerFragment layer_fragment(int layer);

 private:
  // The Program's streams and the stage's buckets, and the per-unit state sized for its layers
  // (lower_schedule.cc): what run() and layer_fragment() begin with, room made for about
  // `ops_expected` ops and buffers.
  void begin_program(size_t ops_expected);

  // --- emission (lower_emit.cc)
  void init_shapes();
  Buffer& buf_at(int id) { return P_.buffers[id]; }
  int buffer(std::string nm, std::vector<int64_t> shape, Dtype dt, BufferClass cls,
             bool host = false, bool persistent = false);
  int act(int layer, const char* what, std::vector<int64_t> shape, Dtype dt) {
    return buffer(name(layer, what, tags_.micro_batch), std::move(shape), dt,
                  BufferClass::kActivation);
  }
  int act(int layer, const char* what, std::vector<int64_t> shape) {
    return act(layer, what, std::move(shape), adt_);
  }
  int ws(int layer, const char* what, std::vector<int64_t> shape, Dtype dt) {
    return buffer(name(layer, what, tags_.micro_batch), std::move(shape), dt,
                  BufferClass::kWorkspace);
  }
  int ws(int layer, const char* what, std::vector<int64_t> shape) {
    return ws(layer, what, std::move(shape), adt_);
  }
  // Roles (core/program.h): set on an emitted op or a made buffer; return its id.
  int role(OpRole r, int op_id) {
    P_.ops[op_id].role = r;
    return op_id;
  }
  int role(BufferRole r, int buffer_id) {
    if (buffer_id >= 0) buf_at(buffer_id).role = r;
    return buffer_id;
  }
  // A buffer of weight slot `slot` (a weight, a gathered or updated copy, a gradient): the
  // embedding table's carry its role.
  int slot_buffer(Slot slot, std::string nm, std::vector<int64_t> shape, Dtype dt, BufferClass cls,
                  bool host = false, bool persistent = false) {
    return role(slot == kTable ? BufferRole::kEmbeddingTable : BufferRole::kNone,
                buffer(std::move(nm), std::move(shape), dt, cls, host, persistent));
  }
  Op make(OpKind kind, int layer, const char* what, int stream);
  // A device-to-host sync of the host (OpKind::kSync on the host stream) that waits for `waits`.
  int host_sync(const char* what, std::vector<int> waits);
  // Megatron's NaN/Inf check of micro-batch `mb`'s loss on the last stage
  // (--check-for-nan-in-loss-and-grad, on by default; pretrain_gpt.py's loss_func calls the
  // rerun state machine's validate_result twice, each a .item() of a check on the loss):
  // two syncs on the loss op `loss`.
  void nan_check(int loss);
  // One attention step of layer `layer` on this rank (a cp chunk; core/layer_shapes.h). Under
  // hierarchical context parallelism, the chunk of the rank's all-to-all group (cp_a2a_size
  // chunks) on heads / cp_a2a_size heads.
  AttnShape attention_shape(int layer) const;
  static void set(std::vector<int>& to, std::initializer_list<int> ids);
  static void set(std::vector<int>& to, const std::vector<int>& ids);
  int emit(Op& op, std::initializer_list<int> extra = {});
  int gemm(int layer, const char* what, int64_t m, int64_t n, int64_t k, int64_t batch,
           std::initializer_list<int> reads, std::initializer_list<int> writes,
           bool backward_data = false, OpKind kind = OpKind::kLinear);
  int fp8_amax(OpKind kind, int layer, const char* what, int64_t elements, int64_t tensors,
               bool backward_data, const std::vector<int>& reads);
  int elementwise(OpKind kind, int layer, const char* what, double elements, double bytes,
                  std::initializer_list<int> reads, std::initializer_list<int> writes);
  // Places communication op `op` in the compute stream's order, as a framework issues a
  // collective it waits for on the compute stream (Megatron's SP/TP f and g without
  // tp_comm_overlap, the MoE block's token exchanges and gathers without ep_comm_overlap): it
  // starts after the last compute op before it and the next compute op waits for it, so that no
  // compute runs beside it. Returns `op`.
  int in_compute_order(int op);
  // Gives op `op` RoPE on this rank's Q and K columns as its epilogue (Op::epilogue_bytes):
  // KernelBytes::rotary in forward, KernelBytes::rotary_backward in the backward (`backward`).
  // Returns `op`.
  int rotary_epilogue(int op, bool backward);
  // Model::qk_norm: the per-head norms of the query and key columns of `qkv` (and `k`, where
  // kept apart), forward, or backward on their gradient `dqkv` (core/lower_layer.cc).
  void qk_norms(int layer, int qkv, int k, int dqkv);
  int collective(OpKind kind, Group g, int layer, const char* what, double bytes,
                 const std::vector<int>& reads, const std::vector<int>& writes,
                 std::initializer_list<int> extra = {});
  int collective(OpKind kind, Group g, int layer, const char* what, double bytes, int read,
                 int write) {
    return collective(kind, g, layer, what, bytes, std::vector<int>{read}, std::vector<int>{write});
  }
  // A send or receive; in the open p2p group, if any.
  int p2p(OpKind kind, Group g, int peer_stage, int64_t tag, int layer, const char* what,
          double bytes, int buffer_id, std::initializer_list<int> extra = {});
  // The sends and receives emitted between the two calls form one p2p group (Op::p2p_group).
  void begin_p2p_group() { p2p_group_ = p2p_groups_++; }
  void end_p2p_group() { p2p_group_ = -1; }
  // A host <-> device copy on the copy stream, or on `stream` where given.
  int copy(OpKind kind, int layer, const char* what, double bytes, const std::vector<int>& reads,
           const std::vector<int>& writes, std::initializer_list<int> extra = {},
           int stream = kCopy);
  void at(int layer, Phase phase) {
    tags_.layer = layer;
    tags_.phase = phase;
  }
  int64_t cp_tag(int layer, int mb, int phase, int step, int kind) const;
  int64_t pp_tag(int sender_virtual, bool backward, int mb) const;

  // --- tensor-parallel operators, Megatron's f and g (lower_emit.cc)
  // SP all-gather before a column-parallel GEMM (or the row-parallel data gradient); and the
  // reduction after a row-parallel GEMM (or a column-parallel data gradient). `overlapped`: the
  // collective Transformer Engine's userbuffers pipeline with the GEMM it feeds or drains when
  // the plan overlaps TP communication (Plan::tp_overlap_chunks): the forward's f and g and the
  // backward's conjugate of g. Then the all-gather's first chunk runs before the GEMM and the
  // rest beside it (the GEMM's consumer waits for it); the reduction's first chunks run beside
  // the GEMM that produces them and the last chunk after it.
  // `on_path`: a reduction the compute stream waits for without chunks (a column-parallel data
  // gradient's under Plan::tp_impl torch, emitted after the weight gradients).
  int tp_gather_in(int layer, int x, int64_t rows_full, bool overlapped = false);
  int tp_reduce_out(int layer, int y, int64_t rows_full, const char* what, bool overlapped = false,
                    bool on_path = false);
  // The reduction of a column-parallel data gradient `dxp` (the conjugate of f) around its weight
  // gradient, which `weight_grad` emits: beside it (Megatron's layers, Plan::tp_impl megatron), or
  // after it on the compute path (PyTorch's DTensor TP, tp_impl torch). Returns the reduced
  // gradient.
  template <typename WeightGrad>
  int tp_reduce_dgrad(int layer, int dxp, const char* what, WeightGrad weight_grad) {
    if (p_.tp_impl != TpImpl::kPytorch) {
      const int dx = tp_reduce_out(layer, dxp, T_, what);
      weight_grad();
      return dx;
    }
    weight_grad();
    return tp_reduce_out(layer, dxp, T_, what, false, true);
  }

  // --- a decoder layer (lower_layer.cc, lower_moe.cc)
  int layer_forward(int layer, int x, const WSet& w, Saved& sv);
  void mlp_norm(int layer, const WSet& w, Saved& sv);  // ln2: sv[sX1] -> sv[sX1n]
  // A dense MLP (the layer's, or an MoE layer's shared experts): its weight and saved slots,
  // op names and hidden columns on this rank.
  struct Mlp {
    Slot fc1, fc1b, fc2;
    SavedSlot s_fc1, s_act;
    const char *fc1_name, *act_name, *fc2_name;
    int64_t cols;  // hidden columns on this rank (ffn / tp)
  };
  Mlp dense_mlp() const;
  Mlp shared_mlp() const;
  int mlp_forward(int layer, const Mlp& mlp, const WSet& w, Saved& sv);
  int mlp_backward(int layer, const Mlp& mlp, const Saved& sv, int dres2, const WSet& w,
                   const WSet& g);
  void attention_forward(int layer, Saved& sv, bool recompute);
  int layer_backward(int layer, const Saved& sv, int dy, const WSet& w, const WSet& g);
  // LoRA (core/lower_lora.cc). The adapter bucket of `layer` (in layer_buckets_[local][1]: LoRA
  // runs on dense models only, whose expert slot is free).
  void add_lora_bucket(int chunk, int layer, int local);
  // The adapter of target `t` on the linear whose input is `x` [T x in] and output `y` [T x out]:
  // forward adds (dropout(x) A) B into y; backward adds the adapter's data gradient of `dy` into
  // `dx` (the linear's input gradient) and writes A's and B's weight gradients. No-ops when the
  // plan does not target `t`.
  void lora_forward(int layer, LoraTarget t, int x, int64_t in, int y, int64_t out, const WSet& w,
                    Saved& sv);
  void lora_backward(int layer, LoraTarget t, int dy, int64_t in, int dx, int64_t out,
                     const Saved& sv, const WSet& w, const WSet& g);
  // Plan::activation_fp8_input_store on dense MLP `mlp` (SwiGLU, not torchtitan's split w1/w3 or
  // a GELU epilogue): its SwiGLU keeps an fp8 copy of FC1's output.
  bool fp8_act_store(const Mlp& mlp) const {
    return p_.activation_fp8_input_store && m_.activation == Activation::kSwiglu && !op_ac_ &&
           !gelu_epilogue() && mlp.s_fc1 == sFc1;
  }
  // Whether the linear in `slot` trains its weight (false for every base weight under LoRA).
  bool trains(Slot slot) const { return !p_.lora() || slot >= kLoraQkvA; }
  int attention_backward(int layer, const Saved& sv, int dao);
  // Plan::attention_unpad (core/lower_unpad.cc): Q, K and V of `qkv` unpadded into packed
  // copies (returned; the kernel reads them), with their host syncs; the kernel's output `out`
  // padded back; in the backward the gradient `dao` gathered into a packed copy (returned) and
  // the gradients scattered and concatenated back into `dqkv`.
  std::vector<int> unpad_qkv(int layer, int qkv);
  void pad_output(int layer, int out);
  int unpad_dout(int layer, int dao);
  void pad_qkv_grad(int layer, int dqkv);
  int ring_steps(int layer) const;
  // Hierarchical context parallelism (cp_comm_type a2a+p2p under cp_impl te, cp_a2a_size > 1):
  // the attention runs a ring of cp_ring_size() = cp / cp_a2a_size steps over cp_ring_group()
  // (Group::kCpRing) between all-to-alls in Group::kCpA2a; otherwise the ring is Group::kCp.
  bool hierarchical_cp() const;
  int cp_ring_size() const;
  Group cp_ring_group() const;
  double dkv_bytes_per_element() const;
  // Columns of one token's K and V as the attention kernel and a context-parallel exchange see
  // them: k_cols_ + v_cols_, times heads / kv_heads when the plan repeats the K/V heads.
  int64_t kv_exchange_cols() const;
  // PyTorch's _AllGatherRotater (Plan::cp_rotate allgather): one all-gather of every context rank's
  // K/V (the local ones in `src`) into a buffer of its own, issued before the pass's first step.
  // Returns the gathered buffer, which the later steps read.
  int kv_all_gather(int layer, int src);
  // Transformer Engine's other context-parallel exchanges (Plan::cp_comm_type): all_gather
  // (AttnFuncWithCPAndKVAllGather) and a2a (AttnFuncWithCPAndQKVOA2A, DeepSpeed-Ulysses), forward
  // and backward; the backward returns the gradient of this rank's Q | K | V.
  void attention_forward_allgather(int layer, Saved& sv, bool recompute);
  int attention_backward_allgather(int layer, const Saved& sv, int dao);
  void attention_forward_a2a(int layer, Saved& sv, bool recompute);
  int attention_backward_a2a(int layer, const Saved& sv, int dao);
  // The attention core an all_gather step (one of the rank's two chunks against its causal K/V
  // prefix) or the a2a kernel (the whole sequence on heads / cp heads) runs.
  AttnShape allgather_attention_shape(int layer) const;
  AttnShape a2a_attention_shape(int layer) const;
  int ring_dkv_exchange(int layer, int mb, int step, int steps, int dkv, int dqkv);
  // Multi-head latent attention's projections (lower_mla.cc): Q | K | V from the norm1 output,
  // and their backward to the gradient of the norm1 output.
  struct Latents {
    int q = -1, kv = -1, pe = -1;  // normed q and kv latents, the rotary key (sequence shard)
  };
  Latents mla_latents(int layer, const Saved& sv, const WSet& w);
  void mla_forward(int layer, const WSet& w, Saved& sv);
  void mla_up_forward(int layer, const Latents& lat, const WSet& w, Saved& sv);
  int mla_backward(int layer, const Saved& sv, int dqkv, const WSet& w, const WSet& g);
  int moe_forward(int layer, int x1n, const WSet& w, Saved& sv);
  double allgather_combine_bytes(bool backward) const;
  int moe_experts_forward(int layer, int d, const WSet& w, Saved& sv);
  void moe_expert_act(int layer, Saved& sv);  // the experts' activation: sv[sFc1] -> sv[sAct]
  // The eager clamps of a clamped GLU's inputs (Model::glu_clamp) on the fc1 output `fc1`, or
  // backward on its gradient `dfc1`; -1 (nothing emitted) without a clamp.
  int expert_act_clamp(int layer, int fc1, int dfc1, bool backward);
  void expert_fc1_bias(int layer, int fc1, int b, bool backward);  // Plan::moe_gmm_experts
  int moe_backward(int layer, const Saved& sv, int dres, const WSet& w, const WSet& g);
  int moe_experts_backward(int layer, const Saved& sv, int d, const WSet& w, const WSet& g);
  // The experts' tensor-parallel operators: the all-gather of the routed rows over the expert
  // TP group before the column-parallel expert GEMMs, and the reduction after the row-parallel
  // ones (and the conjugates backward).
  // The dispatched rows' gather carries role kDispatchGather (the runtime trades their counts
  // before the rows).
  int expert_gather(int layer, int x, int64_t rows_full, const char* what, bool saved,
                    OpRole r = OpRole::kNone);
  int expert_reduce(int layer, int y, int64_t rows_full, const char* what, bool saved);
  // Marks op `op` as run on the expert side of the MoE block (Op::load = hot_); returns it.
  int expert_side(int op);
  // Under Plan::expert_fp8_padding and fp8: one of Transformer Engine's Fp8Padding /
  // Fp8Unpadding copies of the `rows` routed rows in buffer `buf` (and their router
  // probabilities), in place as far as memory goes; none otherwise.
  void expert_pad(int layer, int buf, int64_t rows, const char* what);

  // --- selective recompute of the plan's modules (lower_recompute.cc)
  // Drops from a layer's saved slots those its recomputed modules do not keep.
  void drop_recomputed(int layer, Saved& keep) const;
  // Re-runs the recomputed modules (Phase::kRecompute) before the layer's backward, refilling
  // the slots drop_recomputed dropped. `w` holds the layer's weights for this use.
  void recompute_modules(int layer, const WSet& w, Saved& sv);
  // Under torchtitan's op-level policy (op_ac_): the block's ops it recomputes, from what it keeps.
  void recompute_ops(int layer, const WSet& w, Saved& sv);

  // --- embedding, head and loss (lower_edges.cc)
  int embedding_forward(int mb);
  // FSDP2 keeps the embedding's gathered table from its forward to its backward (lower_edges.cc).
  bool fsdp2_root_held() const;
  void embedding_backward(int mb, int dy);
  void head_forward(int x, int mb);
  void cross_entropy_forward(int logits, int mb);
  void unfused_loss_forward(int logits, int mb);  // core/unfused_xent.h
  void unfused_loss_backward(int dlogits, int mb);
  bool tiled_loss() const { return p_.tiled_loss && !p_.eager_loss; }
  // FC1's GELU in its GEMM's epilogue and its derivative in FC2's data gradient (Plan::
  // gemm_gelu_epilogue; GELU models only, and not torchtitan's split SwiGLU).
  bool gelu_epilogue() const { return p_.gemm_gelu_epilogue && m_.activation == Activation::kGelu; }
  int head_backward(int mb);
  // Plan::loss_metric_passes: the logits' cross-entropies without gradient after micro-batch
  // `mb`'s backward (core/lower_edges.cc).
  void loss_metrics(int mb);

  // --- pipeline units (lower_schedule.cc)
  // The receive of unit u's input from its neighbouring stage (activations forward, their
  // gradient backward): returns the buffer it fills, or -1 when the unit has no such input.
  int post_receive(const Unit& u);
  // The unit's input from the buffer post_receive filled (gathered over tp when each tp rank
  // received a slice).
  int received_input(bool backward, int received);
  // The exchange after a step: the outputs of its units (-1: none) sent, and the receives of
  // the next step's units posted into `received`, as one p2p group (Megatron's batch_isend_irecv
  // of that iteration); `split`: the next step's receives in a group of their own.
  // Plan::gradient_accumulation_fusion off: after weight-gradient GEMM `dw` (its first write the
  // parameter's main gradient), Megatron-Core DDP's hook adding the new gradient tensor into the
  // fp32 main_grad, one kernel per parameter (`tensors`: a grouped expert GEMM's local experts).
  // Returns `dw`.
  int main_grad_add(int dw, int tensors = 1);
  // Plan::p2p_sync: a host sync on every device stream's last op after the transfers emitted
  // since op `first_op`, if any.
  void p2p_synchronize(size_t first_op);
  void exchange(const std::vector<Unit>& step, const std::vector<int>& outputs,
                const std::vector<Unit>& next, bool split, std::vector<int>& received);
  void send_output(const Unit& u, int x, std::initializer_list<int> extra);
  void set_unit_tags(const Unit& u);
  // A unit from its received input (-1: none); returns its output to send (-1: none).
  int forward_unit(int chunk, int mb, int received);
  int backward_unit(int chunk, int mb, int received);
  void run_steps();  // every unit of pipeline_steps() and the exchanges between them
  void backward_layers(int chunk, int mb, bool last, int& dy);
  // The j-th layer of chunk `chunk` of this stage: its model layer, and its stage-local index
  // (the stage's layers in chunk order).
  int layer_of(int chunk, int j) const { return first_layer_[chunk] + j; }
  int local_of(int chunk, int j) const { return chunk_base_[chunk] + j; }
  size_t saved_index(int chunk, int mb, int j) const {
    return static_cast<size_t>(local_of(chunk, j)) * M_ + mb;
  }

  // --- buckets, ZeRO gathers and gradient reductions (lower_buckets.cc)
  void build_buckets();
  void add_bucket(Bucket b);
  void set_reduction(Bucket& b) const;
  void add_embedding_bucket(int chunk);
  void add_layer_buckets(int chunk, int layer, int local);
  void add_linear_specs(Bucket& b, const LinearShape& s, int64_t parts) const;
  void add_head_bucket(int chunk);
  std::vector<int64_t> norm_shape() const;
  void acquire(const Bucket& b, WSet& out, int dep);
  int held_key(const Bucket& b) const;
  void gather(const Bucket& b, const std::vector<int>& dev, int dep);
  // Whether bucket `b`'s updated parameters are all-gathered in the next step's forward, before
  // their first use (Megatron's --overlap-param-gather), rather than after the optimizer.
  bool gathers_in_forward(const Bucket& b) const;
  double updated_gather_bytes(const Bucket& b) const;
  // That all-gather, issued once a step at the bucket's first use (`dep` as acquire()'s).
  void gather_updated(const Bucket& b, int dep);
  WSet layer_weights(int layer, int dep);
  // DeepSpeed ZeRO-3 under full recompute: the all-gather, for layer `layer`'s backward, of the
  // modules its recompute released (core/gather_units.h regathered_weights) into the weights
  // `w` the recompute gathered; nothing when every module was kept.
  void regather_layer(int layer, const WSet& w, int dep);
  // DeepSpeed's coordinator under ds_lazy_gathers (core/zero3_live.h): the weights of a use of
  // dense bucket `b` as the schedule's gathered copies, one block per module (a copy kept from
  // an earlier use is read again); each copy's all-gather is issued once the use that fetches it
  // is reached (ds_reach), so its buffer lives from there to its last use.
  void ds_acquire(const Bucket& b, WSet& out);
  void ds_reach(const std::vector<int>& reads);
  void ds_gather(const std::vector<int>& copies);
  // DeepSpeed ZeRO-3's persistent parameters gathered again after the optimizer step
  // (core/gather_units.h persistent_params): one all-gather each, then the host synchronises.
  void persistent_gathers();
  // DeepSpeed's gradients under ds_lazy_: a module's gradient buffers (the parameters' dtype),
  // reduce-scattered with the rest of its reduce bucket as soon as the bucket's last gradient
  // is written (ds_written, after the op that writes it), then freed.
  WSet ds_unit_grads(Bucket& b);
  void ds_written(const std::vector<int>& writes);
  void ds_reduce(int group);
  WSet unit_grads(Bucket& b);
  WSet layer_grads(int layer);
  void after_backward(Bucket& b, bool last);
  void final_reduce(Bucket& b);
  // After a chunk's last backward of the step: the reductions after_backward held back under
  // chunk_reductions_block_compute (core/fsdp_pipeline_reduce.h), one after another, the compute
  // stream waiting for each before it goes on.
  void chunk_reductions();
  void stream_grads(Bucket& b);
  // `elements`: of the shard copied (< 0: the bucket's shard).
  void offload_grad_shard(const Bucket& b, const std::vector<int>& src, double elements = -1);
  void set_calls(const Bucket& b, int id, const std::vector<double>& fractions);
  // PyTorch FSDP's own kernels (Plan::fsdp_impl, core/fsdp_copies.h): bucket `b`'s gradient
  // copies before (after) its reduce-scatter of `grads` (the shard), on the compute stream;
  // FSDP2's copy-out of the weights gathered for the use `w`, at the use (fsdp_copy_out).
  // Returns what the reduce-scatter reads: `grads`, or before it under FSDP2 the reduce-scatter
  // input its copy-in writes.
  std::vector<int> fsdp_reduce_copies(const Bucket& b, const std::vector<int>& grads, bool after);
  void fsdp_copy_out(const WSet& w);
  void replica_reduce(const Bucket& b, const std::vector<int>& grads);
  void export_buckets();  // Program::buckets from buckets_

  // --- activation offload (lower_offload.cc)
  Saved offload_saved(int layer, const Saved& sv);
  Saved prefetch_saved(int layer, const Saved& sv, int dep);

  // --- optimizer step (lower_optimizer.cc)
  void optimizer();
  void deferred_reductions();
  // Megatron-Core's combined 1F1B (plan.ep_comm_overlap): the forward unit and the backward
  // unit emitted as ops [a, b) and [b, c) (the forward first when `forward_first`) are reissued
  // interleaved, cut after each expert all-to-all: the backward's first segment, the forward's
  // first, the backward's second, ..., so that each all-to-all runs beside a compute segment of the
  // other micro- batch. Returns false, leaving them as emitted, when a dependency would then point
  // forward (the units depend on each other) or neither has an expert all-to-all.
  bool interleave_units(int a, int b, int c, bool forward_first);
  void sp_grad_all_reduce();
  void sp_bucket_all_reduce(const Bucket& b, const WSet& g);
  int grad_norm(int& norm_op);
  void grad_stats_all_reduce(int buf, int& last_op);
  void count_zeros();
  void params_norm();
  void update(Bucket& b, int norm, int norm_op);
  std::vector<int> update_target(const Bucket& b, bool gather, const std::vector<int>& dest);
  void publish_update(const Bucket& b, bool gather, const std::vector<int>& first,
                      const std::vector<int>& dest);

  const Model& m_;
  const Plan& p_;
  const int s_;
  int pp_, vpp_, V_, M_;
  int per_stage_;                     // layers of this stage (all chunks)
  int full_k_;                        // layers of this stage recomputed fully (the first ones)
  std::vector<int> first_layer_;      // per chunk: its first model layer
  std::vector<int> layers_in_chunk_;  // per chunk: its layers
  std::vector<int> chunk_base_;       // per chunk: the stage-local index of its first layer
  int64_t t_, seq_, Sl_, T_, Tn_, h_, heads_t_, kv_heads_t_, hd_, qkv_cols_, q_cols_, kv_cols_, up_,
      ffn_t_, eff_t_, experts_, local_experts_, topk_, vocab_t_;
  // Attention columns on this rank: keys, values (ring chunks [T x (k + v)]), attention output.
  int64_t k_cols_, v_cols_, ao_cols_;
  bool mla_;
  // MoE: the experts' tensor-parallel degree; whether they form a grid of their own (etp !=
  // tp); the tokens this rank routes; whether it routes a 1/tp slice of replicated rows (expert
  // grid, tp > 1, no SP); the group the routed rows are gathered over (kExpertTp / kTp) and its
  // size (1: none).
  int64_t etp_, Tm_, gather_ways_;
  // MoE: the busiest expert-parallel rank's rows over the mean (core/moe_load.h), carried by
  // the expert-side ops as Op::load; and whether the dispatcher sorts the received rows by local
  // expert and back (Megatron-Core's alltoall dispatcher with more than one local expert).
  double hot_ = 1;
  // The GEMMs being emitted stay outside fp8 autocast (the MoE router): no fp8 amax (fp8_amax).
  bool fp8_exempt_ = false;
  bool local_sort_ = false;
  bool grid_, slice_;
  Group gather_group_ = Group::kTp;
  Dtype adt_, wdt_;
  // Gradient buffers and optimizer state: fp32 (master weights in the optimizer state when the
  // weights are low precision), or pure bf16 (Plan::optimizer_dtype: the bf16 weights are the
  // master, the moments and gradients bf16).
  Dtype gdt_, odt_;
  Dtype gbuf_dt_ = Dtype::kFp32;  // the persistent gradient buffer's (ZeRO < 2): see lower_emit.cc
  // A linear's saved input: under fp8, Transformer Engine keeps the fp8 copy it cast for the
  // GEMM (for the weight gradient), not the bf16 one; else the activation dtype.
  Dtype ldt_;
  double eb_, wb_, drop_;
  KernelBytes kb_;  // the memory-bound kernels' bytes per element (core/layer_shapes.h)
  bool sp_, flash_, bias_;
  bool op_ac_;          // torchtitan's op-level selective activation checkpointing (kSelectiveOp)
  bool fp8_transpose_;  // the device keeps a transpose of each fp8 weight (Lowerer's constructor)
  Program P_;
  OpTags tags_;
  const char* bucket_label_ = nullptr;  // prefix of op names of an embedding/head bucket
  struct Label {                        // names the ops of bucket `b` while in scope
    Label(Lowerer* l, const Bucket& b) : l(l) {
      l->bucket_label_ = b.layer < 0 ? b.label : nullptr;
    }
    ~Label() { l->bucket_label_ = nullptr; }
    Lowerer* l;
  };
  std::vector<int> last_writer_;
  std::vector<std::array<int, kStreams>> last_reader_;
  int order_after_ = -1;   // when >= 0, every emitted op also waits for this op
  int p2p_group_ = -1;     // the open p2p group (-1: none)
  int p2p_groups_ = 0;     // p2p groups begun
  int last_compute_ = -1;  // the latest op on the compute stream
  // Overlapped all-gathers whose GEMM is not emitted yet: the next compute op waits for the
  // first chunk (`head`), the compute op after it for the rest.
  struct ChunkedGather {
    int head, rest, computes_seen;
  };
  std::vector<ChunkedGather> chunked_gathers_;
  // Ops the next compute op waits for (in_compute_order).
  std::vector<int> next_compute_waits_;

  std::vector<Bucket> buckets_;
  std::vector<std::array<int, 2>> layer_buckets_;  // stage-local layer -> dense, expert bucket
  int emb_bucket_ = -1, head_bucket_ = -1;
  std::vector<WSet> unit_grads_;  // per bucket, within the current unit
  // ZeRO-3 weights kept gathered past their use: per (bucket, micro-batch) when resharded
  // after the backward, per bucket when after the step (held_key()).
  std::vector<WSet> held_;
  std::vector<char> held_valid_;
  std::vector<char> gathered_in_forward_;  // per bucket: gather_updated() issued this step
  // FSDP2: gathers whose copy-out into the parameters waits for their use (bucket, buffers).
  std::vector<std::pair<int, std::vector<int>>> pending_copy_out_;
  // DeepSpeed's coordinator (ds_acquire): its schedule over the stage's module uses, the next
  // use an acquire takes, the last use an op has reached, the gathered copies (by source use)
  // and the uses reading each copy's buffers.
  bool ds_lazy_ = false;
  DsSchedule ds_;
  int ds_next_ = 0, ds_reached_ = -1;
  struct DsCopy {
    int bucket = -1;
    std::vector<int> buffers;
    double elements = 0;
    int fetch_step = -1;
    bool issued = false;
  };
  std::vector<DsCopy> ds_copies_;
  std::vector<int> ds_copy_of_source_;  // per use: its copy's index in ds_copies_, or -1
  std::vector<int> ds_pending_;         // copies not yet issued
  std::vector<std::vector<int>> ds_uses_of_buffer_;  // per buffer id: the uses reading it
  struct DsReduce {
    int bucket = -1;
    std::vector<int> grads;
    double elements = 0;
    int unwritten = 0;
    bool issued = false;
  };
  std::vector<DsReduce> ds_reduces_;
  std::vector<int> ds_reduce_of_buffer_;  // per buffer id: its pending reduce, or -1
  double gb_ = 4;                         // bytes per element of a data-parallel gradient reduction
  std::vector<char> unit_grads_valid_;
  std::vector<int> backward_done_;  // per chunk: backward units emitted
  // Saved activations per (chunk, micro-batch, layer of chunk); on host when offloaded.
  std::vector<Saved> saved_;
  struct EdgeSaved {
    int tokens = -1, mask = -1;  // embedding
    // FSDP2's root group (the embedding) gathered in the forward, held to the backward
    // (fsdp2_root_held).
    int table = -1, pos = -1;
    int x = -1, xf = -1, probs = -1, labels = -1, sums = -1, row_max = -1;  // head
    int logits = -1;  // the head's logits, which Plan::loss_metric_passes read after backward
  };
  std::vector<EdgeSaved> emb_saved_, head_saved_;
  std::vector<int> deferred_;          // buckets whose final reduction waits for the optimizer
  std::vector<int> chunk_reductions_;  // buckets reduced after the chunk's last backward
  // The last collective chunk_reductions() issued, which the next exchange's point-to-point ops
  // wait for (NCCL orders them after the compute stream's wait), or -1.
  int reductions_wait_ = -1;
};

}  // namespace parasol::lowering
