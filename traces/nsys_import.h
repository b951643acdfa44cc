// Import of Nsight Systems reports exported to SQLite (`nsys export --type sqlite
// report.nsys-rep`), one file per rank, into parasol's trace schema (imported_trace.h), through
// SQLite's C library.
//
// Tables read (Nsight Systems' documented export schema; times in nanoseconds):
//   StringIds(id, value)                                   the strings the others name by id
//   CUPTI_ACTIVITY_KIND_KERNEL(start, end, streamId, correlationId, demangledName, shortName,
//                              globalPid, deviceId: optional)
//   CUPTI_ACTIVITY_KIND_MEMCPY(start, end, streamId, correlationId, bytes, copyKind)   optional
//   CUPTI_ACTIVITY_KIND_MEMSET(start, end, streamId, correlationId, bytes)             optional
//   CUPTI_ACTIVITY_KIND_RUNTIME(start, end, correlationId)  optional: the launch calls
//   NVTX_EVENTS(text, textId, start, end)                   optional: "ProfilerStep#N" ranges
// Each kernel, memcpy and memset is an event of a rank on its stream: a report of one process on
// one GPU is one rank, one of several processes or GPUs (globalPid, deviceId of the activity
// tables) one rank per (process, GPU) in that order; its kind classify_kernel()'s of the kernel's
// demangled name (else its short name);  a memcpy is a "memcpy" named by its copyKind ("Memcpy
// HtoD", "Memcpy DtoH"; label_copies_by_plan makes the plan's offloads and prefetches of them); a
// memset is a "memset". The report carries no CPU ops' shapes, so kernels have no shapes and
// collectives no sizes (their kinds come from the NCCL kernel names). A launch gap's launch is the
// kernel's runtime call (by correlationId). Steps: the distinct ProfilerStep#N NVTX ranges
// (PyTorch's emit_nvtx), at least 1; their mean duration is the step time of each of the report's
// ranks (ImportedTrace::step_s).
#pragma once

#include <string>
#include <vector>

#include "traces/imported_trace.h"

namespace parasol::traces {

// True when the file begins with SQLite's header ("SQLite format 3").
bool is_sqlite_file(const std::string& path);

// Imports one report as ranks first_rank, first_rank + 1, ... (one per (process, GPU) of its
// activities; errors as import_nsys's).
std::vector<ImportedTrace> import_nsys_ranks(const std::string& path, int first_rank);

// Imports one report as rank `rank` (several processes or GPUs: ranks rank, rank + 1, ...,
// merged). A file that is not SQLite, a missing kernel table or
// column, and a row with a missing or negative time or an end before its start are a
// parasol::Error naming the file, the table and the row ("r.sqlite.CUPTI_ACTIVITY_KIND_KERNEL[3]
// .end: before its start").
ImportedTrace import_nsys(const std::string& path, int rank);

}  // namespace parasol::traces
