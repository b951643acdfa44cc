// Program: the exact list of operations one rank performs in one training step, with the
// buffers they read and write. A Plan is lowered (core/lower.h) into Programs; the simulator
// (sim/engine) plays them against the cost models and the runtime executes them with real
// tensors, so every op names its buffers, shapes and dtypes, not just a cost. Ranks whose
// Programs are identical (all ranks of a pipeline stage) share one Program; the runtime derives
// a rank's data shard from its coordinates (core/rank_layout.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/json_reader.h"
#include "core/rank_layout.h"

namespace parasol {

enum class OpKind {
  // Compute.
  kEmbedding,     // vocab-parallel token (and position) lookup
  kNorm,          // layernorm or rmsnorm
  kLinear,        // GEMM: out[m x n] = in[m x k] * W[k x n] (column- or row-parallel shard)
  kBias,          // bias add
  kActivation,    // gelu or swiglu
  kAttention,     // causal attention core (GQA), flash or materialised
  kResidualAdd,   // residual add (with dropout when the model has it)
  kCrossEntropy,  // vocab-parallel softmax cross-entropy
  kRouter,        // MoE router: logits, softmax, top-k
  kDispatch,      // permute tokens to their experts
  kCombine,       // un-permute and weight expert outputs
  kExpertLinear,  // grouped GEMM over the local experts
  kAdamW,         // optimizer step on this rank's shard
  kGradNorm,      // global gradient norm and clipping
  kCast,          // dtype conversion (fp32 master -> low-precision weights)
  // Statistics a framework logs each step (Plan::log_params_norm, log_num_zeros_in_grad):
  kParamNorm,   // L2 norm of the parameters (Megatron's calc_params_l2_norm)
  kCountZeros,  // zeros in the gradients (Megatron's count_zeros_fp32)
  // Communication on a group of the plan.
  kAllReduce,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kBroadcast,
  kSend,  // to `peer`
  kRecv,  // from `peer`
  // Memory movement between device and host.
  kOffload,   // device -> host
  kPrefetch,  // host -> device
  // The host thread.
  kSync,  // a device-to-host synchronisation: the host blocks until its deps have finished
          // (.item(), .tolist(), event.synchronize() where the framework makes them)
};
const char* op_kind_name(OpKind k);
bool is_communication(OpKind k);

enum class Phase { kForward, kBackward, kRecompute, kOptimizer };
const char* phase_name(Phase p);

enum class BufferClass { kParam, kGrad, kOptimizer, kActivation, kWorkspace };
const char* buffer_class_name(BufferClass c);

// What a stream runs; Program::streams lists the streams by index. A Program as lower() emits
// it (core/lower.h) has five: 0 compute, 1 layer communication (TP, CP, EP), 2 copy, 3
// data-parallel communication, 4 pipeline send/recv: the copy stream is not the last one.
// Program::stream_name names them ("compute", "comm0", "copy", "comm1", "comm2").
// The host stream (kHost, named "host") holds the ops of the host thread itself: device-to-host
// syncs (OpKind::kSync). Every op of the Program is issued by the host in Program order
// (core/host_issue.h).
enum class StreamKind { kCompute, kComm, kCopy, kHost };

// How the host issues an op (core/host_issue.h; the price of each is cost_models/host_cost.h):
//  kEager:         one by one, as the framework runs it (launches plus framework dispatch);
//  kGraphReplay:   the first op of a captured CUDA graph (Plan::cuda_graphs): the host replays the
//                  whole graph here;
//  kInGraph:       inside a CUDA graph (the replay issued it), or an element-wise op fused by
//                  torch.compile into the kernel before it: it costs the host nothing;
//  kCompiledEntry: the first op of a torch.compile'd region (Plan::torch_compile): the guard and
//                  wrapper, and its own launches;
//  kCompiled:      inside a compiled region: its (fused) launches only, no Python or dispatch.
enum class HostIssue : uint8_t { kEager, kGraphReplay, kInGraph, kCompiledEntry, kCompiled };
const char* host_issue_name(HostIssue h);

// Elements of a tensor of `shape` (1 for an empty shape).
int64_t shape_elements(const std::vector<int64_t>& shape);

// What a buffer holds, where an op must tell its reads or writes apart beyond their position
// (runtime/executor_ops.cc finds the attention op's buffers, the micro-batch's inputs and the
// expert region by role). Names are for people and traces only: nothing dispatches on them.
// Host copies (offload) and device copies (prefetch) keep the role of what they copy.
enum class BufferRole {
  kNone,            // nothing beyond its class, shape and position in an op's reads and writes
  kTokens,          // a micro-batch's input token ids (int32), filled by the runtime
  kLabels,          // a micro-batch's target token ids (int32, -1: no loss), filled by the runtime
  kQkv,             // a layer's fused Q | K | V [tokens x (q + k + v) columns]
  kKvChunk,         // ring attention: a K | V chunk from a ring neighbour [tokens x (k + v)]
  kAttnOut,         // attention output [tokens x heads * v dims] (or its recomputed copy)
  kAttnLse,         // fused attention: the softmax log-sum-exp per query (fp32)
  kAttnProbs,       // materialised attention: the softmax probabilities
  kAttnOutGrad,     // gradient of the attention output
  kQkvGrad,         // gradient of the fused Q | K | V
  kKvGrad,          // ring attention: a travelling K | V gradient accumulator [tokens x (k + v)]
  kEmbeddingTable,  // the token embedding table [vocab x hidden], a copy of it or its gradient
                    // (as the output layer's weight under tied embeddings it is [n x k])
  kExpertRows,      // rows in expert order on the experts' side of the token exchange (under
                    // expert parallelism their number is what the routing sends here)
};
const char* buffer_role_name(BufferRole r);

struct Buffer {
  int id = 0;
  std::string name;            // e.g. "L3.qkv.out.mb2": for people and traces only
  std::vector<int64_t> shape;  // elements per dimension, this rank's shard
  Dtype dtype = Dtype::kBf16;
  BufferClass cls = BufferClass::kActivation;
  bool host = false;        // lives in host memory (offload)
  bool persistent = false;  // allocated for the whole step (params, grads, optimizer)
  int block = -1;           // index into Program::blocks, or -1 (allocated on its own)
  BufferRole role = BufferRole::kNone;
  int64_t elements() const;
  double bytes() const;
};

// Buffers allocated as one contiguous allocation, in the order listed: the weights (or
// gradients) of one parameter bucket, which collectives treat as one flat bucket (lower.h), so
// that a ZeRO shard is a contiguous range of it. The block lives from the first op that touches
// any member to the last op that touches any, and holds `elements` elements of the members'
// dtype: their sum rounded up to ways x shard for a sharded bucket (the tail is padding).
struct BufferBlock {
  std::vector<int> buffers;
  int64_t elements = 0;
  double bytes(const std::vector<Buffer>& all) const;
};

// One weight of a parameter bucket, as this rank holds it: `name` is the model's tensor
// ("L3.qkv", "emb.table", "head.lnf", "L5.efc1"), `shape` this rank's tensor/expert-parallel
// slice of it (runtime/param_layout.h maps it to the full tensor).
struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
  int64_t elements() const;
};

