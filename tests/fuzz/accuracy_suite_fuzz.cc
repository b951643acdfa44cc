// Fuzz target: an accuracy suite of published runs (cost::read_accuracy_suite), as `parasol
// accuracy FILE` reads it: every run's model must be valid, its time positive and its cluster
// buildable.
#include "core/json_reader.h"
#include "cost_models/accuracy.h"
#include "tests/fuzz/fuzz_target.h"
#include "tests/fuzz/reader_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace parasol;
  return fuzz::run_reader(data, size, [](const std::string& text) {
    for (const cost::PublishedRun& run : cost::read_accuracy_suite(parse_json(text, "suite"))) {
      fuzz::check_model(run.model);
      if (!(run.time_s > 0)) throw std::logic_error("run " + run.id + " has no positive time");
      // Built, not round-tripped: published clusters have thousands of GPUs, and
      // cluster_json_fuzz checks the cluster reader itself.
      if (cost::cluster_of(run).num_gpus() < 1)
        throw std::logic_error("run " + run.id + ": no GPUs");
    }
  });
}
