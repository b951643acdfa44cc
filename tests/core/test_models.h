// Small models the lowering and liveness tests share: presets cut down, or given one feature
// each (latent attention, sliding windows, shared experts), small enough to lower in
// milliseconds.
#pragma once

#include "core/model.h"

namespace parasol::test_models {

// tiny-gpt (layernorm, gelu, dropout, learned positions) with `layers` layers.
inline Model tiny_gpt(int layers = 2) {
  Model m = model_preset("tiny-gpt");
  m.layers = layers;
  return m;
}

// Multi-head latent attention, with a query latent (q_lora) or a plain query projection.
inline Model tiny_mla(bool q_lora = true) {
  Model m = llama_model("tiny-mla", 2, 64, 4, 4, 128, 512, 64);
  m.mla = {q_lora ? 32 : 0, 16, 8, 4, 6};
  m.head_dim = m.mla.qk_head_dim();
  return m;
}

// tiny with sliding-window attention on every other layer.
inline Model tiny_windowed() {
  Model m = model_preset("tiny");
  m.name = "tiny-windowed";
  m.sliding_window = 16;
  m.full_attention_every = 2;
  return m;
}

// A dense first layer, then MoE layers with two shared experts.
inline Model tiny_shared() {
  Model m = model_preset("tiny-moe");
  m.name = "tiny-shared";
  m.layers = 3;
  m.moe.first_dense = 1;
  m.moe.shared_experts = 2;
  m.moe.shared_expert_ffn = 32;
  return m;
}

}  // namespace parasol::test_models
