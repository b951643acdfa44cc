// The three kinds of failure through the parasol executable (core/error.h): a user error exits 2
// and names the field; an internal error (a PARASOL_CHECK, here injected into the lowering with
// PARASOL_TEST_BREAK_LOWERING) exits 1 and says it is a parasol bug, with the check and its
// place; a system fault (a write to /dev/full) exits 1 and names the call. `search
// --simulate-top` lets an internal error through instead of demoting the plan.
#include <gtest/gtest.h>

#include <cstdlib>

#include "tests/tools/run_parasol.h"

namespace parasol {
namespace {

using testing_cli::run;

constexpr const char* kBreak = "PARASOL_TEST_BREAK_LOWERING=1 ";

TEST(FailureKinds, UserErrorExitsTwoAndNamesTheField) {
  const auto r = run("estimate --model llama3-8b --gpus 8 --tp 3");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("error: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tp"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("parasol bug"), std::string::npos) << r.out;
}

TEST(FailureKinds, InternalErrorExitsOneAndSaysItIsABug) {
  // The search's listing prices its plans in closed form without lowering them (reserved bytes
  // by the fragmentation band): it is unaffected by the injected lowering fault.
  const std::string cmd = std::string("env ") + kBreak + PARASOL_BIN;
  const auto ok =
      testing_cli::run_command(cmd + " search --model llama3-8b --gpus 8 --gbs 64 --top 3");
  EXPECT_EQ(ok.code, 0) << ok.out;
  // simulate plays the lowered Programs, and estimate replays the caching allocator over the
  // lowered stages (cost_models/framework_memory.h): both report the fault as parasol's bug.
  for (const char* command : {"simulate", "estimate"}) {
    const std::string args = std::string(" ") + command + " --model llama3-8b --gpus 8";
    const auto r = testing_cli::run_command(std::string(PARASOL_BIN) + args);
    EXPECT_EQ(r.code, 0) << command << ": " << r.out;
    const auto broken = testing_cli::run_command(cmd + args);
    EXPECT_EQ(broken.code, 1) << command << ": " << broken.out;
    EXPECT_NE(broken.out.find("internal error (this is a parasol bug"), std::string::npos)
        << broken.out;
    EXPECT_NE(broken.out.find("core/lower.cc:"), std::string::npos) << broken.out;
    EXPECT_NE(broken.out.find("PARASOL_TEST_BREAK_LOWERING"), std::string::npos) << broken.out;
  }
}

TEST(FailureKinds, SearchLetsAnInternalErrorThrough) {
  const std::string args = " search --model llama3-8b --gpus 8 --gbs 64 --top 3 --simulate-top 3";
  const auto healthy = testing_cli::run_command(std::string(PARASOL_BIN) + args);
  ASSERT_EQ(healthy.code, 0) << healthy.out;
  const auto broken = testing_cli::run_command(std::string("env ") + kBreak + PARASOL_BIN + args);
  EXPECT_EQ(broken.code, 1) << broken.out;
  EXPECT_NE(broken.out.find("parasol bug"), std::string::npos) << broken.out;
}

// A lowering bug that no check of the lowering catches (PARASOL_TEST_BREAK_LOWERING=program: a
// Program whose first op depends on an op that does not exist) is caught by the contract checks of
// the issue graph the engine builds (core/issue_graph.h), as parasol's bug: simulate and search
// --simulate-top exit 1 instead of taking the plan for one the user cannot run.
TEST(FailureKinds, AMalformedProgramFailsTheEngineAsABug) {
  const std::string cmd = std::string("env PARASOL_TEST_BREAK_LOWERING=program ") + PARASOL_BIN;
  const auto sim = testing_cli::run_command(cmd + " simulate --model llama3-8b --gpus 8");
  EXPECT_EQ(sim.code, 1) << sim.out;
  EXPECT_NE(sim.out.find("internal error (this is a parasol bug"), std::string::npos) << sim.out;
  EXPECT_NE(sim.out.find(".deps: bad op id"), std::string::npos) << sim.out;
  EXPECT_NE(sim.out.find("(not an earlier op)"), std::string::npos) << sim.out;
  const auto search = testing_cli::run_command(
      cmd + " search --model llama3-8b --gpus 8 --gbs 64 --top 3 --simulate-top 3");
  EXPECT_EQ(search.code, 1) << search.out;
  EXPECT_NE(search.out.find("(not an earlier op)"), std::string::npos) << search.out;
  // The closed form does not lower: estimate is unaffected.
  EXPECT_EQ(testing_cli::run_command(cmd + " estimate --model llama3-8b --gpus 8").code, 0);
}

// The same malformed Program fails the executor as parasol's bug too: `parasol run` exits 1 with
// the issue graph's contract message (the executor builds it before any op starts). So does a
// check that fails inside the lowering (PARASOL_TEST_BREAK_LOWERING=1), as it fails the engine
// (InternalErrorExitsOneAndSaysItIsABug): a healthy run of the same job exits 0.
TEST(FailureKinds, AMalformedProgramFailsTheExecutorAsABug) {
  const std::string args = " run --model tiny --gbs 4 --steps 1";
  const std::string cmd = std::string("env PARASOL_TEST_BREAK_LOWERING=program ") + PARASOL_BIN;
  const auto step = testing_cli::run_command(cmd + args);
  EXPECT_EQ(step.code, 1) << step.out;
  EXPECT_NE(step.out.find("internal error (this is a parasol bug"), std::string::npos) << step.out;
  EXPECT_NE(step.out.find(".deps: bad op id"), std::string::npos) << step.out;
  EXPECT_NE(step.out.find("(not an earlier op)"), std::string::npos) << step.out;
  const auto healthy = testing_cli::run_command(std::string(PARASOL_BIN) + args);
  EXPECT_EQ(healthy.code, 0) << healthy.out;
  const auto broken = testing_cli::run_command(std::string("env ") + kBreak + PARASOL_BIN + args);
  EXPECT_EQ(broken.code, 1) << broken.out;
  EXPECT_NE(broken.out.find("internal error (this is a parasol bug"), std::string::npos)
      << broken.out;
  EXPECT_NE(broken.out.find("core/lower.cc:"), std::string::npos) << broken.out;
  EXPECT_NE(broken.out.find("PARASOL_TEST_BREAK_LOWERING"), std::string::npos) << broken.out;
}

TEST(FailureKinds, SystemFaultExitsOneAndNamesTheCall) {
  const auto r = run("simulate --model llama3-8b --gpus 8 --trace /dev/full");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("system error: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("/dev/full"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace parasol
