// Tests of the Kineto (PyTorch profiler) trace import: kernel names to op kinds, shapes from the
// launching CPU op, collective sizes from NCCL's and c10d's args, launch gaps, rejection of
// malformed and truncated files naming the file and position, and the real multi-rank GPU traces
// of tests/data/traces (HTA's test data): every kernel in a kind or the named unclassified count,
// the collectives' counts and bytes equal to what the raw JSON says, counted here on their own.
#include "traces/kineto_import.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>

#include "core/error.h"
#include "traces/kernel_kinds.h"
#include "traces/summary.h"
#include "traces/text_file.h"

namespace parasol::traces {
namespace {

const std::string kData = std::string(PARASOL_TEST_DATA_DIR) + "/traces/";
const std::vector<std::string> kHtaRanks = {kData + "hta_sampled_rank-0.json.gz",
                                            kData + "hta_sampled_rank-1.json.gz"};
const std::string kNcclStep = kData + "hta_nccl_step5_rank-0.json.gz";

std::string temp_file(const std::string& name, const std::string& bytes) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

// The message of the parasol::Error that `f` throws ("" when it throws none).
template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ClassifyKernel, NamesOfTheLibraries) {
  EXPECT_EQ(
      classify_kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"),
      "all-reduce");
  EXPECT_EQ(classify_kernel("ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, "
                            "ncclWork*)"),
            "all-gather");
  EXPECT_EQ(classify_kernel("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL"), "reduce-scatter");
  EXPECT_EQ(classify_kernel("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"), "send");
  EXPECT_EQ(classify_kernel("ncclKernel_Broadcast_RING_LL_Sum_int8_t"), "broadcast");
  EXPECT_EQ(
      classify_kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize"
                      "1x1x1_execute_segment_k_off_kernel__5x_cublas"),
      "linear");
  EXPECT_EQ(classify_kernel("ampere_sgemm_128x64_nn"), "linear");
  EXPECT_EQ(
      classify_kernel("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_32x6_tn_align4>"
                      "(cutlass_80_tensorop_s1688gemm_64x64_32x6_tn_align4::Params)"),
      "linear");
  EXPECT_EQ(classify_kernel("nvjet_tst_192x192_64x4_2x1_v_bz_coopA_TNT"), "linear");
  EXPECT_EQ(classify_kernel("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_"
                            "64x128x128_4x1x1_kernel0_0"),
            "attention");
  EXPECT_EQ(classify_kernel("void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false>>"
                            "(Flash_fwd_params)"),
            "attention");
  EXPECT_EQ(classify_kernel("fmha_cutlassF_bf16_aligned_64x128_rf_sm80(PyTorchMemEffAttention::"
                            "AttentionKernel<cutlass::bfloat16_t>::Params)"),
            "attention");
  EXPECT_EQ(classify_kernel("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<"
                            "float, float>(int, float, float const*)"),
            "norm");
  EXPECT_EQ(classify_kernel("void at::native::vectorized_elementwise_kernel<4, at::native::"
                            "GeluCUDAKernelImpl(at::TensorIteratorBase&)>"),
            "activation");
  EXPECT_EQ(classify_kernel("void at::native::vectorized_elementwise_kernel<4, at::native::"
                            "CUDAFunctor_add<float>>"),
            "elementwise");
  EXPECT_EQ(classify_kernel("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<"
                            "FusedAdamMathFunctor<float, 4>>"),
            "adamw");
  EXPECT_EQ(classify_kernel("void fbgemm_gpu::permute_2D_lengths_kernel<int>(int, int)"), "");
}

