// Megatron-Core's own arithmetic of a pipeline split with the embedding and the loss accounted
// as layers, restated from NVIDIA/Megatron-LM d98e8a6 (megatron/core/transformer/
// transformer_block.py get_num_layers_to_build and transformer_layer.py
// get_transformer_layer_offset) as an oracle independent of core/plan.cc, for the tests of
// Plan::layers_in_chunk / first_layer and of the lowering.
#pragma once

namespace parasol::megatron_oracle {

struct AccountedSplit {
  int layers;      // --num-layers
  int pp;          // --pipeline-model-parallel-size
  int vpp;         // virtual stages per pipeline rank (1 = None)
  bool embedding;  // --account-for-embedding-in-pipeline-split
  bool loss;       // --account-for-loss-in-pipeline-split

  // get_num_layers_to_build(config, vp_stage, pp_rank) without a layout or first/last counts.
  int to_build(int pp_rank, int vp_stage) const {
    const int num_layers = layers + (embedding ? 1 : 0) + (loss ? 1 : 0);
    const int per_rank = num_layers / pp;
    const bool interleaved = vpp > 1 && pp > 1;
    int n = interleaved ? per_rank / vpp : per_rank;
    const bool vp_first = !interleaved || vp_stage == 0;
    const bool vp_last = !interleaved || vp_stage == vpp - 1;
    if (embedding && vp_first && pp_rank == 0) n -= 1;
    if (loss && vp_last && pp_rank == pp - 1) n -= 1;
    return n;
  }

  // get_transformer_layer_offset(config, vp_stage, pp_rank): the global index of the first
  // decoder layer the virtual stage builds.
  int offset(int pp_rank, int vp_stage) const {
    if (pp <= 1) return 0;
    const int num_layers = layers + (embedding ? 1 : 0) + (loss ? 1 : 0);
    const int per_rank = num_layers / pp;
    const bool interleaved = vpp > 1;
    int offset = 0;
    if (interleaved) {
      const int per_virtual_rank = per_rank / vpp;
      const int total_virtual_chunks = num_layers / vpp;
      offset = vp_stage * total_virtual_chunks + pp_rank * per_virtual_rank;
    } else {
      offset = pp_rank * per_rank;
    }
    const bool vp_first = !interleaved || vp_stage == 0;
    if (embedding && !(vp_first && pp_rank == 0)) offset -= 1;
    return offset;
  }
};

}  // namespace parasol::megatron_oracle
