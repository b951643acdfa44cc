// tools/link_probe.h: the CPU probe on rank 0, then all-reduces of the MPI communicator timed.
#include "tools/link_probe.h"

#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <vector>

#include "core/plan.h"
#include "runtime/comm/mpi_communicator.h"
#include "tools/mpi_session.h"

namespace parasol::tools {

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(v) != nullptr) return true;
  return false;
}

namespace {

// Seconds of one all-reduce of `bytes` on `comm`: the best of 5 trials of the mean over
// `calls` calls, each trial's time the slowest rank's.
double time_all_reduce(runtime::Communicator& comm, double bytes) {
  const auto count = static_cast<int64_t>(bytes / sizeof(float));
  std::vector<float> buf(static_cast<size_t>(count), 0.0f);  // zeros: sums stay finite
  const int calls = std::clamp(static_cast<int>((8 << 20) / bytes), 4, 64);
  for (int i = 0; i < 2; ++i) comm.iall_reduce(buf.data(), count, Dtype::kFp32).wait();
  double best = std::numeric_limits<double>::infinity();
  for (int trial = 0; trial < 5; ++trial) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    for (int i = 0; i < calls; ++i) comm.iall_reduce(buf.data(), count, Dtype::kFp32).wait();
    double mine = (MPI_Wtime() - t0) / calls, slowest = 0;
    MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    best = std::min(best, slowest);
  }
  return best;
}

}  // namespace

bool probe_host_and_link(int threads, HostProbe& out) {
  if (!launched_by_mpi()) {
    out = probe_host(threads);
    return true;
  }
  MpiSession mpi;
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  // The CPU as a process on its own measures it; the other ranks wait.
  if (rank == 0) out = probe_host(threads);
  MPI_Barrier(MPI_COMM_WORLD);
  if (world >= 2) {
    Plan plan;
    plan.tp = world;  // one group of every rank
    auto comms = runtime::make_mpi_comm_set(plan, MPI_COMM_WORLD);
    out.link_ranks = world;
    for (double kib : {4, 64, 256, 1024, 4096})
      out.all_reduce.emplace_back(kib * 1024, time_all_reduce(comms->tp(), kib * 1024));
  }
  return rank == 0;
}

}  // namespace parasol::tools