// A small trace of one rank: CPU ops that launch kernels (runtime calls by correlation).
Json small_trace() {
  auto op = [](const char* name, double ts, double dur, Json dims, Json types) {
    return Json{{"ph", "X"},    {"cat", "cpu_op"},
                {"name", name}, {"pid", 10},
                {"tid", 11},    {"ts", ts},
                {"dur", dur},   {"args", {{"Input Dims", dims}, {"Input type", types}}}};
  };
  auto call = [](double ts, double dur, int corr) {
    return Json{{"ph", "X"},
                {"cat", "cuda_runtime"},
                {"name", "cudaLaunchKernel"},
                {"pid", 10},
                {"tid", 11},
                {"ts", ts},
                {"dur", dur},
                {"args", {{"correlation", corr}}}};
  };
  auto kernel = [](const char* name, double ts, double dur, int corr, int stream, Json args = {}) {
    args["correlation"] = corr;
    return Json{{"ph", "X"},     {"cat", "kernel"}, {"name", name}, {"pid", 0},
                {"tid", stream}, {"ts", ts},        {"dur", dur},   {"args", args}};
  };
  Json ev = Json::array();
  // addmm(bias [768], in [4096 x 1024], w [1024 x 768]) -> one GEMM kernel.
  ev.push_back(op("aten::linear", 100, 20, Json::array(), Json::array()));
  ev.push_back(op("aten::addmm", 101, 18, {{768}, {4096, 1024}, {1024, 768}},
                  {"c10::BFloat16", "c10::BFloat16", "c10::BFloat16"}));
  ev.push_back(call(105, 5, 1));
  ev.push_back(kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 1000, 50, 1, 7));
  // layer_norm of [8, 512, 1024] bf16 -> bytes 2 x elements x 2.
  ev.push_back(
      op("aten::layer_norm", 200, 10, {{8, 512, 1024}, {1024}}, {"c10::BFloat16", "float"}));
  ev.push_back(call(202, 3, 2));
  // The GEMM ended at 1050; the host's launch call ends at 205 + ... (the kernel is late).
  ev.push_back(kernel("void at::native::vectorized_layer_norm_kernel<c10::BFloat16, float>", 1080,
                      10, 2, 7));
  // SDPA [2, 16, 1024, 64] queries, [2, 4, 1024, 64] keys and values.
  ev.push_back(op("aten::_scaled_dot_product_flash_attention", 300, 10,
                  {{2, 16, 1024, 64}, {2, 4, 1024, 64}, {2, 4, 1024, 64}},
                  {"c10::BFloat16", "c10::BFloat16", "c10::BFloat16"}));
  ev.push_back(call(301, 2, 3));
  ev.push_back(kernel("void flash_fwd_kernel<Flash_fwd_kernel_traits<64>>", 1090, 40, 3, 7));
  // An all-reduce with its size on the kernel (newer Kineto).
  ev.push_back(call(400, 2, 4));
  ev.push_back(kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 1100, 30, 4, 20,
                      {{"Collective name", "allreduce"},
                       {"In msg nelems", 1000},
                       {"Out msg nelems", 1000},
                       {"dtype", "BFloat16"},
                       {"Group size", 8},
                       {"Process Group Description", "dp"}}));
  // An all-gather sized by its c10d op (output [64 x 1024] float, input [8 x 1024]).
  ev.push_back(op("c10d::_allgather_base_", 500, 10, {{64, 1024}, {8, 1024}}, {"float", "float"}));
  ev.push_back(call(505, 1, 5));
  ev.push_back(kernel("ncclDevKernel_AllGather_RING_LL", 1200, 20, 5, 20));
  ev.push_back(kernel("void my_custom_kernel<int>(int)", 1300, 5, 99, 7));
  ev.push_back({{"ph", "X"},
                {"cat", "gpu_memcpy"},
                {"name", "Memcpy HtoD (Pinned -> Device)"},
                {"pid", 0},
                {"tid", 30},
                {"ts", 1310},
                {"dur", 4},
                {"args", {{"bytes", 4096}}}});
  return {{"schemaVersion", 1},
          {"distributedInfo", {{"rank", 3}, {"world_size", 8}}},
          {"traceEvents", ev}};
}