// Parameters reduced and updated together (a layer's dense or expert weights, the embedding,
// the head) and the persistent buffers that hold their state on this rank. Flattened in spec
// order, the bucket is `elements` long; under ZeRO >= 1 this rank updates elements
// [index * shard, (index + 1) * shard) of it, where index is its position in `group`.
struct ParamBucket {
  std::string name;  // "L3", "L3.experts", "emb", "head"
  int layer = -1;    // model layer, -1 for the embedding and head buckets
  int chunk = 0;     // virtual pipeline chunk
  bool expert = false;
  Group group = Group::kDpCp;  // gradient-reduction group
  int ways = 1;                // its size
  int zero = 0;                // effective ZeRO stage (0 when ways == 1)
  std::vector<ParamSpec> specs;
  int64_t elements = 0;        // sum of the specs' elements
  int64_t shard = 0;           // elements this rank updates (= elements when zero == 0)
  std::vector<int> params;     // one buffer per spec (zero < 3), else empty
  int param_shard = -1;        // zero == 3: this rank's shard of the flat weights
  std::vector<int> grads;      // one fp32 buffer per spec (zero < 2), else empty
  int grad_shard = -1;         // zero >= 2: this rank's fp32 shard of the flat gradients
  int opt = -1;                // optimizer state [rows x shard] fp32: [master,] m, v
  bool master_in_opt = false;  // row 0 of opt is the fp32 master copy (else the params are)
  int host_grad = -1;          // optimizer offload: host copy of the gradient shard
};

