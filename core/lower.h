// lower: compiles a Plan into the Programs of one training step, one per pipeline stage (all
// ranks of a stage share it). The Program of a stage is a Megatron-style decoder step:
//
//  * layers (their linears, norms and attention core are core/layer_shapes.h's): norm,
//    column-parallel QKV or multi-head latent attention's projections (replicated down-
//    projections and latent norms on the sequence shard, column-parallel up-projections),
//    attention (flash or materialised, GQA, MLA's value heads, a sliding window on the model's
//    windowed layers; a ring of context-parallel steps under cp > 1), row-parallel
//    out-projection, residual (+ dropout), norm, MLP (column FC1, activation, row FC2) or MoE
//    (router, dispatch, all-to-all over ep, grouped expert GEMMs, all-to-all, combine; the
//    shared experts as a dense MLP beside them), residual; backward with separate data- and
//    weight-gradient GEMMs; vocab-parallel embedding on the first and head + cross-entropy on
//    the last virtual stage;
//  * tensor parallelism with Megatron's f/g operators: all-reduce after row-parallel GEMMs
//    forward and after column-parallel data gradients backward; under sequence parallelism
//    all-gather before column-parallel and reduce-scatter after row-parallel GEMMs (norms and
//    residuals on the sequence shard), with the conjugates backward and the all-gather of the
//    column-parallel input again for its weight gradient;
//  * pipelines: GPipe, 1F1B and interleaved 1F1B in Megatron's per-stage order, with kSend /
//    kRecv of activations (forward) and gradients (backward) scattered 1/tp per TP rank; even or
//    uneven stages (chunk c of stage s holds Plan::layers_in_chunk(s, c) layers from
//    Plan::first_layer(s, c), Megatron's order of virtual stages), the embedding on stage 0
//    chunk 0 and the head on the last stage's last chunk;
//  * expert tensor parallelism other than tp (plan.etp): the experts' own grid (core/
//    rank_layout.h): expert weights split etp ways, the all-to-all over its ep group, the routed
//    rows gathered over Group::kExpertTp, expert gradients reduced over its expert data-parallel
//    group;
//  * data parallelism and ZeRO 0-3 over Group::kDpCp (experts over Group::kExpertDp), or under
//    HSDP (plan.shard_degree) over their shard groups with the replicas across them; ZeRO-3
//    with any schedule in the three plan.reshard modes; activation recompute (selective, of
//    Megatron's modules, Plan::recompute_modules; full for the first k layers of a stage),
//    offload of optimizer state, parameters and activations, and the optimizer step (grad norm,
//    AdamW, cast).
//
// Conventions of the Programs lower() emits (the simulator and the runtime rely on them):
//  * streams: 0 compute, 1 layer communication (TP, CP, EP), 2 copy (host <-> device), 3
//    data-parallel communication (gradient reduction, ZeRO gathers), 4 pipeline send/recv (and
//    the grad-norm reduction across stages), and under plan.ep_comm_overlap 5, the expert
//    all-to-alls. Ops whose buffers all live
//    in host memory (AdamW and cast under optimizer offload) run on the host CPU and are placed
//    on the copy stream.
//  * every plan switch is something the Program says, so that the simulator plays what the
//    closed form prices: fused_kernels the bytes of the memory-bound ops (core/layer_shapes.h's
//    KernelBytes), RoPE the QKV projection's epilogue (Op::epilogue_bytes), tp_comm_overlap the
//    forward's f and g and the backward's conjugate of g split into Plan::tp_overlap_chunks()
//    collectives (the first chunk of an all-gather before the GEMM it feeds and the rest beside
//    it, the consumer waiting for all; a reduction's first chunks beside the GEMM that produces
//    them, the last after it: ".rest" ops that move no buffer), and ep_comm_overlap Megatron's
//    combined 1F1B (a forward unit and the backward unit next to it reissued interleaved at their
//    expert all-to-alls, which run on stream 5 beside the other's compute). Without it the next
//    compute op waits for each expert all-to-all, as Megatron issues them in compute order.
//    The CPU runtime executes runtime_plan(plan) (core/plan.h), without the two overlaps.
//  * deps list the producers of every buffer an op reads (and, across streams, the last writer
//    and readers of every buffer it writes), plus ordering edges that keep prefetches (ZeRO-3
//    gathers, parameter and activation prefetch) one layer ahead of use (just before use when
//    plan.overlap_param_gather is false); every dep is an earlier op. Ops of one stream run in
//    issue order.
//  * a collective that reads or writes several buffers treats them as one flat bucket in the
//    order listed; a reduce-scatter or all-gather whose input and output are the same buffers
//    works in place (Megatron's distributed-optimizer buffers).
//  * kSend/kRecv on Group::kPp name the peer pipeline stage; on Group::kCp (ring attention) a
//    kSend goes to the next rank of the cp ring and a kRecv comes from the previous one, or, when
//    peer_stage > 0, to the rank peer_stage places on round the ring and from the rank that many
//    places back (a windowed layer's K/V gradients going home after fewer than cp steps). Sends
//    are eager (they do not wait for the receiver); a kRecv completes when the kSend with the
//    same `tag` from its peer has. Tags are unique per direction within a step. A ring's K/V
//    send also waits for the compute op emitted before it: Transformer Engine issues it with the
//    attention step (its NCCL stream waits for the compute enqueued before), not as soon as
//    Q | K | V exist (which, backward, would start it beside the MLP's backward).
//  * the transfers of one exchange share an Op::p2p_group, consecutive on their stream: a ring
//    attention step's send and receive; a pipeline step's sends and the next step's receives
//    (Megatron's batch_isend_irecv: under 1F1B and GPipe each unit's send with the next unit's
//    receive; interleaved, an iteration's sends, forward and backward, with the next iteration's
//    receives, the sends each depending on the other's data). So grouped, the exchanges complete
//    where a send completes only once its receive is posted and each communicator runs its
//    groups in order (NCCL).
//  * names ("L3.qkv.m0") are for people and traces; what the runtime must tell apart is typed:
//    Op::role and Buffer::role (core/program.h), layer and micro-batch in Op::tags. The names
//    below say which op or buffer is meant; each such op or buffer carries its role.
//  * a fused QKV buffer ("qkv", and its gradient "dqkv") holds per row this rank's heads of Q,
//    then K, then V (Q and K of head_dim columns per head, V of v_head_dim: MLA's differ). The
//    ring's K/V chunks and their gradient accumulators are [T x (K + V columns)], each row its
//    keys then its values (the last columns of a qkv row).
//  * the ring's K/V gradients: an exchange follows each of the cp backward steps; each step
//    writes its chunk's dK/dV into a fresh accumulator and a kSum "dkv.acc" then adds the
//    accumulator received with the chunk (so the exchange of one step runs beside the next
//    step's attention); the last exchange takes the accumulator home to the chunk's owner (the
//    next rank), where a kResidualAdd "dkv.fold" reads {dqkv, accumulator} and writes it into
//    dqkv's K/V columns (the ring steps write dK/dV into the accumulators).
//  * kAttention's attn (core/program.h's AttnShape, from core/layer_shapes.h's
//    attention_shape) carries the layer's sliding window: every ring step masks the keys
//    outside it (by their position in the sequence), and flops count the window's pairs. Under
//    cp > 1 a windowed layer runs only the ring steps whose chunks the window reaches (the
//    rank's own and the ceil((window - 1) / chunk) before it, at most cp), each priced (as
//    without a window) as a causal chunk of its own, now windowed; after the last step the K/V
//    gradients go home cp - steps + 1 ranks on.
//  * multi-head latent attention: the down-projections (q_down, kv_down) and the latent norms
//    act on the norm region's rows; kv_norm is a norm whose weight covers the first kv_lora
//    columns of its input [rows x (kv_lora + rope)]: it reads {kv latent, weight} and writes
//    {normed latent, rotary key} (the last rope columns passed through), and backward reads
//    {kv latent, normed latent's gradient, rotary key's gradient, weight} and writes {the kv
//    latent's gradient, weight gradient}. The normed latents and the rotary key are all-gathered
//    under SP (f) before the up-projections; a kResidualAdd "qkv.pack" reads {q (q_up or q's
//    output), kv_up's output, the rotary key} and writes "qkv": Q with RoPE on each head's last
//    rope columns, K per head (kv_up's first nope columns of the head | the rotated rotary key),
//    V per head (kv_up's last v_head_dim columns of the head); backward "qkv.unpack" reads
//    {dqkv} and writes {dq, d kv_up output, d rotary key (summed over the heads)}, RoPE undone.
//    The backward recomputes the latent norms from the saved latents (ops in Phase::kRecompute)
//    for the up-projections' weight gradients; kv_down's data gradient adds to q_down's (its
//    GEMM reads the gradient it adds to, as router.dx does).
//  * shared experts: a dense MLP (shared_fc1, shared_act, shared_fc2, with tp's f and g) on the
//    norm2 output, added to the routed experts' output by a kResidualAdd "moe.add" reading {routed,
//    shared} (forward; backward it adds their input gradients); the residual after the MLP block
//    adds shared_fc2's bias (as it adds fc2's). A dense layer (moe.first_dense) has the plain MLP.
//  * MoE routing: each rank routes the rows of its norm region (its sequence shard under SP),
//    except with an expert grid of its own (etp != tp), where each rank routes 1/tp of its TP
//    group's rows: its sequence shard under SP, else rows [r T/tp, (r + 1) T/tp) of the
//    replicated rows (r its TP index), which the router GEMM ("router", "router.dw"), the
//    dispatch and the combine's backward read from their [T x h] inputs; the routed output and
//    the dispatch gradient are then all-gathered over tp ("moe.ag", "ln2.dy.ag") and the
//    router's gradient is summed over tp like SP's partial gradients. The routed rows are
//    all-gathered over the experts' TP group ("disp.ag": kTp under SP, kExpertTp with an expert
//    grid and etp > 1) before the expert GEMMs and reduce-scattered back after them (tp > 1
//    without SP and without an expert grid: all-reduced in place).
//  * kLinear reads {input, weight[, bias]} and writes {output} forward; backward_data GEMMs
//    read {output grad, weight} and write {input grad}; weight-gradient GEMMs read {input,
//    output grad} and write {weight grad[, bias grad]}, accumulating over micro-batches. The
//    bias of a row-parallel GEMM is added by the residual (Megatron's bias-dropout-add), whose
//    backward writes its gradient; no kBias ops are emitted.
//  * gradients: ZeRO applies to a bucket (a layer's dense or expert weights, the embedding,
//    the head) whose reduction group has more than one rank; ZeRO 0/1 reduce after the
//    bucket's last micro-batch (or before the optimizer when plan.overlap_grad_reduce is
//    false), ZeRO 2 and ZeRO-3 resharded after the forward or the backward reduce-scatter
//    every micro-batch (each micro-batch's gradients into a fresh block that the
//    reduce-scatter adds to the persistent shard); ZeRO-3 resharded after the step accumulates
//    the step's gradients unsharded in one fp32 block (not persistent: from the first backward
//    to the reduction) and reduce-scatters it into the shard once, like ZeRO 0/1. Under SP the
//    norm, router and row-parallel bias gradients ("sp.g.ar") are all-reduced over TP before
//    the optimizer (ZeRO 2/3: before each reduce-scatter of their bucket). The gradient norm
//    is all-reduced over tp, pp, and dp-cp when gradients are sharded there (ZeRO >= 1 or
//    ep > 1). Tied embeddings with pp > 1 keep a copy on the last stage; their embedding-group
//    all-reduce is not emitted.
//  * data-parallel gradient reductions (all-reduce, reduce-scatter, and the HSDP replicas'
//    all-reduce) move plan.grad_reduce_dtype's bytes per element; the gradient buffers stay
//    fp32.
//  * HSDP (plan.shard_degree > 0): a bucket's `group` is Group::kDpShard (experts
//    kExpertShard), `ways` its size (Plan::dense_shard_ranks(), expert_shard_ranks()); ZeRO
//    gathers and reduce-scatters stay inside it, and after the step's last reduce-scatter one
//    kAllReduce on Group::kDpReplicate (kExpertReplicate) sums this rank's shard over the
//    replicas: of the shard buffer (ZeRO 2/3), or under ZeRO 1 of the bucket's flat gradient
//    block whose payload (bytes) is one shard: the range this rank reduce-scattered in place,
//    [index x shard, (index + 1) x shard) with index its position in the shard group. A shard
//    group of one rank leaves the bucket unsharded (ZeRO 0 over the whole group).
//  * ZeRO-3 gathers (kAllGather on the bucket's group into a per-use block) happen per use
//    when plan.reshard is kAfterForward (forward, recompute and backward each gather); once
//    per micro-batch in its forward, kept until that micro-batch's backward of the layer, when
//    kAfterBackward (under 1F1B several micro-batches' copies are live at once); once per step
//    at the first use, kept to the last, when kAfterStep (a buffer is freed after its last use:
//    the embedding's gathered table after its last forward, its backward reading no weights).
//  * ZeRO 1/2 gather the updated shards in place (kAllGather on the bucket's group, reading and
//    writing its weights) after the optimizer; under plan.overlap_param_gather (Megatron's
//    --overlap-param-gather) instead in the forward, once a step, before the bucket's first use
//    and one use ahead as the ZeRO-3 gathers (the last step's update: a Program is the steady
//    state), unless the optimizer or the parameters live in host memory.
//  * the weights of a bucket, its gradients, its per-micro-batch gradients (ZeRO 2/3) and each
//    use's gathered or prefetched copy are one Program::blocks entry (one allocation, padded
//    to ways x shard), so a collective over the list is a collective over a flat range;
//    Program::buckets describes every bucket and its persistent buffers.
//  * the vocab-parallel cross-entropy keeps, per micro-batch, this rank's logits in fp32
//    ("softmax"), the global row maximum ("ce.max") and the all-reduced [sum of exp(logit -
//    max); target logit] ("ce.sums"); the backward forms the softmax from them.
//  * token ids and labels are int32, stored in 4-byte buffers typed kFp32; dropout masks are
//    1-byte buffers typed kFp8.
//  * selective recompute: a layer keeps no output of its recomputed modules (core_attn, when
//    materialised: the probabilities, dropout mask and dropped probabilities; moe_act: the
//    experts' FC2 input; layernorm: an MoE layer's norm2 output; mla_up_proj: Q | K | V; mlp: a
//    dense layer's FC1 and activation outputs; moe: router probabilities, dispatched rows, expert
//    intermediates and outputs, shared-expert intermediates; shared_experts: the shared-expert
//    intermediates), and just before the layer's backward the modules' forward ops (their TP
//    collectives and expert all-to-alls included) run again in Phase::kRecompute from the kept
//    inputs, into fresh buffers that the backward reads.
//  * a layer's saved activations are exactly those of cost::layer_activation_bytes (norm
//    inputs, QKV input, MLA's pre-norm latents, Q/K/V, attention output, softmax statistics or
//    probabilities, dropout masks, MLP and shared-expert intermediates; only the layer input
//    under full recompute), except that MoE layers also keep the expert outputs for the router
//    gradient and route sequence-parallel tokens over the TP group, and with an expert grid
//    each rank routes 1/tp of the tokens (see tests/core/liveness_test.cc for the known
//    differences).
#pragma once