TEST(KinetoImport, ShapesSizesAndKindsFromTheLaunchingOps) {
  const ImportedTrace imp = import_kineto(small_trace(), "small", 0);
  ASSERT_EQ(imp.trace.events.size(), 7u);
  ASSERT_EQ(imp.shapes.size(), 7u);
  EXPECT_EQ(imp.kernels, 6);
  std::map<std::string, size_t> at;
  for (size_t i = 0; i < imp.trace.events.size(); ++i) {
    EXPECT_EQ(imp.trace.events[i].rank, 3);  // distributedInfo.rank, not the default
    at[imp.trace.events[i].kind] = i;
  }
  const TraceEvent& gemm = imp.trace.events[at.at("linear")];
  const KernelShape& gs = imp.shapes[at.at("linear")];
  EXPECT_EQ(gs.m, 4096);
  EXPECT_EQ(gs.k, 1024);
  EXPECT_EQ(gs.n, 768);
  EXPECT_EQ(gs.dtype, "bf16");
  EXPECT_DOUBLE_EQ(gemm.flops, 2.0 * 4096 * 1024 * 768);
  EXPECT_DOUBLE_EQ(gemm.dur_s, 50e-6);
  EXPECT_EQ(gemm.stream, 7);
  EXPECT_EQ(gemm.phase, "fwd");

  EXPECT_DOUBLE_EQ(imp.trace.events[at.at("norm")].bytes, 2.0 * 8 * 512 * 1024 * 2);
  const KernelShape& as = imp.shapes[at.at("attention")];
  EXPECT_EQ(as.heads, 16);
  EXPECT_EQ(as.kv_heads, 4);
  EXPECT_EQ(as.seq_q, 1024);
  EXPECT_DOUBLE_EQ(imp.trace.events[at.at("attention")].flops, 4.0 * 2 * 16 * 1024 * 1024 * 64);

  const TraceEvent& ar = imp.trace.events[at.at("all-reduce")];
  EXPECT_DOUBLE_EQ(ar.bytes, 1000 * 2);
  EXPECT_EQ(imp.shapes[at.at("all-reduce")].group_size, 8);
  EXPECT_EQ(imp.shapes[at.at("all-reduce")].size_from, "kernel");
  EXPECT_EQ(ar.group, "dp");
  const TraceEvent& ag = imp.trace.events[at.at("all-gather")];
  EXPECT_DOUBLE_EQ(ag.bytes, 64.0 * 1024 * 4);  // the output, nccl-tests' all-gather payload
  EXPECT_EQ(imp.shapes[at.at("all-gather")].size_from, "c10d");
  EXPECT_DOUBLE_EQ(imp.trace.events[at.at("prefetch")].bytes, 4096);

  // The unknown kernel is kept, as "unclassified", and counted by name.
  EXPECT_EQ(imp.trace.events[at.at("unclassified")].name, "void my_custom_kernel<int>(int)");
  ASSERT_EQ(imp.unclassified.size(), 1u);
  EXPECT_EQ(imp.unclassified[0].count, 1);
  EXPECT_EQ(imp.by_kind.at("unclassified"), 1);

  // Streams named by what they ran.
  std::map<int, std::string> names;
  for (const TraceStream& s : imp.trace.streams) names[s.stream] = s.name;
  EXPECT_EQ(names[7], "compute (cuda stream 7)");
  EXPECT_EQ(names[20], "comm (cuda stream 20)");
  EXPECT_EQ(names[30], "copy (cuda stream 30)");
}

TEST(KinetoImport, LaunchGapsAreIdleTimeThatWaitedForTheHost) {
  // Two kernels on one stream: [1000, 1010) launched by a call ending at 110 and [1030, 1040)
  // launched by a call ending at 1025 (the device idled 20 us, 15 of them waiting for it).
  Json ev = Json::array();
  ev.push_back({{"ph", "X"},
                {"cat", "cuda_runtime"},
                {"name", "cudaLaunchKernel"},
                {"pid", 1},
                {"tid", 1},
                {"ts", 100},
                {"dur", 10},
                {"args", {{"correlation", 1}}}});
  ev.push_back({{"ph", "X"},
                {"cat", "cuda_runtime"},
                {"name", "cudaLaunchKernel"},
                {"pid", 1},
                {"tid", 1},
                {"ts", 1020},
                {"dur", 5},
                {"args", {{"correlation", 2}}}});
  ev.push_back({{"ph", "X"},
                {"cat", "kernel"},
                {"name", "ampere_sgemm_128x64_nn"},
                {"pid", 0},
                {"tid", 7},
                {"ts", 1000},
                {"dur", 10},
                {"args", {{"correlation", 1}}}});
  ev.push_back({{"ph", "X"},
                {"cat", "kernel"},
                {"name", "ampere_sgemm_128x64_nn"},
                {"pid", 0},
                {"tid", 7},
                {"ts", 1030},
                {"dur", 10},
                {"args", {{"correlation", 2}}}});
  const ImportedTrace imp = import_kineto({{"traceEvents", ev}}, "gaps", 0);
  ASSERT_EQ(imp.gaps.size(), 1u);
  EXPECT_NEAR(imp.gaps[0].busy_s, 20e-6, 1e-12);
  EXPECT_NEAR(imp.gaps[0].idle_s, 20e-6, 1e-12);
  EXPECT_NEAR(imp.gaps[0].launch_s, 15e-6, 1e-12);
  EXPECT_EQ(imp.gaps[0].launch_gaps, 1);
}

