// Tests of the Nsight Systems SQLite import (traces/nsys_import.h) on reports made here with
// SQLite's C library in the tables and columns of Nsight Systems' documented export schema:
// kernels classified by their demangled names (unclassified ones named and counted), copies and
// memsets, launch gaps from the runtime calls, profiler steps from NVTX ranges, several ranks
// merged beside a Kineto trace, and broken reports rejected naming the file, table and row.
#include "traces/nsys_import.h"

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <cstdio>
#include <fstream>
#include <set>

#include "core/error.h"
#include "traces/framework_traces.h"

namespace parasol::traces {
namespace {

// The tables of `nsys export --type sqlite` that the import reads (a subset of their columns).
const char* kSchema = R"(
CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL,
  deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL,
  correlationId INTEGER, globalPid INTEGER, demangledName INTEGER NOT NULL,
  shortName INTEGER NOT NULL, mangledName INTEGER, gridX INTEGER, blockX INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INTEGER NOT NULL, end INTEGER NOT NULL,
  deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL,
  correlationId INTEGER, globalPid INTEGER, bytes INTEGER NOT NULL, copyKind INTEGER NOT NULL,
  srcKind INTEGER, dstKind INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET (start INTEGER NOT NULL, end INTEGER NOT NULL,
  deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL,
  correlationId INTEGER, globalPid INTEGER, value INTEGER NOT NULL, bytes INTEGER NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL,
  eventClass INTEGER NOT NULL, globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL,
  returnValue INTEGER NOT NULL);
CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL,
  rangeId INTEGER, category INTEGER, color INTEGER, text TEXT, globalTid INTEGER,
  endGlobalTid INTEGER, textId INTEGER, domainId INTEGER);
)";

// A report of one rank: two GEMMs on stream 7 (the second launched late: its runtime call ends
// 15 us after the first GEMM ended), an NCCL all-reduce on stream 20, a kernel no rule knows,
// a host-to-device copy, a memset and two profiler steps.
const char* kRows = R"(
INSERT INTO StringIds VALUES (1, 'ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn'),
  (2, 'ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)'),
  (3, 'void my_custom_kernel<float>(float*)'), (4, 'cudaLaunchKernel'),
  (5, 'ProfilerStep#3'), (6, 'gemm');
INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (100000, 110000, 1, 1, 1, 4, 0),
  (1020000, 1025000, 1, 1, 2, 4, 0), (1040000, 1041000, 1, 1, 3, 4, 0);
INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES
  (1000000, 1010000, 0, 1, 7, 1, 1, 1, 6, 1, 1, 1),
  (1030000, 1040000, 0, 1, 7, 2, 1, 1, 6, 1, 1, 1),
  (1050000, 1080000, 0, 1, 20, 3, 1, 2, 2, 2, 1, 1),
  (1090000, 1095000, 0, 1, 7, 4, 1, 3, 3, 3, 1, 1);
INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (1100000, 1104000, 0, 1, 30, 5, 1, 4096, 1, 0, 0);
INSERT INTO CUPTI_ACTIVITY_KIND_MEMSET VALUES (1110000, 1111000, 0, 1, 30, 6, 1, 0, 256);
INSERT INTO NVTX_EVENTS VALUES (900000, 1200000, 59, 0, 0, 0, NULL, 1, 1, 5, 0),
  (1200000, 1300000, 59, 0, 0, 0, 'ProfilerStep#4', 1, 1, NULL, 0);
)";

std::string make_report(const std::string& name, const std::string& sql) {
  const std::string path = ::testing::TempDir() + name;
  std::remove(path.c_str());
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  char* err = nullptr;
  EXPECT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err), SQLITE_OK) << (err ? err : "");
  sqlite3_free(err);
  sqlite3_close(db);
  return path;
}

