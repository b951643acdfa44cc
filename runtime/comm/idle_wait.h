// How a rank waits on its peers without a blocking call: the MPI communicator's MPI_Test loops
// and the executor's polling of its in-flight transfers. MPI progresses a transfer only inside
// an MPI call, so the waiting rank must keep calling; the question is what it does between calls.
//   - With a core for every rank of the host (the runtime's design: one rank, one core), it
//     spins, yielding its core (sched_yield) between calls: Open MPI's own choice when a node is
//     not oversubscribed. A sleep there costs every wait its oversleep: a 20 us sleep lasts
//     ~70 us with Linux's default timer slack, and on a 2-core host it made each 3 MB gradient
//     all-reduce take ~2 ms, with the rank asleep while the transfer waited on it. After 1 ms
//     of spinning (a peer that is far behind, or other jobs on the host) it sleeps as below.
//   - When the host's ranks outnumber its cores (the tests' 8 ranks on 2 cores), spinning
//     steals the core of the rank being waited on, so after 64 idle calls it sleeps 20 us, as
//     Open MPI's mpi_yield_when_idle does for an oversubscribed node.
// make_mpi_comm_set tells it how many ranks share this host; until then (a rank outside MPI, a
// unit test) it assumes the host is oversubscribed, the choice that never starves a peer.
#pragma once

#include <chrono>

namespace parasol::runtime {

// Records that `ranks` ranks of this job run on this host (MPI_COMM_TYPE_SHARED); the host is
// oversubscribed when they outnumber the cores this process may run on.
void set_ranks_on_host(int ranks);
// Whether waiting ranks sleep (true) or spin (false); see above.
bool host_oversubscribed();
// The cores this process may run on (its affinity mask; the hardware's count without one).
int usable_cores();

// One wait: pause() between two polls of whatever is awaited.
class IdleWait {
 public:
  void pause();

 private:
  int idle_ = 0;
  std::chrono::steady_clock::time_point spin_until_{};
};

}  // namespace parasol::runtime