TEST(KinetoImport, MalformedEventsNameTheFieldAndPosition) {
  Json j = small_trace();
  j["traceEvents"][3]["dur"] = "fifty";
  EXPECT_NE(error_of([&] { import_kineto(j, "f.json", 0); }).find("f.json.traceEvents[3].dur"),
            std::string::npos);
  j = small_trace();
  j["traceEvents"][3].erase("ts");
  EXPECT_NE(error_of([&] { import_kineto(j, "f.json", 0); }).find("traceEvents[3].ts: missing"),
            std::string::npos);
  j = small_trace();
  j["traceEvents"][3]["dur"] = -1;
  EXPECT_NE(error_of([&] { import_kineto(j, "f.json", 0); }).find("traceEvents[3].dur"),
            std::string::npos);
  j = small_trace();
  j["traceEvents"][3]["tid"] = "seven";
  EXPECT_NE(error_of([&] { import_kineto(j, "f.json", 0); }).find("traceEvents[3].tid"),
            std::string::npos);
  j = small_trace();
  j["traceEvents"][3]["tid"] = "stream 99999999999";
  EXPECT_NE(error_of([&] { import_kineto(j, "f.json", 0); }).find("traceEvents[3].tid"),
            std::string::npos);
  // Older exports name a stream "stream N".
  j = small_trace();
  j["traceEvents"][3]["tid"] = "stream 9";
  bool on_nine = false;
  for (const TraceEvent& e : import_kineto(j, "f.json", 0).trace.events)
    on_nine = on_nine || (e.kind == "linear" && e.stream == 9);
  EXPECT_TRUE(on_nine);
  j = small_trace();
  j["traceEvents"] = 5;
  EXPECT_NE(error_of([&] { import_kineto(j, "f.json", 0); }).find("f.json.traceEvents"),
            std::string::npos);
  j = small_trace();
  j["distributedInfo"]["rank"] = -2;
  EXPECT_NE(error_of([&] { import_kineto(j, "f.json", 0); }).find("distributedInfo.rank"),
            std::string::npos);
}

