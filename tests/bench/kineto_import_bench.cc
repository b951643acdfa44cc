// The Kineto import of a large trace, streamed (nlohmann's SAX parser: traces::import_kineto_file)
// against the DOM import of the same file in the same process (the whole text read, parsed into
// one nlohmann::json, then imported: how the import worked before it streamed).
//
// The trace is made here from a real one: tests/data/traces/hta_nccl_step5_rank-0.json.gz (one
// rank of HTA's 8-rank NCCL job, PyTorch profiler output) is copied end to end until the text
// reaches PARASOL_BENCH_TRACE_MB megabytes (default 1024: the issue's 1 GB trace), each copy's
// times shifted past the one before and its correlation and External ids past the one before's,
// so that every copy's kernels find their own launches, as in a trace of many steps.
//
// Run: build/tests/bench/kineto_import_bench   (figures are counters, nothing is asserted):
//   peak_rss_MB     the process's peak resident memory during the import (VmHWM, reset before
//                   it through /proc/self/clear_refs; where the reset is refused, the peak since
//                   the start, so the streamed import runs first), and over_baseline_MB the same
//                   less the resident memory before the import;
//   input_MB        the trace's text; events the device activities imported;
//   vs_streamed_time and vs_streamed_peak (DOM benchmark only): its time and peak over the
//                   streamed import's, measured just before in this process.
// The issue's bound: the streamed import of the 1 GB trace peaks under 1 GB.
// PARASOL_BENCH_DOM=0 skips the DOM import (it needs about ten times the text in memory).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "core/json_reader.h"
#include "traces/kineto_import.h"
#include "traces/text_file.h"

using namespace parasol;

namespace {

// A field of /proc/self/status in kB ("VmHWM", "VmRSS"); 0 where there is none.
double status_kb(const std::string& field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(field + ":", 0) == 0) return std::atof(line.c_str() + field.size() + 1);
  return 0;
}

// Resets the peak resident memory to the current one (Linux: clear_refs 5); false if refused.
bool reset_peak() {
  std::ofstream f("/proc/self/clear_refs");
  if (!f) return false;
  f << "5";
  f.flush();
  return static_cast<bool>(f);
}

double env_number(const char* name, double fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atof(v) : fallback;
}

// The synthetic trace's path and size (made once).
struct BigTrace {
  std::string path;
  double bytes = 0;
};

bool made = false;  // whether big_trace() wrote its file

const BigTrace& big_trace() {
  static const BigTrace trace = [] {
    made = true;
    const std::string source =
        std::string(PARASOL_TEST_DATA_DIR) + "/traces/hta_nccl_step5_rank-0.json.gz";
    const Json j = parse_json(traces::read_text_file(source), source);
    const Json& events = j.at("traceEvents");
    double first = 1e300, last = -1e300;
    int64_t max_id = 0;
    for (const Json& e : events) {
      if (e.contains("ts") && e["ts"].is_number()) {
        const double ts = e["ts"].get<double>();
        const double end =
            ts + (e.contains("dur") && e["dur"].is_number() ? e["dur"].get<double>() : 0.0);
        first = std::min(first, ts);
        last = std::max(last, end);
      }
      if (e.contains("args") && e["args"].is_object())
        for (const char* k : {"correlation", "External id"})
          if (e["args"].contains(k) && e["args"][k].is_number_integer())
            max_id = std::max(max_id, e["args"][k].get<int64_t>());
    }
    const double period = (last - first) + 1000;  // microseconds between copies
    const char* dir = std::getenv("TMPDIR");
    BigTrace t;
    t.path = std::string(dir && *dir ? dir : "/tmp") + "/parasol_kineto_bench_trace.json";
    const double target = env_number("PARASOL_BENCH_TRACE_MB", 1024) * 1e6;
    std::ofstream out(t.path, std::ios::binary);
    Json header = j;
    header.erase("traceEvents");
    std::string head = header.dump();
    head.pop_back();  // the closing brace
    out << head << (header.empty() ? "" : ",") << "\"traceEvents\":[";
    double written = static_cast<double>(head.size());
    bool first_event = true;
    for (int64_t copy = 0; written < target; ++copy) {
      for (Json e : events) {
        if (e.contains("ts") && e["ts"].is_number())
          e["ts"] = e["ts"].get<double>() + copy * period;
        if (e.contains("args") && e["args"].is_object())
          for (const char* k : {"correlation", "External id"})
            if (e["args"].contains(k) && e["args"][k].is_number_integer())
              e["args"][k] = e["args"][k].get<int64_t>() + copy * (max_id + 1);
        if (e.contains("name") && e["name"].is_string() &&
            e["name"].get<std::string>().rfind("ProfilerStep#", 0) == 0)
          e["name"] = "ProfilerStep#" + std::to_string(copy);
        const std::string text = e.dump();
        out << (first_event ? "" : ",") << text;
        first_event = false;
        written += static_cast<double>(text.size()) + 1;
      }
    }
    out << "]}";
    out.close();
    t.bytes = written + 2;
    return t;
  }();
  return trace;
}

double streamed_s = 0, streamed_peak_mb = 0;  // the streamed import's, for the DOM's ratios

void report(benchmark::State& state, double seconds, double peak_kb, double base_kb,
            const traces::ImportedTrace& imp) {
  state.counters["peak_rss_MB"] = peak_kb / 1024;
  state.counters["over_baseline_MB"] = (peak_kb - base_kb) / 1024;
  state.counters["input_MB"] = big_trace().bytes / 1e6;
  state.counters["events"] = static_cast<double>(imp.trace.events.size());
  state.counters["seconds"] = seconds;
}

void BM_KinetoImportStreamed(benchmark::State& state) {
  const BigTrace& t = big_trace();
  for (auto _ : state) {
    reset_peak();
    const double base = status_kb("VmRSS");
    const auto start = std::chrono::steady_clock::now();
    traces::ImportedTrace imp = traces::import_kineto_file(t.path, 0, true);
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double peak = status_kb("VmHWM");
    benchmark::DoNotOptimize(imp);
    streamed_s = s;
    streamed_peak_mb = peak / 1024;
    report(state, s, peak, base, imp);
  }
}
BENCHMARK(BM_KinetoImportStreamed)->Iterations(1)->UseRealTime()->Unit(benchmark::kSecond);

void BM_KinetoImportDom(benchmark::State& state) {
  if (env_number("PARASOL_BENCH_DOM", 1) == 0) {
    state.SkipWithError("PARASOL_BENCH_DOM=0");
    for (auto _ : state) {
    }
    return;
  }
  const BigTrace& t = big_trace();
  for (auto _ : state) {
    reset_peak();
    const double base = status_kb("VmRSS");
    const auto start = std::chrono::steady_clock::now();
    traces::ImportedTrace imp;
    {
      const Json j = parse_json(traces::read_text_file(t.path), t.path);
      if (!traces::looks_like_kineto(j)) state.SkipWithError("not a Kineto trace");
      imp = traces::import_kineto(j, t.path, 0);
    }
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double peak = status_kb("VmHWM");
    benchmark::DoNotOptimize(imp);
    report(state, s, peak, base, imp);
    if (streamed_s > 0) {
      state.counters["vs_streamed_time"] = s / streamed_s;
      state.counters["vs_streamed_peak"] = peak / 1024 / streamed_peak_mb;
    }
  }
}
BENCHMARK(BM_KinetoImportDom)->Iterations(1)->UseRealTime()->Unit(benchmark::kSecond);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (made) std::remove(big_trace().path.c_str());
  return 0;
}
