// The fused attention route (runtime/fused_attention.h): where it sends a call to a fused SDPA
// kernel, the mask that kernel applies (cuDNN's diagonal band, SdpaMask::keeps) keeps exactly the
// keys the runtime's attention sees (AttentionDims::first_key / last_key, the contract every
// backend's kernels implement), over every query and key of a grid of shapes, offsets and windows;
// where it refuses, the reason holds.
#include "runtime/fused_attention.h"

#include <gtest/gtest.h>

namespace parasol::runtime {
namespace {

AttentionDims dims(int64_t seq_q, int64_t seq_kv, bool causal, int64_t offset, int64_t window) {
  AttentionDims d;
  d.batch = 1;
  d.seq_q = seq_q;
  d.seq_kv = seq_kv;
  d.heads = 4;
  d.kv_heads = 2;
  d.head_dim = 64;
  d.ld_q = d.ld_o = 256;
  d.ld_kv = 128;
  d.causal = causal;
  d.causal_offset = offset;
  d.window = window;
  return d;
}

bool some_row_is_empty(const AttentionDims& d) {
  for (int64_t i = 0; i < d.seq_q; ++i)
    if (d.last_key(i) <= d.first_key(i)) return true;
  return false;
}

TEST(FusedAttention, TheBandKeepsExactlyTheVisibleKeys) {
  int fused = 0, refused = 0;
  for (bool causal : {true, false})
    for (int64_t seq_q : {1, 5, 16})
      for (int64_t seq_kv : {1, 7, 16, 24})
        for (int64_t offset = -20; offset <= 30; ++offset)
          for (int64_t window : {0, 1, 3, 8, 40}) {
            const AttentionDims d = dims(seq_q, seq_kv, causal, offset, window);
            SCOPED_TRACE(::testing::Message()
                         << "causal " << causal << " seq " << seq_q << "x" << seq_kv << " offset "
                         << offset << " window " << window);
            const SdpaRoute r = fused_attention_route(d, false);
            if (!r.refusal.empty()) {
              ++refused;
              // Refused only for an empty row or a window whose left edge passes the diagonal.
              EXPECT_TRUE(some_row_is_empty(d) || (causal && window > 0 && window <= offset))
                  << r.refusal;
              continue;
            }
            ++fused;
            EXPECT_FALSE(some_row_is_empty(d));
            for (int64_t i = 0; i < seq_q; ++i)
              for (int64_t j = 0; j < seq_kv; ++j)
                ASSERT_EQ(r.mask.keeps(i, j), d.first_key(i) <= j && j < d.last_key(i))
                    << "query " << i << " key " << j;
          }
  EXPECT_GT(fused, 0);
  EXPECT_GT(refused, 0);
}

TEST(FusedAttention, TheTrainingShapesAreFused) {
  // Causal self-attention of one chunk, with and without a sliding window: a band from the
  // diagonal; a ring step on an earlier chunk (every key visible): no mask.
  SdpaRoute self = fused_attention_route(dims(128, 128, true, 0, 0), false);
  EXPECT_EQ(self.refusal, "");
  EXPECT_TRUE(self.mask.band);
  EXPECT_EQ(self.mask.right_bound, 0);
  EXPECT_EQ(self.mask.left_bound, 0);
  SdpaRoute windowed = fused_attention_route(dims(128, 128, true, 0, 32), false);
  EXPECT_EQ(windowed.refusal, "");
  EXPECT_EQ(windowed.mask.left_bound, 32);
  SdpaRoute earlier = fused_attention_route(dims(128, 128, true, 128, 0), false);
  EXPECT_EQ(earlier.refusal, "");
  EXPECT_FALSE(earlier.mask.band);
}

TEST(FusedAttention, RefusalsNameTheirReason) {
  AttentionDims d = dims(16, 16, true, 0, 0);
  EXPECT_NE(fused_attention_route(d, true).refusal.find("probabilities"), std::string::npos);
  d.dropout_p = 0.1f;
  EXPECT_NE(fused_attention_route(d, false).refusal.find("dropout"), std::string::npos);
  d.dropout_p = 0;
  d.head_dim = 12;  // not a multiple of 8
  EXPECT_NE(fused_attention_route(d, false).refusal.find("head dim 12"), std::string::npos);
  d.head_dim = 64;
  d.v_head_dim = 264;  // past cuDNN's 256
  EXPECT_NE(fused_attention_route(d, false).refusal.find("head dim 264"), std::string::npos);
  d.v_head_dim = 0;
  d.causal_offset = -1;  // query 0 sees no key
  EXPECT_NE(fused_attention_route(d, false).refusal.find("sees no key"), std::string::npos);
}

}  // namespace
}  // namespace parasol::runtime
