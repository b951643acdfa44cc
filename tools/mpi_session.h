// MPI for the duration of a command (`parasol run`, `parasol calibrate --probe` under mpirun):
// initialised here (MPI_THREAD_SERIALIZED) unless the caller already did, finalised by its owner.
#pragma once

#include <mpi.h>

namespace parasol::tools {

struct MpiSession {
  MpiSession() {
    int init = 0;
    MPI_Initialized(&init);
    if (!init) {
      int provided = 0;
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
      owner = true;
    }
  }
  ~MpiSession() {
    if (owner) MPI_Finalize();
  }
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  bool owner = false;
};

}  // namespace parasol::tools
