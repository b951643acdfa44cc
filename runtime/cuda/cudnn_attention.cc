// defines: CudnnAttention (runtime/cuda/cudnn_attention.h): the cuDNN frontend graphs of the fused
// attention's forward and backward, cached per shape, and their operands in the backend's scratch.
#include "runtime/cuda/cudnn_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "runtime/cuda/cuda_backend.h"
#include "runtime/cuda/kernels.h"

#if PARASOL_HAVE_CUDNN
#define CUDNN_FRONTEND_SKIP_JSON_LIB  // parasol's nlohmann/json is not the frontend's copy
#include <cudnn.h>
#include <cudnn_frontend.h>
#endif

namespace parasol::runtime {

#if PARASOL_HAVE_CUDNN

namespace fe = cudnn_frontend;

namespace {

// Tensor uids of the graphs' variant packs.
enum : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

// 256-byte aligned offsets into one scratch block.
struct Carver {
  size_t used = 0;
  size_t take(size_t bytes) {
    const size_t at = used;
    used += (bytes + 255) / 256 * 256;
    return at;
  }
};

// Row strides (elements between consecutive token rows) of a graph's operands: packed copies
// (the fp32 interface) or the runtime's own bf16 buffers (the typed entries).
struct RowStrides {
  int64_t q = 0, k = 0, v = 0, o = 0, dq = 0, dk = 0, dv = 0;
};
RowStrides packed_strides(const AttentionDims& d) {
  const int64_t H = d.heads, KH = d.kv_heads, D = d.head_dim, Dv = d.vd();
  return {H * D, KH * D, KH * Dv, H * Dv, H * D, KH * D, KH * Dv};
}

std::string key_of(const AttentionDims& d, const SdpaMask& m, bool backward, const RowStrides& ld) {
  uint32_t scale_bits = 0;
  const float scale = d.scale > 0.0f ? d.scale : 1.0f / std::sqrt(float(d.head_dim));
  std::memcpy(&scale_bits, &scale, sizeof(scale));
  std::string k = backward ? "bwd:" : "fwd:";
  for (int64_t x : {d.batch, d.seq_q, d.seq_kv, d.heads, d.kv_heads, d.head_dim, d.vd(),
                    int64_t{m.band}, m.right_bound, m.left_bound, int64_t{scale_bits}, ld.q, ld.k,
                    ld.v, ld.o, ld.dq, ld.dk, ld.dv})
    k += std::to_string(x) + ",";
  return k;
}

// bf16 token rows [batch, seq] of `ld` elements, head h at column h * dim, as cuDNN's [b, h, s, d]
// tensor.
fe::graph::Tensor_attributes bshd(const char* name, int64_t uid, int64_t b, int64_t h, int64_t s,
                                  int64_t dim, int64_t ld) {
  return fe::graph::Tensor_attributes()
      .set_name(name)
      .set_uid(uid)
      .set_dim({b, h, s, dim})
      .set_stride({s * ld, dim, ld, 1})
      .set_data_type(fe::DataType_t::BFLOAT16);
}

template <typename Attrs>
void apply_mask(Attrs& a, const SdpaMask& m) {
  if (!m.band) return;
  a.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT);
  a.set_diagonal_band_right_bound(static_cast<int>(m.right_bound));
  if (m.left_bound > 0) a.set_diagonal_band_left_bound(static_cast<int>(m.left_bound));
}

}  // namespace

struct CudnnAttention::Graphs {
  struct Entry {
    std::shared_ptr<fe::graph::Graph> graph;  // null: refused
    int64_t workspace = 0;
    std::string refusal;
  };
  cudnnHandle_t handle = nullptr;
  std::mutex mu;
  std::unordered_map<std::string, Entry> cache;

