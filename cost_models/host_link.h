// Host <-> device copies (offload, prefetch, CPU optimizer traffic): the bandwidth one GPU gets
// when every GPU of its server copies at once, from the cluster graph: the GPU's own PCIe link,
// the PCIe switch uplink it shares with its neighbours, and its CPU socket's memory bandwidth
// shared by the GPUs copying into that socket; the copies reach the profile's
// host_copy_efficiency of the links, the host memory its host_memory_efficiency.
#pragma once

#include "core/cluster.h"
#include "cost_models/profile.h"

namespace parasol::cost {

// Bytes/s per direction of GPU `gpu`'s copies to or from host memory while every GPU of its
// server copies too, times the profile's host copy efficiency; 0 when the server has no host
// memory vertex.
double host_copy_bandwidth(const Cluster& cluster, const Profile& profile, int gpu);

}  // namespace parasol::cost
