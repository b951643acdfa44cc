// The edges of the model: the vocab-parallel embedding (first virtual stage), the final norm,
// the head GEMM and Megatron's vocab-parallel cross-entropy (last virtual stage), forward and
// backward.
#include "core/lower_internal.h"
#include "core/unfused_xent.h"

namespace parasol::lowering {

// FSDP2 does not reshard the root module's parameter group after the forward
// (torch/distributed/fsdp/_fully_shard/_fsdp_state.py FSDPState._lazy_init: the root's
// post_forward_mesh_info = None, "the parameters would be freed and all-gathered immediately"); it
// reshards at its post-backward. torchtitan leaves the embedding in the root group (9dec370
// parallelisms/parallelize_llama.py apply_fsdp: fully_shard per TransformerBlock, then
// fully_shard(model)): its gathered table stays from the forward to the embedding's backward,
// which does not read it. Resharded after the step it is held for the step anyway.
bool Lowerer::fsdp2_root_held() const {
  return p_.fsdp_impl == FsdpImpl::kFsdp2 && buckets_[emb_bucket_].zero >= 3 &&
         p_.reshard != Reshard::kAfterStep;
}

int Lowerer::embedding_forward(int mb) {
  at(-1, Phase::kForward);
  WSet w = no_weights();
  acquire(buckets_[emb_bucket_], w, -1);
  EdgeSaved& es = emb_saved_[mb];
  if (fsdp2_root_held()) {
    es.table = w[kTable];
    es.pos = w[kPos];
  }
  es.tokens = role(BufferRole::kTokens, buffer(name(-1, "tokens", mb), {p_.micro_batch, Sl_},
                                               Dtype::kFp32, BufferClass::kActivation));
  int emb = act(-1, "emb", {T_, h_});
  elementwise(OpKind::kEmbedding, -1, "emb", double(T_) * h_, 2 * eb_ * T_ * h_,
              {es.tokens, w[kTable], w[kPos]}, {emb});
  int x = tp_reduce_out(-1, emb, T_, "emb.tp");
  if (m_.dropout) {
    int out = act(-1, "emb.out", {Tn_, h_});
    es.mask = act(-1, "emb.mask", {Tn_, h_}, Dtype::kFp8);
    role(OpRole::kEmbeddingDropout,
         elementwise(OpKind::kResidualAdd, -1, "emb.drop", double(Tn_) * h_,
                     (2 * eb_ + 1) * Tn_ * h_, {x}, {out, es.mask}));
    x = out;
  }
  return x;
}

void Lowerer::embedding_backward(int mb, int dy) {
  // Under LoRA the embedding is frozen and nothing before it needs a gradient: autograd runs none
  // of its backward.
  if (p_.lora()) return;
  at(-1, Phase::kBackward);
  EdgeSaved& es = emb_saved_[mb];
  if (es.mask >= 0) {
    int d = act(-1, "emb.dx", {Tn_, h_});
    role(OpRole::kEmbeddingDropout,
         elementwise(OpKind::kResidualAdd, -1, "emb.drop", double(Tn_) * h_,
                     2 * (2 * eb_ + 1) * Tn_ * h_, {dy, es.mask}, {d}));
    dy = d;
  }
  int full = tp_gather_in(-1, dy, T_);
  Bucket& b = buckets_[emb_bucket_];
  WSet g = unit_grads(b);
  // Under FSDP2 the op also lists the held table (fsdp2_root_held): the gathered copy is freed
  // after it, not after the forward; the executor does not read it.
  elementwise(OpKind::kEmbedding, -1, "emb", double(T_) * h_, 3 * eb_ * T_ * h_,
              {full, es.tokens, es.table, es.pos}, {g[kTable], g[kPos]});
}

void Lowerer::head_forward(int x, int mb) {
  at(-1, Phase::kForward);
  WSet w = no_weights();
  acquire(buckets_[head_bucket_], w, -1);
  if (w[kHead] < 0) acquire(buckets_[emb_bucket_], w, -1);
  const int head = w[kHead] >= 0 ? w[kHead] : w[kTable];
  EdgeSaved& hs = head_saved_[mb];
  hs.x = x;
  hs.xf = act(-1, "lnf", {Tn_, h_});
  elementwise(OpKind::kNorm, -1, "lnf", double(Tn_) * h_, 2 * eb_ * Tn_ * h_, {x, w[kFnorm]},
              {hs.xf});
  int in = tp_gather_in(-1, hs.xf, T_);
  // The tiled loss (plan.tiled_loss) reads the logits again in its backward: saved, as the
  // fused loss's softmax is.
  int logits = tiled_loss() ? act(-1, "logits", {T_, vocab_t_}) : ws(-1, "logits", {T_, vocab_t_});
  role(OpRole::kHead, gemm(-1, "head", T_, vocab_t_, h_, 1, {in, head}, {logits}));
  hs.logits = logits;
  cross_entropy_forward(logits, mb);
}

// Vocab-parallel loss (Megatron): the row maximum is reduced with max over TP first, then the
// shifted sum of exponentials and the target logit with a sum; the backward normalises the
// exponentials by the global sum.
void Lowerer::cross_entropy_forward(int logits, int mb) {
  EdgeSaved& hs = head_saved_[mb];
  hs.labels = role(BufferRole::kLabels, buffer(name(-1, "labels", mb), {p_.micro_batch, Sl_},
                                               Dtype::kFp32, BufferClass::kActivation));
  // The vocab-tiled loss (plan.tiled_loss) keeps no softmax: its backward reads the logits.
  hs.probs = tiled_loss() ? -1 : act(-1, "softmax", {T_, vocab_t_}, Dtype::kFp32);
  hs.row_max = act(-1, "ce.max", {T_}, Dtype::kFp32);
  const int row_max = hs.row_max;
  const double elements = double(T_) * vocab_t_;
  // Eager PyTorch (plan.eager_loss: torchtitan's F.cross_entropy(pred.float(), labels), the
  // logits freed by `del pred` only after the loss): the logits upcast to an fp32 copy, which
  // the log-softmax reads and writes its fp32 output beside; the bf16 logits stay alive until
  // then. Megatron's fused kernel reads the logits in place.
  const int bf16_logits = logits;
  double in_bytes = eb_;
  if (p_.eager_loss) {
    const int upcast = ws(-1, "logits.fp32", {T_, vocab_t_}, Dtype::kFp32);
    elementwise(OpKind::kCrossEntropy, -1, "xent.upcast", elements, (eb_ + 4) * elements, {logits},
                {upcast});
    logits = upcast;
    in_bytes = 4;
  }
  if (!p_.unfused_loss())
    role(OpRole::kXentMax, elementwise(OpKind::kCrossEntropy, -1, "xent.max", elements,
                                       in_bytes * elements, {logits}, {row_max}));
  if (p_.unfused_loss()) return unfused_loss_forward(logits, mb);
  if (t_ > 1) {
    const int op =
        collective(OpKind::kAllReduce, Group::kTp, -1, "xent.max.ar", 4.0 * T_, row_max, row_max);
    P_.ops[op].reduce_max = true;
  }
  hs.sums = act(-1, "ce.sums", {2, T_}, Dtype::kFp32);
  const double xent_bytes = (in_bytes + 4) * elements;
  int loss = p_.eager_loss
                 ? elementwise(OpKind::kCrossEntropy, -1, "xent", elements, xent_bytes,
                               {logits, hs.labels, row_max, bf16_logits}, {hs.probs, hs.sums})
             : tiled_loss()  // the sums from the logits in their dtype, nothing logits-sized out
                 ? elementwise(OpKind::kCrossEntropy, -1, "xent", elements, in_bytes * elements,
                               {logits, hs.labels, row_max}, {hs.sums})
                 : elementwise(OpKind::kCrossEntropy, -1, "xent", elements, xent_bytes,
                               {logits, hs.labels, row_max}, {hs.probs, hs.sums});
  if (t_ > 1)
    loss = collective(OpKind::kAllReduce, Group::kTp, -1, "xent.ar", 8.0 * T_, hs.sums, hs.sums);
  if (p_.nan_check) nan_check(loss);
}

// Composer's train metrics (Plan::loss_metric_passes): after the micro-batch's backward each
// metric's update runs torch.nn.CrossEntropyLoss(reduction='sum') on the logits the trainer kept
// (state.outputs) under autocast, which upcasts them to fp32 (a copy) for the log-softmax (fp32
// in and out) and the NLL sum; then the count of the targets kept and the metric's two running
// sums (composer/metrics/nlp.py LanguageCrossEntropy.update, composer/trainer/trainer.py
// _eval_train_metrics @v0.17.2).
void Lowerer::loss_metrics(int mb) {
  const EdgeSaved& hs = head_saved_[mb];
  if (p_.loss_metric_passes <= 0 || hs.logits < 0) return;
  const double n = double(T_) * vocab_t_;
  for (int i = 0; i < p_.loss_metric_passes; ++i) {
    const int up = ws(-1, "metric.fp32", {T_, vocab_t_}, Dtype::kFp32);
    elementwise(OpKind::kCrossEntropy, -1, "metric.upcast", n, (eb_ + 4) * n, {hs.logits}, {up});
    const int lsm = ws(-1, "metric.lsm", {T_, vocab_t_}, Dtype::kFp32);
    elementwise(OpKind::kCrossEntropy, -1, "metric.xent", n, 8 * n, {up}, {lsm});
    const int sum = ws(-1, "metric.sum", {2}, Dtype::kFp32);
    elementwise(OpKind::kCrossEntropy, -1, "metric.nll", double(T_), 4.0 * T_ + 8.0 * T_,
                {lsm, hs.labels}, {sum});
  }
}

// Megatron's unfused loss (Plan::cross_entropy_loss_fusion off): its kernels in issue order
// (core/unfused_xent.h). The three that stand for the fused loss's ops carry those ops' reads
// and writes (the executor runs the loss's arithmetic there); the others are ops of their own
// (OpRole::kXentUnfused) on the fp32 copy of the logits that becomes the saved softmax (hs.probs)
// or on the per-token sums; the TP all-reduces of the row maximum and of the sums follow the max
// and the sum (Megatron reduces the target logits and the sums in two calls, lowered as one).
void Lowerer::unfused_loss_forward(int logits, int mb) {
  EdgeSaved& hs = head_saved_[mb];
  hs.sums = act(-1, "ce.sums", {2, T_}, Dtype::kFp32);
  const double elements = double(T_) * vocab_t_;
  int last = -1;
  for (const XentKernel& k : unfused_xent_kernels(Phase::kForward, eb_)) {
    const std::string nm = std::string("xent.") + k.name;
    const double bytes = k.logit_bytes * elements + k.token_bytes * T_;
    const double n = k.logit_bytes > 0 ? elements : double(T_);
    if (k.stands_for == XentStandsFor::kMax) {
      role(OpRole::kXentMax,
           elementwise(OpKind::kCrossEntropy, -1, nm.c_str(), n, bytes, {logits}, {hs.row_max}));
      if (t_ > 1) {
        const int op = collective(OpKind::kAllReduce, Group::kTp, -1, "xent.max.ar", 4.0 * T_,
                                  hs.row_max, hs.row_max);
        P_.ops[op].reduce_max = true;
      }
    } else if (k.stands_for == XentStandsFor::kSums) {
      elementwise(OpKind::kCrossEntropy, -1, nm.c_str(), n, bytes, {logits, hs.labels, hs.row_max},
                  {hs.probs, hs.sums});
      if (t_ > 1)
        collective(OpKind::kAllReduce, Group::kTp, -1, "xent.ar", 8.0 * T_, hs.sums, hs.sums);
    } else {
      const int buf = k.logit_bytes > 0 ? hs.probs : hs.sums;
      last = role(OpRole::kXentUnfused,
                  elementwise(OpKind::kCrossEntropy, -1, nm.c_str(), n, bytes,
                              {k.logit_bytes > 0 ? logits : hs.labels, buf}, {buf}));
    }
  }
  if (p_.nan_check) nan_check(last);
}

// Its backward's kernels before the cast back to the logits' dtype, which stands for the fused
// loss's gradient op.
void Lowerer::unfused_loss_backward(int dlogits, int mb) {
  const EdgeSaved& hs = head_saved_[mb];
  const double elements = double(T_) * vocab_t_;
  for (const XentKernel& k : unfused_xent_kernels(Phase::kBackward, eb_)) {
    const std::string nm = std::string("xent.") + k.name;
    const double bytes = k.logit_bytes * elements + k.token_bytes * T_;
    const double n = k.logit_bytes > 0 ? elements : double(T_);
    if (k.stands_for == XentStandsFor::kGradient) {
      elementwise(OpKind::kCrossEntropy, -1, "xent", n, bytes,
                  {hs.probs, hs.labels, hs.sums, hs.row_max}, {dlogits});
    } else {
      role(OpRole::kXentUnfused, elementwise(OpKind::kCrossEntropy, -1, nm.c_str(), n, bytes,
                                             {hs.labels, hs.sums, hs.probs}, {hs.probs}));
    }
  }
}

void Lowerer::nan_check(int loss) {
  host_sync("loss.nan_check", {loss});
  host_sync("loss.inf_check", {loss});
}

int Lowerer::head_backward(int mb) {
  at(-1, Phase::kBackward);
  EdgeSaved& hs = head_saved_[mb];
  int dlogits = ws(-1, "dlogits", {T_, vocab_t_});
  const double elements = double(T_) * vocab_t_;
  if (p_.eager_loss) {
    // Eager autograd: nll_loss_backward's fp32 gradient (zeros, the targets set), then
    // log_softmax_backward's fp32 gradient from it and the saved log-softmax output (three
    // logits-sized fp32 tensors at once; four under TP, below), then the cast back to the
    // logits' dtype.
    const int dnll = ws(-1, "xent.dnll", {T_, vocab_t_}, Dtype::kFp32);
    elementwise(OpKind::kCrossEntropy, -1, "xent.dnll", elements, 4 * elements, {hs.labels},
                {dnll});
    const int dlogits32 = ws(-1, "dlogits.fp32", {T_, vocab_t_}, Dtype::kFp32);
    if (t_ > 1) {
      // Under TP, PyTorch's loss_parallel (torchtitan with tensor parallelism) fuses the two
      // gradients in one function (torch/distributed/tensor/parallel/loss.py,
      // _nll_loss_and_log_softmax_backward): `(grad_input + torch.exp(x)) * grad_output` with
      // the saved log-softmax x and the NLL gradient grad_input alive, so the sum and the
      // product are a fourth logits-sized fp32 tensor each at once.
      const int ex = ws(-1, "xent.exp", {T_, vocab_t_}, Dtype::kFp32);
      elementwise(OpKind::kCrossEntropy, -1, "xent.exp", elements, 8 * elements, {hs.probs}, {ex});
      const int sum = ws(-1, "xent.add", {T_, vocab_t_}, Dtype::kFp32);
      elementwise(OpKind::kCrossEntropy, -1, "xent.add", elements, 12 * elements, {dnll, ex},
                  {sum});
      elementwise(OpKind::kCrossEntropy, -1, "xent", elements, 8 * elements,
                  {sum, hs.probs, hs.labels, hs.sums, hs.row_max, dnll}, {dlogits32});
    } else {
      elementwise(OpKind::kCrossEntropy, -1, "xent", elements, 12 * elements,
                  {hs.probs, hs.labels, hs.sums, hs.row_max, dnll}, {dlogits32});
    }
    elementwise(OpKind::kCrossEntropy, -1, "xent.downcast", elements, (4 + eb_) * elements,
                {dlogits32}, {dlogits});
  } else if (p_.unfused_loss()) {
    unfused_loss_backward(dlogits, mb);
  } else if (tiled_loss()) {  // the gradient from the saved logits, in their dtype
    elementwise(OpKind::kCrossEntropy, -1, "xent", elements, 2 * eb_ * elements,
                {hs.logits, hs.labels, hs.sums, hs.row_max}, {dlogits});
  } else {
    elementwise(OpKind::kCrossEntropy, -1, "xent", elements, (4 + eb_) * elements,
                {hs.probs, hs.labels, hs.sums, hs.row_max}, {dlogits});
  }
  WSet w = no_weights();
  acquire(buckets_[head_bucket_], w, -1);
  const bool own = w[kHead] >= 0;
  if (!own) acquire(buckets_[emb_bucket_], w, -1);
  const int head = own ? w[kHead] : w[kTable];
  int in = tp_gather_in(-1, hs.xf, T_);
  int dxp = ws(-1, "head.dx", {T_, h_});
  gemm(-1, "head.dx", T_, h_, vocab_t_, 1, {dlogits, head}, {dxp}, true);
  int dxf = tp_reduce_out(-1, dxp, T_, "head.dx.tp");
  WSet g = unit_grads(buckets_[head_bucket_]);
  const int ghead = own ? g[kHead] : unit_grads(buckets_[emb_bucket_])[kTable];
  if (ghead >= 0)  // not under LoRA: the head is frozen
    main_grad_add(role(OpRole::kWeightGrad,
                       gemm(-1, "head.dw", h_, vocab_t_, T_, 1, {in, dlogits}, {ghead})));
  int dy = act(-1, "lnf.dx", {Tn_, h_});
  elementwise(OpKind::kNorm, -1, "lnf", double(Tn_) * h_, 4 * eb_ * Tn_ * h_,
              {hs.x, dxf, w[kFnorm]}, {dy, g[kFnorm]});
  return dy;
}

}  // namespace parasol::lowering