template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(NsysImport, AReportOfSeveralGpusAndProcessesIsSplitIntoRanks) {
  // One report of a node: process 100 on GPUs 0 and 1, process 200 on GPU 0 of another context
  // (nsys profile of a torchrun job writes all of them into one report). Each (process, GPU)
  // becomes a rank, in that order, numbered on from the ranks of the files before it.
  const std::string rows = R"(
INSERT INTO StringIds VALUES (1, 'ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn'),
  (2, 'ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)');
INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES
  (1000000, 1010000, 0, 1, 7, 1, 100, 1, 1, 1, 1, 1),
  (1020000, 1030000, 0, 1, 20, 2, 100, 2, 2, 2, 1, 1),
  (1000000, 1012000, 1, 2, 7, 3, 100, 1, 1, 1, 1, 1),
  (1021000, 1030000, 1, 2, 20, 4, 100, 2, 2, 2, 1, 1),
  (1000000, 1011000, 0, 3, 7, 5, 200, 1, 1, 1, 1, 1);
INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (1100000, 1104000, 1, 2, 30, 6, 100, 4096, 1, 0, 0);
)";
  const std::string node = make_report("node.sqlite", std::string(kSchema) + rows);
  const std::vector<ImportedTrace> parts = import_nsys_ranks(node, 0);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0].trace.events.size(), 2u);  // process 100, GPU 0
  EXPECT_EQ(parts[1].trace.events.size(), 3u);  // process 100, GPU 1 (with its copy)
  EXPECT_EQ(parts[1].kernels, 2);
  EXPECT_EQ(parts[2].trace.events.size(), 1u);  // process 200, GPU 0
  for (int r = 0; r < 3; ++r)
    for (const TraceEvent& e : parts[r].trace.events) EXPECT_EQ(e.rank, r);
  // Beside a one-rank report before it: ranks 1, 2, 3.
  const std::string one = make_report("one.sqlite", std::string(kSchema) + kRows);
  const ImportedTrace all = import_framework_traces({one, node});
  std::set<int> ranks;
  for (const TraceEvent& e : all.trace.events) ranks.insert(e.rank);
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2, 3}));
  EXPECT_EQ(all.files.size(), 2u);
  EXPECT_EQ(all.gaps.size(), 4u);
}

TEST(NsysImport, KernelsCopiesGapsAndSteps) {
  const std::string path = make_report("rank.sqlite", std::string(kSchema) + kRows);
  ASSERT_TRUE(is_sqlite_file(path));
  const ImportedTrace imp = import_nsys(path, 5);
  ASSERT_EQ(imp.trace.events.size(), 6u);
  EXPECT_EQ(imp.kernels, 4);
  EXPECT_EQ(imp.by_kind.at("linear"), 2);
  EXPECT_EQ(imp.by_kind.at("all-reduce"), 1);
  EXPECT_EQ(imp.by_kind.at("memcpy"), 1);  // a prefetch only for a plan that offloads
  EXPECT_EQ(imp.by_kind.at("memset"), 1);
  ASSERT_EQ(imp.unclassified.size(), 1u);
  EXPECT_EQ(imp.unclassified[0].name, "void my_custom_kernel<float>(float*)");
  EXPECT_EQ(imp.unclassified[0].count, 1);
  EXPECT_EQ(imp.steps, 2);  // ProfilerStep#3 (by textId) and #4 (by text)
  // Their ranges last 300 and 100 us: the rank's step time is their mean.
  ASSERT_EQ(imp.step_s.count(5), 1u);
  EXPECT_NEAR(imp.step_s.at(5), 200e-6, 1e-15);
  for (const TraceEvent& e : imp.trace.events) {
    EXPECT_EQ(e.rank, 5);
    if (e.kind == "memcpy") {
      EXPECT_DOUBLE_EQ(e.bytes, 4096);
      EXPECT_NEAR(e.dur_s, 4e-6, 1e-15);
    }
    if (e.kind == "memset") {
      EXPECT_DOUBLE_EQ(e.bytes, 256);
    }
    if (e.kind == "all-reduce") {
      EXPECT_EQ(e.stream, 20);
    }
  }
  // Gaps: [1010, 1030) us idle, 15 us of it waiting for the launch that returned at 1025 us; then
  // [1040, 1050) idle with its launch (ended 1041) 1 us into it; the rest launched long before.
  ASSERT_EQ(imp.gaps.size(), 1u);
  EXPECT_NEAR(imp.gaps[0].launch_s, 16e-6, 1e-12);
  EXPECT_EQ(imp.gaps[0].launch_gaps, 2);
  // Busy: 10 + 10 + 30 + 5 + 4 + 1 us; idle: from 1000 to 1111 us less busy.
  EXPECT_NEAR(imp.gaps[0].busy_s, 60e-6, 1e-12);
  EXPECT_NEAR(imp.gaps[0].idle_s, 111e-6 - 60e-6, 1e-12);
}