TEST(KinetoImport, TruncatedAndCorruptFilesNameTheFileAndPosition) {
  const std::string text = small_trace().dump();
  const std::string cut = temp_file("cut.json", text.substr(0, text.size() / 2));
  const std::string e1 = error_of([&] { import_kineto_files({cut}); });
  EXPECT_NE(e1.find(cut), std::string::npos) << e1;
  EXPECT_NE(e1.find("malformed JSON"), std::string::npos) << e1;
  EXPECT_NE(e1.find("line 1, column"), std::string::npos) << e1;  // the position

  std::ifstream in(kHtaRanks[0], std::ios::binary);
  std::string gz((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(gz.size(), 1000u);
  const std::string half = temp_file("half.json.gz", gz.substr(0, gz.size() / 2));
  const std::string e2 = error_of([&] { import_kineto_files({half}); });
  EXPECT_NE(e2.find(half), std::string::npos) << e2;
  EXPECT_NE(e2.find("truncated gzip data at compressed byte"), std::string::npos) << e2;

  std::string bad = gz;
  for (size_t i = 100; i < 200; ++i) bad[i] = static_cast<char>(bad[i] ^ 0x5a);
  const std::string corrupt = temp_file("corrupt.json.gz", bad);
  EXPECT_NE(error_of([&] { import_kineto_files({corrupt}); }).find(corrupt), std::string::npos);

  EXPECT_NE(error_of([&] { import_kineto_files({"/nonexistent/x.json"}); }).find("cannot open"),
            std::string::npos);
  const std::string e3 = error_of([&] { import_kineto_files({kHtaRanks[0], kHtaRanks[0]}); });
  EXPECT_NE(e3.find("rank 0 is also the rank of"), std::string::npos) << e3;
}

// What the raw JSON of one rank's file says, counted without the importer.
struct RawCounts {
  int kernels = 0;
  int nccl_kernels = 0;
  double rpc_bytes = 0;  // record_param_comms with a sized first input: elements x dtype bytes
  int rpc_sized = 0;
};

double raw_dtype_bytes(const std::string& t) {
  if (t == "float" || t == "int" || t == "Float" || t == "Int") return 4;
  if (t == "long" || t == "double" || t == "Long") return 8;
  if (t == "unsigned char" || t == "Byte" || t == "bool") return 1;
  if (t == "c10::BFloat16" || t == "c10::Half" || t == "BFloat16") return 2;
  return 0;
}

RawCounts raw_counts(const std::string& path) {
  const Json j = Json::parse(read_text_file(path));
  RawCounts c;
  for (const Json& e : j["traceEvents"]) {
    if (e.value("cat", "") == "kernel") {
      ++c.kernels;
      if (e["name"].get<std::string>().rfind("nccl", 0) == 0) ++c.nccl_kernels;
    }
    if (e.value("name", "") == "record_param_comms") {
      const Json& dims = e["args"]["Input Dims"];
      if (dims.empty() || dims[0].empty()) continue;
      double n = 1;
      for (const Json& d : dims[0]) n *= d.get<double>();
      c.rpc_bytes += n * raw_dtype_bytes(e["args"]["Input type"][0].get<std::string>());
      ++c.rpc_sized;
    }
  }
  return c;
}

TEST(KinetoImport, MultiRankGpuTraceEveryKernelClassifiedOrNamed) {
  const ImportedTrace imp = import_kineto_files(kHtaRanks);
  std::set<int> ranks;
  for (const TraceEvent& e : imp.trace.events) ranks.insert(e.rank);
  EXPECT_EQ(ranks, (std::set<int>{0, 1}));  // distributedInfo.rank of each file

  const std::set<std::string> kinds = {
      "linear",     "attention",     "norm",        "activation", "elementwise", "adamw",
      "grad-norm",  "cross-entropy", "embedding",   "all-reduce", "all-gather",  "reduce-scatter",
      "all-to-all", "broadcast",     "send",        "recv",       "prefetch",    "offload",
      "memcpy",     "memset",        "unclassified"};
  int sum = 0;
  for (const auto& [k, n] : imp.by_kind) {
    EXPECT_TRUE(kinds.count(k)) << k;
    sum += n;
  }
  EXPECT_EQ(sum, static_cast<int>(imp.trace.events.size()));
  int unclassified = 0;
  for (const KernelCount& k : imp.unclassified) {
    EXPECT_FALSE(k.name.empty());
    EXPECT_GT(k.count, 0);
    unclassified += k.count;
  }
  EXPECT_EQ(unclassified, imp.by_kind.at("unclassified"));
  // These traces are mostly GEMMs and elementwise kernels; the rules must cover most of them.
  EXPECT_LT(unclassified, imp.kernels / 10);
  EXPECT_GT(imp.by_kind.at("linear"), 100);
  EXPECT_GT(imp.by_kind.at("norm"), 10);

  int raw_kernels = 0, raw_nccl = 0, raw_sized = 0;
  double raw_rpc_bytes = 0;
  for (const std::string& f : kHtaRanks) {
    const RawCounts c = raw_counts(f);
    raw_kernels += c.kernels;
    raw_nccl += c.nccl_kernels;
    raw_rpc_bytes += c.rpc_bytes;
    raw_sized += c.rpc_sized;
  }
  EXPECT_EQ(imp.kernels, raw_kernels);
  int comm = 0, from_rpc = 0;
  double rpc_bytes = 0;
  for (size_t i = 0; i < imp.trace.events.size(); ++i) {
    const TraceEvent& e = imp.trace.events[i];
    if (!is_communication_kind(e.kind)) continue;
    ++comm;
    if (imp.shapes[i].size_from == "record_param_comms") {
      ++from_rpc;
      rpc_bytes += e.bytes;
    }
  }
  EXPECT_EQ(comm, raw_nccl);
  ASSERT_GT(raw_sized, 0);
  EXPECT_EQ(from_rpc, raw_sized);  // each sized record_param_comms launched one NCCL kernel
  EXPECT_DOUBLE_EQ(rpc_bytes, raw_rpc_bytes);
  // The SendRecv kernels of c10d::alltoall_base_ are all-to-alls, not sends.
  EXPECT_GT(imp.by_kind.count("all-to-all") ? imp.by_kind.at("all-to-all") : 0, 0);

  // Times start at the earliest device activity; every event lies within the trace.
  double first = 1e300;
  for (const TraceEvent& e : imp.trace.events) {
    first = std::min(first, e.start_s);
    EXPECT_GE(e.dur_s, 0);
  }
  EXPECT_DOUBLE_EQ(first, 0);
  ASSERT_EQ(imp.gaps.size(), 2u);
  for (const RankGaps& g : imp.gaps) {
    EXPECT_GT(g.busy_s, 0);
    EXPECT_LE(g.launch_s, g.idle_s);
  }
}

TEST(KinetoImport, CollectiveArgsOnNcclKernelsGiveBytesAndCounts) {
  // Count the NCCL kernels and their payloads straight from the raw JSON.
  const Json j = Json::parse(read_text_file(kNcclStep));
  std::map<std::string, int> raw_count;
  std::map<std::string, double> raw_bytes;
  for (const Json& e : j["traceEvents"]) {
    if (e.value("cat", "") != "kernel" || e["name"].get<std::string>().rfind("nccl", 0) != 0)
      continue;
    const std::string name = e["args"]["Collective name"].get<std::string>();
    const std::string kind = name == "allreduce" ? "all-reduce" : name;  // "broadcast"
    ++raw_count[kind];
    raw_bytes[kind] += e["args"]["In msg nelems"].get<double>() *
                       raw_dtype_bytes(e["args"]["dtype"].get<std::string>());
  }
  ASSERT_EQ(raw_count.size(), 2u);
  const ImportedTrace imp = import_kineto_files({kNcclStep});
  for (const auto& [kind, n] : raw_count) {
    int count = 0;
    double bytes = 0;
    for (size_t i = 0; i < imp.trace.events.size(); ++i)
      if (imp.trace.events[i].kind == kind) {
        ++count;
        bytes += imp.trace.events[i].bytes;
        EXPECT_EQ(imp.shapes[i].group_size, 2);
        EXPECT_EQ(imp.shapes[i].group, "default_pg");
      }
    EXPECT_EQ(count, n) << kind;
    EXPECT_DOUBLE_EQ(bytes, raw_bytes[kind]) << kind;
  }
  // The summary JSON carries the same figures.
  const Json s = import_summary_to_json(imp);
  for (const Json& c : s["collectives"]) {
    const std::string k = c["kind"].get<std::string>();
    EXPECT_EQ(c["events"].get<int>(), raw_count[k]);
    EXPECT_EQ(c["sized"].get<int>(), raw_count[k]);
    EXPECT_DOUBLE_EQ(c["bytes"].get<double>(), raw_bytes[k]);
  }
}

TEST(KinetoImport, TellsKinetoFromParasolTraces) {
  EXPECT_TRUE(looks_like_kineto(small_trace()));
  EXPECT_FALSE(looks_like_kineto(
      Json{{"traceEvents", Json::array()}, {"otherData", {{"generator", "parasol"}}}}));
}

}  // namespace
}  // namespace parasol::traces