#include <vector>

#include "core/cluster.h"
#include "core/model.h"
#include "core/plan.h"
#include "core/program.h"
#include "core/rank_layout.h"

namespace parasol {

struct LoweredPlan {
  Plan plan;
  RankLayout layout;
  std::vector<Program> programs;  // one per pipeline stage, programs[s].stage == s

  // The Program rank `rank` executes. REQUIRES: 0 <= rank < layout.world().
  const Program& program_of(int rank) const;
};

// The Programs of one training step of `plan`.
// REQUIRES: validate(plan, model, cluster) passed.
LoweredPlan lower(const Model& model, const Cluster& cluster, const Plan& plan);

// The Program of pipeline stage `stage` alone on `device` (what lower() puts in programs[stage]
// for a cluster of that device). The device changes the Program only through the facts
// core/fp8_params.h reads (fp8_weight_transpose_kept: Plan::fp8_param_gather's weight
// transposes).
// REQUIRES: validate(plan, model, cluster) passed and 0 <= stage < plan.pp.
Program lower_stage(const Model& model, const Plan& plan, int stage, const DeviceSpec& device);
// The same on a device whose fp8 GEMMs take TN operands only (every NVIDIA GPU before Blackwell,
// the H100 taken here: each fp8 weight keeps its transpose); any device for a plan without
// Plan::fp8_param_gather.
Program lower_stage(const Model& model, const Plan& plan, int stage);

// One decoder layer of a plan for one micro-batch on one rank: the layer's ops as lower_stage()
// emits them in a stage (its forward, then the plan's selectively recomputed modules and its
// backward), without the pipeline, data-parallel, ZeRO, offload and optimizer ops around it and
// without full recompute; the layer's input and its output's gradient are buffers no op writes.
// Under plan.ep_comm_overlap with expert all-to-alls to overlap, micro-batch 0's backward is
// interleaved with micro-batch 1's forward (Megatron's combined 1F1B, as lower() interleaves
// units) and micro-batch 0's forward comes first, outside the passes. The closed-form estimate
// prices a plan's layers from their fragments (cost_models/layer_fragment.h).
struct LayerFragment {
  Program program;
  // The ops' passes, each a range [begin, end) of program.ops that starts once the one before
  // it has ended (a layer's forward output feeds the next layer; its backward waits for the
  // gradient): forward and backward, or one pass of the interleaved pair.
  struct Pass {
    int begin = 0, end = 0;
  };
  std::vector<Pass> passes;
  // The layer's dense parameter modules in forward order as DeepSpeed ZeRO-3 fetches them (the
  // dense bucket's specs: a weight with the bias slots after it, a norm alone; the order of
  // core/gather_units.h dense_layer_weights): each module's weight buffer ids in `program`.
  std::vector<std::vector<int>> modules;
};

// The fragment's weights are those of a device that keeps fp8 weight transposes (as the
// three-argument lower_stage); no op reads a transpose, so the fragment's ops and prices are
// every device's.
// REQUIRES: validate(plan, model, cluster) passed and 0 <= layer < model.layers.
LayerFragment lower_layer_fragment(const Model& model, const Plan& plan, int layer);

}  // namespace parasol
