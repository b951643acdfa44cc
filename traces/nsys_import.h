// Import of Nsight Systems reports exported to SQLite (`nsys export --type sqlite
// report.nsys-rep`), one file per rank, into parasol's trace schema (imported_trace.h), through
// SQLite's C library.
//
// Tables read (Nsight Systems' documented export schema; times in nanoseconds):
//   StringIds(id, value)                                   the strings the others name by id
//   CUPTI_ACTIVITY_KIND_KERNEL(start, end, streamId, correlationId, demangledName, shortName)
//   CUPTI_ACTIVITY_KIND_MEMCPY(start, end, streamId, correlationId, bytes, copyKind)   optional
//   CUPTI_ACTIVITY_KIND_MEMSET(start, end, streamId, correlationId, bytes)             optional
//   CUPTI_ACTIVITY_KIND_RUNTIME(start, end, correlationId)  optional: the launch calls
//   NVTX_EVENTS(text, textId)                               optional: "ProfilerStep#N" ranges
// Each kernel, memcpy and memset is an event of the file's rank (its position in the list) on its
// stream, its kind classify_kernel()'s of the kernel's demangled name (else its short name); a
// memcpy's copyKind 1 (host to device) is a "prefetch", 2 (device to host) an "offload", others
// "memcpy"; a memset is a "memset". The report carries no CPU ops' shapes, so kernels have no
// shapes and collectives no sizes (their kinds come from the NCCL kernel names). A launch gap's
// launch is the kernel's runtime call (by correlationId). Steps: the distinct ProfilerStep#N
// NVTX ranges (PyTorch's emit_nvtx), at least 1.
#pragma once

#include <string>
#include <vector>

#include "traces/imported_trace.h"

namespace parasol::traces {

// True when the file begins with SQLite's header ("SQLite format 3").
bool is_sqlite_file(const std::string& path);

// Imports one report as rank `rank`. A file that is not SQLite, a missing kernel table or
// column, and a row with a missing or negative time or an end before its start are a
// parasol::Error naming the file, the table and the row ("r.sqlite.CUPTI_ACTIVITY_KIND_KERNEL[3]
// .end: before its start").
ImportedTrace import_nsys(const std::string& path, int rank);

}  // namespace parasol::traces