TEST(NsysImport, EachProcesssStepIsTheDevicePeriodOfItsRanges) {
  // Two processes (Nsight's globalPid 1 << 24 and 2 << 24; their threads' globalTid add the
  // thread id), each opening its own ProfilerStep ranges. Process 1's host runs ahead of its GPU:
  // ranges of 16 us whose kernels end 19 us apart; process 2's ranges of 30 us end their work
  // 30 us apart. Each rank's step is its own process's device period (19 and 30 us), not the
  // mean of all the report's ranges (the 21.6 us it was).
  const std::string rows = R"(
INSERT INTO StringIds VALUES (1, 'ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn'),
  (4, 'cudaLaunchKernel');
INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (500, 1000, 1, 16777221, 1, 4, 0),
  (16500, 17000, 1, 16777221, 2, 4, 0), (32500, 33000, 1, 16777221, 3, 4, 0),
  (500, 1000, 1, 33554437, 4, 4, 0), (30500, 31000, 1, 33554437, 5, 4, 0);
INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES
  (2000, 19000, 0, 1, 7, 1, 16777216, 1, 1, 1, 1, 1),
  (21000, 38000, 0, 1, 7, 2, 16777216, 1, 1, 1, 1, 1),
  (40000, 57000, 0, 1, 7, 3, 16777216, 1, 1, 1, 1, 1),
  (2000, 25000, 0, 2, 7, 4, 33554432, 1, 1, 1, 1, 1),
  (32000, 55000, 0, 2, 7, 5, 33554432, 1, 1, 1, 1, 1);
INSERT INTO NVTX_EVENTS VALUES (0, 16000, 59, 0, 0, 0, 'ProfilerStep#1', 16777221, 16777221, NULL, 0),
  (16000, 32000, 59, 0, 0, 0, 'ProfilerStep#2', 16777221, 16777221, NULL, 0),
  (32000, 48000, 59, 0, 0, 0, 'ProfilerStep#3', 16777221, 16777221, NULL, 0),
  (0, 30000, 59, 0, 0, 0, 'ProfilerStep#1', 33554437, 33554437, NULL, 0),
  (30000, 60000, 59, 0, 0, 0, 'ProfilerStep#2', 33554437, 33554437, NULL, 0);
)";
  const std::string node = make_report("steps.sqlite", std::string(kSchema) + rows);
  const std::vector<ImportedTrace> parts = import_nsys_ranks(node, 0);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_NEAR(parts[0].step_s.at(0), 19e-6, 1e-15);
  EXPECT_NEAR(parts[1].step_s.at(1), 30e-6, 1e-15);
}

TEST(NsysImport, RanksMergeBesideKinetoTraces) {
  const std::string a = make_report("r0.sqlite", std::string(kSchema) + kRows);
  const std::string b = make_report("r1.sqlite", std::string(kSchema) + kRows);
  const std::string kineto =
      std::string(PARASOL_TEST_DATA_DIR) + "/traces/hta_sampled_rank-1.json.gz";
  // The Kineto trace says rank 1 itself (distributedInfo); the reports are ranks 0 and 2 by
  // their positions.
  const ImportedTrace imp = import_framework_traces({a, kineto, b});
  std::set<int> ranks;
  for (const TraceEvent& e : imp.trace.events) ranks.insert(e.rank);
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2}));
  EXPECT_EQ(imp.gaps.size(), 3u);
  // One ProfilerStep pair per report.
  EXPECT_EQ(imp.steps, 2);
}

TEST(NsysImport, BrokenReportsNameFileTableAndRow) {
  const std::string not_db = ::testing::TempDir() + "not.sqlite";
  std::ofstream(not_db) << "hello";
  EXPECT_NE(error_of([&] { import_nsys(not_db, 0); }).find("not an SQLite file"),
            std::string::npos);

  const std::string empty = make_report("empty.sqlite", "CREATE TABLE StringIds (id, value);");
  EXPECT_NE(error_of([&] {
              import_nsys(empty, 0);
            }).find("empty.sqlite.CUPTI_ACTIVITY_KIND_KERNEL: missing"),
            std::string::npos);

  const std::string backwards =
      make_report("backwards.sqlite", std::string(kSchema) + kRows +
                                          "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (2000, "
                                          "1000, 0, 1, 7, 9, 1, 1, 6, 1, 1, 1);");
  const std::string e1 = error_of([&] { import_nsys(backwards, 0); });
  EXPECT_NE(e1.find("backwards.sqlite.CUPTI_ACTIVITY_KIND_KERNEL[4].end: before its start"),
            std::string::npos)
      << e1;

  const std::string no_name =
      make_report("noname.sqlite", std::string(kSchema) + kRows +
                                       "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (2000, 3000, "
                                       "0, 1, 7, 9, 1, 77, 78, 1, 1, 1);");
  EXPECT_NE(error_of([&] {
              import_nsys(no_name, 0);
            }).find("CUPTI_ACTIVITY_KIND_KERNEL[4].demangledName"),
            std::string::npos);

  const std::string old_schema =
      make_report("old.sqlite",
                  "CREATE TABLE StringIds (id, value); CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL "
                  "(start, end, streamId, correlationId, demangledName);");
  EXPECT_NE(error_of([&] { import_nsys(old_schema, 0); }).find("shortName"), std::string::npos);

  // A truncated report: its first half.
  const std::string full = make_report("full.sqlite", std::string(kSchema) + kRows);
  std::ifstream in(full, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string cut = ::testing::TempDir() + "cut.sqlite";
  std::ofstream(cut, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  EXPECT_NE(error_of([&] { import_nsys(cut, 0); }).find(cut), std::string::npos);
}

}  // namespace
}  // namespace parasol::traces