  // Builds (once) the graph of `key`; the entry says whether cuDNN supports it.
  const Entry& get(const std::string& key, const AttentionDims& d, const SdpaMask& m, bool backward,
                   const RowStrides& ld) {
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    Entry e;
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    const int64_t B = d.batch, H = d.heads, KH = d.kv_heads, Sq = d.seq_q, Skv = d.seq_kv,
                  D = d.head_dim, Dv = d.vd();
    const float scale = d.scale > 0.0f ? d.scale : 1.0f / std::sqrt(float(D));
    auto q = g->tensor(bshd("Q", kQ, B, H, Sq, D, ld.q));
    auto k = g->tensor(bshd("K", kK, B, KH, Skv, D, ld.k));
    auto v = g->tensor(bshd("V", kV, B, KH, Skv, Dv, ld.v));
    const std::vector<int64_t> stats_dim{B, H, Sq, 1}, stats_stride{H * Sq, Sq, 1, 1};
    if (!backward) {
      auto a =
          fe::graph::SDPA_attributes().set_name("sdpa").set_generate_stats(true).set_attn_scale(
              scale);
      apply_mask(a, m);
      auto [o, stats] = g->sdpa(q, k, v, a);
      o->set_output(true).set_uid(kO).set_dim({B, H, Sq, Dv}).set_stride({Sq * ld.o, Dv, ld.o, 1});
      stats->set_output(true)
          .set_uid(kStats)
          .set_data_type(fe::DataType_t::FLOAT)
          .set_dim(stats_dim)
          .set_stride(stats_stride);
    } else {
      auto o = g->tensor(bshd("O", kO, B, H, Sq, Dv, ld.o));
      auto dout = g->tensor(bshd("dO", kDO, B, H, Sq, Dv, ld.o));
      auto stats = g->tensor(fe::graph::Tensor_attributes()
                                 .set_name("Stats")
                                 .set_uid(kStats)
                                 .set_dim(stats_dim)
                                 .set_stride(stats_stride)
                                 .set_data_type(fe::DataType_t::FLOAT));
      auto a =
          fe::graph::SDPA_backward_attributes().set_name("sdpa_backward").set_attn_scale(scale);
      apply_mask(a, m);
      auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats, a);
      dq->set_output(true)
          .set_uid(kDQ)
          .set_dim({B, H, Sq, D})
          .set_stride({Sq * ld.dq, D, ld.dq, 1});
      dk->set_output(true)
          .set_uid(kDK)
          .set_dim({B, KH, Skv, D})
          .set_stride({Skv * ld.dk, D, ld.dk, 1});
      dv->set_output(true)
          .set_uid(kDV)
          .set_dim({B, KH, Skv, Dv})
          .set_stride({Skv * ld.dv, Dv, ld.dv, 1});
    }
    fe::error_t st = g->validate();
    if (st.is_good()) st = g->build_operation_graph(handle);
    if (st.is_good()) st = g->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK});
    if (st.is_good()) st = g->check_support(handle);
    if (st.is_good()) st = g->build_plans(handle);
    if (st.is_good()) st = g->get_workspace_size(e.workspace);
    if (st.is_good())
      e.graph = g;
    else
      e.refusal = "cuDNN does not support it: " + st.get_message();
    return cache.emplace(key, std::move(e)).first->second;
  }
};

