// A quick measurement of this host's CPU as a device of the CPU runtime (`parasol calibrate
// --probe`, under 2 seconds): the cblas_sgemm rate (OpenBLAS, the runtime's GEMM), a STREAM-like
// triad and a memcpy; under mpirun also the all-reduce of the runtime's MPI communicator between
// the ranks (tools/link_probe.h). The figures become the "cpu-host" device's peak and bandwidth
// and its shared-memory link, carried by a Profile (Profile::measured_device) that estimate,
// simulate and search accept with --profile and calibrate with --base.
#pragma once

#include <functional>
#include <utility>
#include <vector>

#include "cost_models/profile.h"

namespace parasol::tools {

struct HostProbe {
  int threads = 1;          // OpenBLAS and triad threads (one rank's share of the host)
  double sgemm_flops = 0;   // best cblas_sgemm FLOP/s over n = 256, 512, 1024 (row-major,
                            // no transpose, fp32)
  int sgemm_n = 0;          // the n that reached it
  double triad_bw = 0;      // a[i] = b[i] + s * c[i] over three 32 MiB float arrays: bytes read
                            // and written per second, best of repeats
  double copy_bw = 0;       // memcpy of 32 MiB: bytes read and written per second, best
  double memory_bytes = 0;  // physical memory of the host
  double wall_s = 0;        // time the probe took
  // Under mpirun (tools/link_probe.h): the ranks of this host that took part and the time of
  // one in-place fp32 all-reduce over all of them, (bytes, seconds) per size; empty otherwise.
  int link_ranks = 0;
  std::vector<std::pair<double, double>> all_reduce;
};

// Measures the host with `threads` threads. Takes about 1.5 s.
HostProbe probe_host(int threads);

// A probe that may also measure the link between ranks (tools/link_probe.h): fills `out` and
// returns whether this process reports it (rank 0 of an MPI job, or a process on its own).
using PeerProbe = std::function<bool(int threads, HostProbe& out)>;

// The "cpu-host" default Profile carrying the probe's figures as its measured device: peak FLOP/s
// of every dtype = sgemm_flops (the CPU backend computes in fp32), bandwidth = triad_bw, memory =
// the host's memory. The copy measurements set the copy-bound efficiencies against the
// localhost preset's nominal 12 GB/s links (core/cluster_generators.cc): host_copy_efficiency =
// memcpy payload rate / 12 GB/s. The shm link: with all-reduce measurements, the link
// efficiency and collective step latency whose price of those all-reduces (cost/collective.h,
// the localhost preset with link_ranks GPUs) fits their times best (least squares of the log
// ratio, within calibrate's bounds: [0.01, 1] and [0, 1 ms]). Without them, half of the memcpy
// efficiency (a message copied twice), which Open MPI's shared-memory all-reduce did not reach
// on the 2-core VM the loop check runs on (a 256 KiB all-reduce took ~220 us, not ~40 us).
cost::Profile host_profile(const HostProbe& probe);
// The (shm link efficiency, collective step latency in seconds) that fit `probe.all_reduce`
// best, starting from `base`'s. REQUIRES: probe.link_ranks >= 2 and measurements.
std::pair<double, double> fit_shm_link(const HostProbe& probe, const cost::Profile& base);

}  // namespace parasol::tools
