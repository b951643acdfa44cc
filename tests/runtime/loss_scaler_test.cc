// LossScaler (runtime/loss_scaler.h) against Megatron-LM's DynamicGradScaler rule, written out
// step by step here: back-off after `hysteresis` overflows (floored at min_scale), growth after
// growth_interval finite steps in a row (an overflow restarts the count), hysteresis restored on
// growth; disabled means a scale of 1 that never moves; bad configs and states name their field.
#include "runtime/loss_scaler.h"

#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "core/error.h"

namespace parasol::runtime {
namespace {

LossScalerConfig config(double initial, int64_t interval, int hysteresis, double min_scale = 1) {
  LossScalerConfig c;
  c.enabled = true;
  c.initial_scale = initial;
  c.growth_interval = interval;
  c.hysteresis = hysteresis;
  c.min_scale = min_scale;
  return c;
}

TEST(LossScaler, BacksOffOnOverflowAndGrowsAfterTheInterval) {
  LossScaler s(config(1024, 3, 1));
  EXPECT_EQ(s.scale(), 1024);
  s.update(true);
  EXPECT_EQ(s.scale(), 512);
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 512);
  s.update(true);  // restarts the count
  EXPECT_EQ(s.scale(), 256);
  for (int i = 0; i < 2; ++i) s.update(false);
  EXPECT_EQ(s.scale(), 256);
  s.update(false);  // the third finite step in a row
  EXPECT_EQ(s.scale(), 512);
  EXPECT_EQ(s.state().growth_tracker, 0);
}

TEST(LossScaler, HysteresisDelaysTheBackOffUntilTheNextGrowth) {
  LossScaler s(config(64, 2, 2));
  s.update(true);  // first overflow: kept
  EXPECT_EQ(s.scale(), 64);
  s.update(false);
  s.update(true);  // the second (not in a row: Megatron counts down until a growth)
  EXPECT_EQ(s.scale(), 32);
  s.update(true);  // and every one after, until a growth restores the hysteresis
  EXPECT_EQ(s.scale(), 16);
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 32);
  EXPECT_EQ(s.state().hysteresis_tracker, 2);
  s.update(true);
  EXPECT_EQ(s.scale(), 32);
}

TEST(LossScaler, NeverBelowTheMinimum) {
  LossScaler s(config(4, 1000, 1, 2));
  s.update(true);
  s.update(true);
  s.update(true);
  EXPECT_EQ(s.scale(), 2);
}

TEST(LossScaler, DisabledIsOneAndStill) {
  LossScalerConfig c;
  LossScaler s(c);
  EXPECT_FALSE(s.enabled());
  EXPECT_EQ(s.scale(), 1);
  s.update(true);
  EXPECT_EQ(s.scale(), 1);
}

TEST(LossScaler, RestoresAStateAndRefusesImpossibleOnes) {
  LossScaler s(config(1024, 10, 2));
  LossScalerState st;
  st.scale = 256;
  st.growth_tracker = 9;
  st.hysteresis_tracker = 1;
  s.restore(st);
  s.update(false);
  EXPECT_EQ(s.scale(), 512);
  for (auto bad : std::vector<LossScalerState>{{0.5, 0, 1},
                                               {std::numeric_limits<double>::infinity(), 0, 1},
                                               {256, 10, 1},
                                               {256, -1, 1},
                                               {256, 0, 3}})
    EXPECT_THROW(s.restore(bad), Error);
}

TEST(LossScaler, BadConfigsNameTheirField) {
  auto field_of = [](LossScalerConfig c) {
    try {
      LossScaler s(c);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  LossScalerConfig c = config(1024, 10, 1);
  c.backoff_factor = 1;
  EXPECT_NE(field_of(c).find("loss_scaling.backoff_factor"), std::string::npos);
  c = config(0, 10, 1);
  EXPECT_NE(field_of(c).find("loss_scaling.initial_scale"), std::string::npos);
  c = config(1024, 0, 1);
  EXPECT_NE(field_of(c).find("loss_scaling.growth_interval"), std::string::npos);
  c = config(1024, 10, 0);
  EXPECT_NE(field_of(c).find("loss_scaling.hysteresis"), std::string::npos);
  c = config(1024, 10, 1, 2048);
  EXPECT_NE(field_of(c).find("loss_scaling.min_scale"), std::string::npos);
  c = config(1024, 10, 1);
  c.growth_factor = 0.5;
  EXPECT_NE(field_of(c).find("loss_scaling.growth_factor"), std::string::npos);
}

}  // namespace
}  // namespace parasol::runtime
