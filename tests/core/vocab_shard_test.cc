// core/vocab_shard.h: the vocabulary split tp ways is ceil(vocab / tp), and the lowering's head
// GEMM (the output layer's columns on this rank) and embedding table hold that many rows.
#include "core/vocab_shard.h"

#include <gtest/gtest.h>

#include "core/lower.h"
#include "core/plan.h"

namespace parasol {
namespace {

TEST(VocabShard, CeilingOfTheVocabularyOverTp) {
  const Model m = model_preset("gpt2-124m");
  ASSERT_EQ(m.vocab, 50257);  // divides by no tp > 1
  EXPECT_EQ(vocab_shard(m, 1), 50257);
  EXPECT_EQ(vocab_shard(m, 2), 25129);  // floor would be 25128
  EXPECT_EQ(vocab_shard(m, 4), 12565);
  EXPECT_EQ(vocab_shard(m, 8), 6283);
}

TEST(VocabShard, TheLoweredHeadHasTheShardsColumns) {
  const Model m = model_preset("gpt2-124m");
  Plan p;
  p.tp = 4;
  p.micro_batch = 1;
  p.global_batch = 1;
  const Program prog = lower_stage(m, p, 0);
  int heads = 0;
  for (const Op& op : prog.ops) {
    if (op.role != OpRole::kHead) continue;
    ++heads;
    EXPECT_EQ(op.n, vocab_shard(m, 4)) << op.name;
  }
  EXPECT_EQ(heads, 1);
}

}  // namespace
}  // namespace parasol