// The attention core of one kAttention op: softmax(Q K^T) V over `seq_q` queries and `seq_kv`
// keys per sequence (one ring step under context parallelism).
struct AttnShape {
  int64_t batch = 0;       // sequences
  int64_t seq_q = 0;       // queries on this rank
  int64_t seq_kv = 0;      // keys/values attended to by this op
  int64_t heads = 0;       // query heads on this rank
  int64_t kv_heads = 0;    // key/value heads on this rank (GQA)
  int64_t head_dim = 0;    // query/key dims per head (QK^T)
  int64_t v_head_dim = 0;  // value dims per head (AV); 0 = head_dim (MLA: its v_head_dim)
  int64_t window = 0;      // causal sliding window in keys (a query at i attends
                           // max(0, i - window + 1)..i); 0 = none
  bool causal = true;
  bool flash = true;     // fused kernel (no score matrix in memory)
  bool dropout = false;  // attention-probability dropout (materialised path)
  AttentionKernel kernel = AttentionKernel::kFlash2;  // which fused kernel (when flash)
};
// FLOPs of QK^T (head_dim) and AV (v_head_dim) that the kernel executes, 2 per multiply-add:
// 2 batch heads (head_dim + v_head_dim) per (query, key) pair it computes. A materialised kernel
// (or a non-causal one) computes the whole seq_q x seq_kv matrix. A fused (flash) causal kernel
// skips the masked blocks, counted exactly per pair: with seq_q == seq_kv = S and a window W,
// P(S, W) = S W - W (W - 1) / 2 pairs (W >= S or none: S (S + 1) / 2, about half the matrix).
// When seq_q < seq_kv (a context-parallel rank's load-balanced share of a sequence of seq_kv)
// the seq_q queries are taken as an average sample of the sequence: seq_q P(seq_kv, W) / seq_kv
// pairs, exact summed over the ranks of a load-balanced layout and what the window-less count
// always was. A ring-attention step priced as seq_q == seq_kv == one chunk is counted as a causal
// chunk of its own; which key chunks a window reaches is the caller's to decide. A window is a
// causal mask: it is ignored when !causal.
double attention_flops(const AttnShape& a);
// A fused (flash) attention backward runs five matmuls (S = QK^T recomputed, dV = P^T dO,
// dP = dO V^T, dQ = dS K, dK = dS^T Q) against the forward's two: 2.5x the forward's FLOPs
// (FlashAttention-2 paper, Dao 2023, section 3.1). Materialised attention keeps P: 2x.
inline constexpr double kFlashBackwardFlopRatio = 2.5;

struct OpTags {
  int layer = -1;        // model layer, -1 outside layers
  int micro_batch = -1;  // -1 for per-step ops (optimizer, gradient sync)
  int stage = 0;         // pipeline stage
  int chunk = 0;         // virtual pipeline chunk
  Phase phase = Phase::kForward;
};

