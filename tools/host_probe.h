// A quick measurement of this host's CPU as a device of the CPU runtime (`parasol calibrate
// --probe`, under 2 seconds): the cblas_sgemm rate (OpenBLAS, the runtime's GEMM), a STREAM-like
// triad and a memcpy. The figures become the "cpu-host" device's peak and bandwidth, carried by
// a Profile (Profile::measured_device) that estimate, simulate and search accept with
// --profile and calibrate with --base.
#pragma once

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
};

// Measures the host with `threads` threads. Takes about 1.5 s.
HostProbe probe_host(int threads);

// The "cpu-host" default Profile carrying the probe's figures as its measured device: peak FLOP/s
// of every dtype = sgemm_flops (the CPU backend computes in fp32), bandwidth = triad_bw, memory =
// the host's memory. The copy measurements set the copy-bound efficiencies against the
// localhost preset's nominal 12 GB/s links (core/cluster_generators.cc): host_copy_efficiency =
// memcpy payload rate / 12 GB/s, shm link efficiency = half of that (MPI's shared-memory path
// copies a message twice), both clipped to [0.01, 1].
cost::Profile host_profile(const HostProbe& probe);

}  // namespace parasol::tools