#define PARASOL_CUDNN_CHECK(expr)                                                                 \
  do {                                                                                            \
    const cudnnStatus_t parasol_cudnn_status_ = (expr);                                           \
    if (parasol_cudnn_status_ != CUDNN_STATUS_SUCCESS)                                            \
      throw Error("runtime.cuda.cudnn",                                                           \
                  std::string(#expr) + " failed: " + cudnnGetErrorString(parasol_cudnn_status_)); \
  } while (0)

bool CudnnAttention::built() { return true; }

CudnnAttention::CudnnAttention(CudaBackend& backend)
    : backend_(backend), graphs_(std::make_unique<Graphs>()) {
  PARASOL_CUDNN_CHECK(cudnnCreate(&graphs_->handle));
  PARASOL_CUDNN_CHECK(cudnnSetStream(graphs_->handle, backend_.stream()));
}

CudnnAttention::~CudnnAttention() {
  if (graphs_ && graphs_->handle) cudnnDestroy(graphs_->handle);
}

std::string CudnnAttention::forward(const AttentionDims& d, const SdpaMask& mask, float* out,
                                    float* lse, const float* q, const float* k, const float* v,
                                    bool accumulate) {
  std::lock_guard<std::mutex> lock(graphs_->mu);
  const RowStrides ld = packed_strides(d);
  const Graphs::Entry& e = graphs_->get(key_of(d, mask, false, ld), d, mask, false, ld);
  if (!e.graph) return e.refusal;
  const int64_t Tq = d.batch * d.seq_q, Tk = d.batch * d.seq_kv, H = d.heads, KH = d.kv_heads,
                D = d.head_dim, Dv = d.vd();
  const cudaStream_t s = backend_.stream();
  Carver c;
  const size_t oq = c.take(2 * Tq * H * D), ok = c.take(2 * Tk * KH * D),
               ov = c.take(2 * Tk * KH * Dv), oo = c.take(2 * Tq * H * Dv),
               os = c.take(4 * d.batch * H * d.seq_q), ow = c.take(size_t(e.workspace));
  auto* base = static_cast<char*>(backend_.scratch(c.used));
  auto* qb = reinterpret_cast<uint16_t*>(base + oq);
  auto* kb = reinterpret_cast<uint16_t*>(base + ok);
  auto* vb = reinterpret_cast<uint16_t*>(base + ov);
  auto* ob = reinterpret_cast<uint16_t*>(base + oo);
  // Stats straight into lse, unless it is absent or the earlier steps' (merged below).
  float* stats = (lse == nullptr || accumulate) ? reinterpret_cast<float*>(base + os) : lse;
  cuda::pack_bf16(qb, q, Tq, H * D, d.ld_q, s);
  cuda::pack_bf16(kb, k, Tk, KH * D, d.ld_kv, s);
  cuda::pack_bf16(vb, v, Tk, KH * Dv, d.ld_kv, s);
  std::unordered_map<int64_t, void*> pack{{kQ, qb}, {kK, kb}, {kV, vb}, {kO, ob}, {kStats, stats}};
  fe::error_t st = e.graph->execute(graphs_->handle, pack, base + ow);
  if (!st.is_good()) throw Error("runtime.cuda.cudnn", "SDPA forward: " + st.get_message());
  if (accumulate)
    cuda::attention_merge_bf16(out, d.ld_o, lse, ob, stats, d.batch, d.seq_q, H, Dv, s);
  else
    cuda::unpack_bf16(out, d.ld_o, ob, Tq, H * Dv, false, s);
  return "";
}

std::string CudnnAttention::backward(const AttentionDims& d, const SdpaMask& mask, float* dq,
                                     float* dk, float* dv, const float* dout, const float* q,
                                     const float* k, const float* v, const float* out,
                                     const float* lse, bool accumulate_dq, bool accumulate_dkv) {
  std::lock_guard<std::mutex> lock(graphs_->mu);
  const RowStrides ld = packed_strides(d);
  const Graphs::Entry& e = graphs_->get(key_of(d, mask, true, ld), d, mask, true, ld);
  if (!e.graph) return e.refusal;
  const int64_t Tq = d.batch * d.seq_q, Tk = d.batch * d.seq_kv, H = d.heads, KH = d.kv_heads,
                D = d.head_dim, Dv = d.vd();
  const cudaStream_t s = backend_.stream();
  Carver c;
  const size_t oq = c.take(2 * Tq * H * D), ok = c.take(2 * Tk * KH * D),
               ov = c.take(2 * Tk * KH * Dv), oo = c.take(2 * Tq * H * Dv),
               odo = c.take(2 * Tq * H * Dv), odq = c.take(2 * Tq * H * D),
               odk = c.take(2 * Tk * KH * D), odv = c.take(2 * Tk * KH * Dv),
               ow = c.take(size_t(e.workspace));
  auto* base = static_cast<char*>(backend_.scratch(c.used));
  auto at = [&](size_t off) { return reinterpret_cast<uint16_t*>(base + off); };
  cuda::pack_bf16(at(oq), q, Tq, H * D, d.ld_q, s);
  cuda::pack_bf16(at(ok), k, Tk, KH * D, d.ld_kv, s);
  cuda::pack_bf16(at(ov), v, Tk, KH * Dv, d.ld_kv, s);
  cuda::pack_bf16(at(oo), out, Tq, H * Dv, d.ld_o, s);
  cuda::pack_bf16(at(odo), dout, Tq, H * Dv, d.ld_o, s);
  std::unordered_map<int64_t, void*> pack{
      {kQ, at(oq)},   {kK, at(ok)},   {kV, at(ov)},
      {kO, at(oo)},   {kDO, at(odo)}, {kDQ, at(odq)},
      {kDK, at(odk)}, {kDV, at(odv)}, {kStats, const_cast<float*>(lse)}};
  fe::error_t st = e.graph->execute(graphs_->handle, pack, base + ow);
  if (!st.is_good()) throw Error("runtime.cuda.cudnn", "SDPA backward: " + st.get_message());
  cuda::unpack_bf16(dq, d.ld_q, at(odq), Tq, H * D, accumulate_dq, s);
  cuda::unpack_bf16(dk, d.ld_kv, at(odk), Tk, KH * D, accumulate_dkv, s);
  cuda::unpack_bf16(dv, d.ld_kv, at(odv), Tk, KH * Dv, accumulate_dkv, s);
  return "";
}

std::string CudnnAttention::forward_bf16(const AttentionDims& d, const SdpaMask& mask,
                                         uint16_t* out, float* lse, const uint16_t* q,
                                         const uint16_t* k, const uint16_t* v, bool accumulate) {
  std::lock_guard<std::mutex> lock(graphs_->mu);
  const int64_t H = d.heads, Dv = d.vd(), Tq = d.batch * d.seq_q;
  // The output straight into `out`, unless a ring step merges it into the earlier steps'.
  RowStrides ld{d.ld_q, d.ld_kv, d.ld_kv, accumulate ? H * Dv : d.ld_o, 0, 0, 0};
  const Graphs::Entry& e = graphs_->get(key_of(d, mask, false, ld), d, mask, false, ld);
  if (!e.graph) return e.refusal;
  const cudaStream_t s = backend_.stream();
  Carver c;
  const size_t oo = c.take(accumulate ? 2 * Tq * H * Dv : 0),
               os = c.take(4 * d.batch * H * d.seq_q), ow = c.take(size_t(e.workspace));
  auto* base = static_cast<char*>(backend_.scratch(c.used));
  uint16_t* o = accumulate ? reinterpret_cast<uint16_t*>(base + oo) : out;
  float* stats = (lse == nullptr || accumulate) ? reinterpret_cast<float*>(base + os) : lse;
  std::unordered_map<int64_t, void*> pack{{kQ, const_cast<uint16_t*>(q)},
                                          {kK, const_cast<uint16_t*>(k)},
                                          {kV, const_cast<uint16_t*>(v)},
                                          {kO, o},
                                          {kStats, stats}};
  fe::error_t st = e.graph->execute(graphs_->handle, pack, base + ow);
  if (!st.is_good()) throw Error("runtime.cuda.cudnn", "SDPA forward (bf16): " + st.get_message());
  if (accumulate)
    cuda::attention_merge_into_bf16(out, d.ld_o, lse, o, stats, d.batch, d.seq_q, H, Dv, s);
  return "";
}

std::string CudnnAttention::backward_bf16(const AttentionDims& d, const SdpaMask& mask,
                                          uint16_t* dq, uint16_t* dk, uint16_t* dv,
                                          const uint16_t* dout, const uint16_t* q,
                                          const uint16_t* k, const uint16_t* v, const uint16_t* out,
                                          const float* lse, bool accumulate_dq,
                                          bool accumulate_dkv) {
  std::lock_guard<std::mutex> lock(graphs_->mu);
  const int64_t Tq = d.batch * d.seq_q, Tk = d.batch * d.seq_kv, H = d.heads, KH = d.kv_heads,
                D = d.head_dim, Dv = d.vd();
  // Gradients straight into their buffers, unless added to what those hold (then packed into
  // scratch and added, each element rounded once).
  RowStrides ld{d.ld_q,
                d.ld_kv,
                d.ld_kv,
                d.ld_o,
                accumulate_dq ? H * D : d.ld_q,
                accumulate_dkv ? KH * D : d.ld_kv,
                accumulate_dkv ? KH * Dv : d.ld_kv};
  const Graphs::Entry& e = graphs_->get(key_of(d, mask, true, ld), d, mask, true, ld);
  if (!e.graph) return e.refusal;
  const cudaStream_t s = backend_.stream();
  Carver c;
  const size_t odq = c.take(accumulate_dq ? 2 * Tq * H * D : 0),
               odk = c.take(accumulate_dkv ? 2 * Tk * KH * D : 0),
               odv = c.take(accumulate_dkv ? 2 * Tk * KH * Dv : 0),
               ow = c.take(size_t(e.workspace));
  auto* base = static_cast<char*>(backend_.scratch(c.used));
  auto at = [&](size_t off) { return reinterpret_cast<uint16_t*>(base + off); };
  uint16_t* gq = accumulate_dq ? at(odq) : dq;
  uint16_t* gk = accumulate_dkv ? at(odk) : dk;
  uint16_t* gv = accumulate_dkv ? at(odv) : dv;
  std::unordered_map<int64_t, void*> pack{{kQ, const_cast<uint16_t*>(q)},
                                          {kK, const_cast<uint16_t*>(k)},
                                          {kV, const_cast<uint16_t*>(v)},
                                          {kO, const_cast<uint16_t*>(out)},
                                          {kDO, const_cast<uint16_t*>(dout)},
                                          {kDQ, gq},
                                          {kDK, gk},
                                          {kDV, gv},
                                          {kStats, const_cast<float*>(lse)}};
  fe::error_t st = e.graph->execute(graphs_->handle, pack, base + ow);
  if (!st.is_good()) throw Error("runtime.cuda.cudnn", "SDPA backward (bf16): " + st.get_message());
  if (accumulate_dq) cuda::add_rows_bf16(dq, d.ld_q, gq, Tq, H * D, s);
  if (accumulate_dkv) {
    cuda::add_rows_bf16(dk, d.ld_kv, gk, Tk, KH * D, s);
    cuda::add_rows_bf16(dv, d.ld_kv, gv, Tk, KH * Dv, s);
  }
  return "";
}

#else  // !PARASOL_HAVE_CUDNN

struct CudnnAttention::Graphs {};

bool CudnnAttention::built() { return false; }
CudnnAttention::CudnnAttention(CudaBackend& backend) : backend_(backend) {}
CudnnAttention::~CudnnAttention() = default;

namespace {
const char* const kNotBuilt =
    "this build has no cuDNN frontend (configure found no cudnn_frontend.h: pip install "
    "nvidia-cudnn-frontend, or -DPARASOL_CUDNN_FRONTEND_INCLUDE=DIR)";
}

std::string CudnnAttention::forward(const AttentionDims&, const SdpaMask&, float*, float*,
                                    const float*, const float*, const float*, bool) {
  return kNotBuilt;
}
std::string CudnnAttention::backward(const AttentionDims&, const SdpaMask&, float*, float*, float*,
                                     const float*, const float*, const float*, const float*,
                                     const float*, const float*, bool, bool) {
  return kNotBuilt;
}
std::string CudnnAttention::forward_bf16(const AttentionDims&, const SdpaMask&, uint16_t*, float*,
                                         const uint16_t*, const uint16_t*, const uint16_t*, bool) {
  return kNotBuilt;
}
std::string CudnnAttention::backward_bf16(const AttentionDims&, const SdpaMask&, uint16_t*,
                                          uint16_t*, uint16_t*, const uint16_t*, const uint16_t*,
                                          const uint16_t*, const uint16_t*, const uint16_t*,
                                          const float*, bool, bool) {
  return kNotBuilt;
}

#endif

}  // namespace parasol::runtime