// What an op is, where its kind, phase and backward_data do not say all that the runtime
// executes (runtime/executor_ops.cc dispatches on it; names are for people and traces only).
enum class OpRole {
  kNone,              // nothing beyond its kind, phase and backward_data
  kQkv,               // kLinear forward: the QKV projection (rotary embeddings follow on Q, K)
  kQkvDx,             // kLinear: the QKV projection's data gradient (rotary undone on dQ, dK)
  kWeightGrad,        // kLinear, kExpertLinear: a weight gradient, reads {in, dout} writes
                      // {dW[, db]}
  kRouter,            // kLinear forward: the MoE router's logits from the rows this rank routes
  kRouterDw,          // kLinear: the router's weight gradient (a kWeightGrad of the routed rows)
  kHead,              // kLinear forward: the output layer (logits of this rank's vocab slice)
  kExpertAct,         // kActivation: the routed experts' activation (forward or backward)
  kAttnResidual,      // kResidualAdd: the attention block's residual add (its dropout site)
  kMlpResidual,       // kResidualAdd: the MLP block's residual add (its dropout site)
  kEmbeddingDropout,  // kResidualAdd: dropout on the embedding output
  kSum,               // kResidualAdd: the sum of its two reads (MoE: routed + shared experts)
  kDkvFold,           // kResidualAdd: ring attention's K/V gradient folded into dQKV
  kQkvPack,           // kResidualAdd: MLA's Q | K | V formed from q, kv and the rotary key
  kQkvUnpack,         // kResidualAdd: kQkvPack's backward
  kXentMax,           // kCrossEntropy: the row maximum of the logits
  // kCrossEntropy: a kernel of Megatron's unfused loss (Plan::cross_entropy_loss_fusion off,
  // core/unfused_xent.h) beside those the fused loss's ops run: priced by both predictors; the
  // executor runs the fused loss's arithmetic and nothing for it.
  kXentUnfused,
  kDispatchA2a,     // kAllToAll: the dispatch's token exchange (forward: to the experts)
  kCombineA2a,      // kAllToAll: the combine's token exchange (forward: back to the tokens)
  kDispatchGather,  // kAllGather: the dispatched rows over the experts' tensor-parallel group
  // kBias: the routed experts' fc2 bias added outside the grouped GEMM, one loop over the local
  // experts (Plan::expert_bias_loop; `tensors` = the local experts), forward or backward.
  kExpertBias,
  // kBias: the routed experts' fc1 bias added the same way without probabilities (`t + b`;
  // Plan::moe_gmm_experts: NeMo AutoModel's GroupedExpertsDeepEP._apply_bias).
  kExpertFc1Bias,
  // kCast: the amax and scale kernels of Transformer Engine's fp8 current scaling
  // (Fp8Recipe::kTensorwise) before a linear's fp8 GEMM (forward input, backward output
  // gradient): `bytes` the bf16 operand read once more, `tensors` the quantised tensors, two
  // kernels each; kExpertFp8Amax before a grouped expert GEMM (`tensors` its local experts).
  kFp8Amax,
  kExpertFp8Amax,
  // kMainGradAdd: Megatron-Core DDP's backward hook adding a weight gradient into its fp32
  // main_grad (Plan::gradient_accumulation_fusion off), issued from Python.
  kMainGradAdd,
  // kLinear forward under Plan::gemm_gelu_epilogue: FC1 with GELU (tanh form) in its epilogue,
  // reads {in, W[, b]} writes {pre, out}: pre = in W + b (kept for the backward), out = gelu(pre).
  // epilogue_bytes: the pre-activation's write, inside the GEMM (no kernel of its own).
  kGeluFc1,
  // kLinear data gradient under Plan::gemm_gelu_epilogue: FC2's, with GELU's derivative in its
  // epilogue, reads {dout, W, pre} writes {dpre[, db]}: dpre = gelu'(pre) * (dout W^T), the
  // gradient of FC1's output; db, FC1's bias gradient, as the unfused activation backward lists
  // it (cuBLASLt's DGELU_BGRAD forms it here; parasol's runtime forms it in FC1's weight
  // gradient either way). epilogue_bytes: the pre-activation's read, inside the GEMM.
  kGeluFc2Dx,
  // kResidualAdd after a tensor-parallel reduce-scatter fused with its GEMM by PyTorch's async TP
  // (Plan::tp_impl torch with tp_comm_overlap): torch.ops.symm_mem.fused_matmul_reduce_scatter
  // exchanges the GEMM's per-rank partial chunks (_pipelined_produce_and_all2all), then sums them
  // in one more kernel (_fused_matmul_reduce_scatter_impl's reduce_fn). bytes: the partials read
  // (the GEMM's whole output) and the shard written. Priced by both predictors; the executor runs
  // nothing for it (its reduce-scatter already summed).
  kTpPartialsSum,
  // kLinear: a GEMM of a LoRA adapter (Plan::lora_rank, core/lower_lora.cc): forward (x A, then
  // u B added into the frozen linear's output), data gradient (backward_data) or weight gradient
  // of A or B. Megatron's plain linears (NeMo's ParallelLinearAdapter): bf16 outside fp8
  // autocast, issued as Megatron-local linear modules.
  kLora,
  // kResidualAdd: the adapters' input dropout (Plan::lora_dropout), forward (writes the dropped
  // input and its mask) or backward (the masked data gradient added into the linear's input
  // gradient).
  kLoraDropout,
};
const char* op_role_name(OpRole r);
// The experts' bias loops (kExpertBias, kExpertFc1Bias): kernels per local expert.
inline bool is_expert_bias_loop(OpRole r) {
  return r == OpRole::kExpertBias || r == OpRole::kExpertFc1Bias;
}
inline bool is_fp8_amax(OpRole r) { return r == OpRole::kFp8Amax || r == OpRole::kExpertFp8Amax; }

