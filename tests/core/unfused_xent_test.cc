// Tests of Megatron's unfused vocab-parallel loss (core/unfused_xent.h): the kernels' bytes per
// logit as Megatron-LM's cross_entropy.py moves them, and the lowering that emits them as ops
// (core/lower_edges.cc) in place of the fused loss's, the executor's three keeping their roles.
#include "core/unfused_xent.h"

#include <gtest/gtest.h>

#include "core/lower.h"
#include "tests/core/test_models.h"

namespace parasol {
namespace {

double logit_bytes(Phase ph, double eb) {
  double b = 0;
  for (const XentKernel& k : unfused_xent_kernels(ph, eb)) b += k.logit_bytes;
  return b;
}

int stands_for(Phase ph, XentStandsFor s) {
  int n = 0;
  for (const XentKernel& k : unfused_xent_kernels(ph, 2)) n += k.stands_for == s;
  return n;
}

// Forward: .float() (2 + 4), max (4), -= (8), exp (8), sum (4), div_ (8) = 38 bytes a bf16 logit;
// backward: mul_ (8) and the engine's cast back (4 + 2) = 14. fp32 logits take no copy and no
// cast back: the mul_ writes their gradient (8 bytes a logit).
TEST(UnfusedXent, BytesPerLogitAsMegatronMovesThem) {
  EXPECT_DOUBLE_EQ(logit_bytes(Phase::kForward, 2), 38);
  EXPECT_DOUBLE_EQ(logit_bytes(Phase::kBackward, 2), 14);
  EXPECT_DOUBLE_EQ(logit_bytes(Phase::kForward, 4), 32);  // 38 less the upcast's 2 + 4
  EXPECT_DOUBLE_EQ(logit_bytes(Phase::kBackward, 4), 8);  // 14 less the cast's 4 + 2
  EXPECT_EQ(unfused_xent_kernels(Phase::kForward, 4).size() + 1,
            unfused_xent_kernels(Phase::kForward, 2).size());
  EXPECT_EQ(unfused_xent_kernels(Phase::kBackward, 4).size() + 1,
            unfused_xent_kernels(Phase::kBackward, 2).size());
  // fp32: the mul_ stands for the fused gradient, issued from Python like the rest.
  for (const XentKernel& k : unfused_xent_kernels(Phase::kBackward, 4)) {
    EXPECT_TRUE(k.python) << k.name;
    EXPECT_EQ(k.stands_for == XentStandsFor::kGradient, std::string(k.name) == "scale") << k.name;
  }
  // One kernel stands for each op the executor runs; only the engine's cast is not Python.
  EXPECT_EQ(stands_for(Phase::kForward, XentStandsFor::kMax), 1);
  EXPECT_EQ(stands_for(Phase::kForward, XentStandsFor::kSums), 1);
  EXPECT_EQ(stands_for(Phase::kForward, XentStandsFor::kGradient), 0);
  EXPECT_EQ(stands_for(Phase::kBackward, XentStandsFor::kGradient), 1);
  for (Phase ph : {Phase::kForward, Phase::kBackward})
    for (const XentKernel& k : unfused_xent_kernels(ph, 2))
      EXPECT_EQ(k.python, k.stands_for != XentStandsFor::kGradient) << k.name;
}

struct LossOps {
  int forward = 0, backward = 0, unfused = 0, max = 0;
  double bytes = 0;
};

LossOps loss_ops(const Program& prog) {
  LossOps n;
  for (const Op& op : prog.ops) {
    if (op.kind != OpKind::kCrossEntropy) continue;
    (op.tags.phase == Phase::kBackward ? n.backward : n.forward) += 1;
    n.unfused += op.role == OpRole::kXentUnfused;
    n.max += op.role == OpRole::kXentMax;
    n.bytes += op.bytes;
  }
  return n;
}

TEST(UnfusedXent, LoweredKernelByKernelInPlaceOfTheFusedLoss) {
  const Model m = test_models::tiny_gpt();
  for (int tp : {1, 2}) {
    SCOPED_TRACE(tp);
    Plan p;
    p.tp = tp;
    p.dp = 1;
    p.micro_batch = 1;
    p.global_batch = 2;  // two micro-batches
    p.precision = Dtype::kBf16;
    const LossOps fused = loss_ops(lower_stage(m, p, 0));
    EXPECT_EQ(fused.forward, 2 * 2);
    EXPECT_EQ(fused.backward, 2 * 1);
    EXPECT_EQ(fused.unfused, 0);
    p.cross_entropy_loss_fusion = false;
    const LossOps unfused = loss_ops(lower_stage(m, p, 0));
    const int fwd = static_cast<int>(unfused_xent_kernels(Phase::kForward, 2).size());
    const int bwd = static_cast<int>(unfused_xent_kernels(Phase::kBackward, 2).size());
    EXPECT_EQ(unfused.forward, 2 * fwd);
    EXPECT_EQ(unfused.backward, 2 * bwd);
    EXPECT_EQ(unfused.max, 2);
    EXPECT_EQ(unfused.unfused, 2 * (fwd + bwd - 3));
    // 38 + 14 bytes a logit against the fused loss's 8 + 6, and the per-token kernels.
    const double logits = 2.0 * p.micro_batch * m.seq_len * (m.vocab / tp);
    EXPECT_GT(unfused.bytes, fused.bytes + (52 - 14) * logits * 0.99);
    EXPECT_LT(unfused.bytes, fused.bytes + (52 - 14) * logits * 1.05);
    // fp32 logits: no upcast forward, no cast back backward (32 + 8 bytes a logit).
    Plan p32 = p;
    p32.precision = Dtype::kFp32;
    const LossOps fp32 = loss_ops(lower_stage(m, p32, 0));
    const int fwd32 = static_cast<int>(unfused_xent_kernels(Phase::kForward, 4).size());
    const int bwd32 = static_cast<int>(unfused_xent_kernels(Phase::kBackward, 4).size());
    EXPECT_EQ(fp32.forward, 2 * fwd32);
    EXPECT_EQ(fp32.backward, 2 * bwd32);
    EXPECT_EQ(fp32.unfused, 2 * (fwd32 + bwd32 - 3));
    // The eager and the tiled loss take precedence over the switch.
    p.eager_loss = true;
    EXPECT_EQ(loss_ops(lower_stage(m, p, 0)).unfused, 0);
    p.eager_loss = false;
    p.tiled_loss = true;
    EXPECT_EQ(loss_ops(lower_stage(m, p, 0)).unfused, 0);
  }
}

}  // namespace
}  // namespace parasol
