// Megatron-LM training logs read as measured step times: the ` elapsed time per iteration (ms):
// X |` field of the lines megatron/training/training.py prints every --log-interval iterations
// (training_log, NVIDIA/Megatron-LM d98e8a6 L3574).
#pragma once

#include <string>
#include <vector>

namespace parasol::interop {

struct MegatronLog {
  // Per logged line, in order: the iteration the line reports (0 when the line has no
  // `iteration N/ M` field) and its elapsed time per iteration in seconds (Megatron averages it
  // over the log interval).
  std::vector<int> iterations;
  std::vector<double> step_s;
  int skipped = 0;         // leading lines left out as warm-up (see read_megatron_log)
  double step_time_s = 0;  // the median of the lines kept
};

// Reads the log text. The first logged line is warm-up and left out: it covers iteration 1
// (CUDA context, NCCL communicators, first allocations and kernel autotuning). The step time is
// the median of the other lines (robust to a stray slow line such as a checkpoint save).
// Throws parasol::Error(`what`) when there are fewer than two such lines or a value is not a
// positive number.
MegatronLog read_megatron_log(const std::string& text, const std::string& what = "log");

// True when `text` has at least one ` elapsed time per iteration (ms):` field.
bool looks_like_megatron_log(const std::string& text);

}  // namespace parasol::interop