struct Op {
  int id = 0;  // index in Program::ops; the same id in traces of every backend
  OpKind kind = OpKind::kLinear;
  OpRole role = OpRole::kNone;
  std::string name;         // e.g. "L3.fc1": for people and traces only
  int stream = 0;           // index into Program::streams
  std::vector<int> deps;    // ids of ops (of this Program) that must finish first
  std::vector<int> reads;   // buffer ids
  std::vector<int> writes;  // buffer ids
  // Shape: GEMMs use m, n, k (and batch for grouped/batched); element-wise ops use elements;
  // attention uses the fields of `attn`; communication uses bytes.
  int64_t m = 0, n = 0, k = 0, batch = 1;
  AttnShape attn;  // kAttention only
  double elements = 0;
  // Payload of a collective (nccl-tests convention: all-reduce buffer, all-gather output,
  // reduce-scatter input, all-to-all send buffer), a send/recv or a copy; for memory-bound
  // compute ops (norms, activations, residuals, routing, embedding, loss, optimizer) the HBM
  // bytes read plus written, the figure cost_models/op_cost.cc prices them by.
  double bytes = 0;
  double flops = 0;  // executed FLOPs (GEMMs and attention; 0 for memory-bound ops)
  // A GEMM's memory-bound epilogue: HBM bytes read plus written by the element-wise kernel the
  // op runs beside its product (RoPE on the QKV projection's output, and undone on the data
  // gradient's input; RoPE inside MLA's qkv.pack and qkv.unpack), priced as a kernel of its own.
  double epilogue_bytes = 0;
  // A collective the framework issues as several calls (DeepSpeed ZeRO-3's per-module
  // gathers, core/gather_units.h): each call's payload bytes, summing to `bytes`; empty: one.
  std::vector<double> calls;
  // MoE expert-side ops (the expert GEMMs and activation, the expert all-to-alls, gathers and
  // reductions): the rows the busiest rank of the expert-parallel group processes over the mean
  // rows the op's shape carries (core/moe_load.h); the op pricer scales the op's time by it.
  // The shapes stay the mean (the runtime executes them); 1 for every other op.
  double load = 1;
  Group group = Group::kTp;    // communication group
  bool reduce_max = false;     // all-reduce: element-wise maximum instead of the sum
  int peer_stage = -1;         // send/recv: the pipeline stage of the peer
  int64_t tag = -1;            // send/recv: a kSend and a kRecv match when their tags are equal
                               // (and they name each other: peer stages, or ring neighbours)
  bool backward_data = false;  // linear backward: the data-gradient GEMM (else weight)
  OpTags tags;  // layer and micro-batch of the op (the runtime keys per-layer state by them)
  // send/recv: the sends and receives of one exchange share a p2p_group (>= 0; -1: a transfer
  // on its own). They are consecutive on their stream, on one communication group, and are
  // issued together once all of them are ready, as one NCCL group (ncclGroupStart/End;
  // Megatron's batch_isend_irecv): where a send completes only once its receive is posted and a
  // communicator runs its calls in order, neighbours that exchange must group their transfers.
  int p2p_group = -1;
  HostIssue host_issue = HostIssue::kEager;  // how the host issues it (see HostIssue)
  // Multi-tensor ops (AdamW, cast, grad norm): the parameter tensors they apply to (the launches
  // of a multi-tensor or per-parameter optimizer depend on it); 0 = one.
  int tensors = 0;
};

struct Program {
  int stage = 0;           // pipeline stage this Program belongs to
  std::vector<int> ranks;  // ranks that execute it
  std::vector<StreamKind> streams = {StreamKind::kCompute, StreamKind::kComm, StreamKind::kCopy};
  std::vector<Buffer> buffers;
  std::vector<BufferBlock> blocks;
  std::vector<ParamBucket> buckets;
  std::vector<Op> ops;  // in issue order; each stream runs its ops in this order

  std::string stream_name(int s) const;
  int add_buffer(Buffer b);  // sets b.id; returns it
  int add_op(Op op);         // sets op.id; returns it
  // Makes `ids` one block of at least `elements` elements (0: their sum); returns its index.
  int add_block(const std::vector<int>& ids, int64_t elements = 0);
};

// The whole Program as JSON: {"stage", "ranks", "streams", "buffers": [...], "ops": [...]};
// a buffer's or op's "role" where it has one (buffer_role_name, op_role_name).
Json program_to_json(const Program& p);

}  // namespace parasol
