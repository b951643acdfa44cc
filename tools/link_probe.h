// The link half of `parasol calibrate --probe`: under mpirun (`mpirun -np N parasol calibrate
// --probe`), rank 0 probes the CPU alone (tools/host_probe.h) while the others wait, then every
// rank times in-place fp32 all-reduces of the runtime's own MPI communicator
// (runtime/comm/mpi_communicator.h, as `parasol run` moves a tensor-parallel activation or a
// gradient bucket) over all ranks at 4 KiB to 4 MiB: at each size the best of 5 trials of the
// mean over several calls, each trial's time the slowest rank's. host_profile fits the shm link
// to them. A process not started by mpirun probes the CPU only, without initialising MPI.
#pragma once

#include "tools/host_probe.h"

namespace parasol::tools {

// Whether this process was started by an MPI launcher (Open MPI's, PMI or PMIx environment).
bool launched_by_mpi();

// A PeerProbe (tools/host_probe.h): the CPU probe, and under mpirun with 2 or more ranks the
// all-reduce times. Returns true on the rank that reports (rank 0, or a process on its own).
bool probe_host_and_link(int threads, HostProbe& out);

}  // namespace parasol::tools
