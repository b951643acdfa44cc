// Compute cost model: GEMM shape factor (tile and wave quantization), memory-bound kernels,
// attention (fused and unfused), and the optimizer step.
#include "cost_models/compute.h"

#include <algorithm>
#include <cmath>

#include "core/optimizer_traffic.h"

namespace parasol::cost {

namespace {
struct Tile {
  int64_t m, n;
  double efficiency;  // relative throughput of the tile shape (large tiles reuse operands best)
};
// cuBLAS/CUTLASS tensor-core tile shapes and their relative throughput. 256x128 is cuBLAS's
// largest and fastest tile on Ampere/Hopper (NVIDIA, "Matrix Multiplication Background User's
// Guide", section 2.3). The smaller tiles' figures are parasol's estimate, not a cited
// measurement: operand traffic per FLOP grows as (m + n) / (m n), by 1.33x, 2x and 2.67x from
// 256x128 to 128x128, 128x64 and 64x64, and a tile loses throughput once that traffic outruns
// shared memory; the figures fall more gently than the traffic rises. They decide only which
// tile wins against wave quantisation on small or odd shapes (gemm_shape_factor).
constexpr double kTile128x128 = 0.93, kTile128x64 = 0.82, kTile64x64 = 0.65;
constexpr Tile kTiles[] = {{256, 128, 1.0},
                           {128, 256, 1.0},
                           {128, 128, kTile128x128},
                           {128, 64, kTile128x64},
                           {64, 64, kTile64x64}};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Split-K. When a GEMM's output has too few tiles to occupy the GPU and its reduction is deep,
// the libraries split the reduction (k) across thread blocks and sum the partial tiles (CUTLASS,
// media/docs/efficient_gemm.md, "Parallelized Reductions": "If both M and N are small while K is
// large, this scheme may launch relatively few threadblocks and fail to make full use of all
// multiprocessors ... partition the GEMM K dimension across multiple threadblocks"; cuBLAS does it
// too: HTA's A100 trace, tests/data/traces/hta_sampled_rank-0, has cuBLAS's
// splitKreduce_kernel after its GEMMs of 125-200 x 64-512 outputs and k = 2048). When and how
// far, as CUTLASS 3's stream-K scheduler decides it (include/cutlass/gemm/kernel/
// tile_scheduler_params.h, get_num_sk_tiles and get_num_sk_units, DecompositionMode::Heuristic):
// the tiles are split only when the last wave is less than half full and a tile's k loop has more
// than kMinKItersPerUnit iterations; the split tiles' k iterations are then shared evenly by
// min(SMs, iterations / kMinKItersPerUnit) thread blocks. CUTLASS splits the last one or two
// waves of a longer GEMM as well; cuBLAS's large GEMMs keep their wave quantization (NVIDIA,
// "Matrix Multiplication Background User's Guide", section 2.3, measured with cuBLAS), so
// parasol splits only a GEMM of less than half a wave of tiles: the case both libraries split.
// The partial tiles (one fp32 tile per thread block) are summed through L2 and not priced.
constexpr int64_t kMinKItersPerUnit = 8;  // CUTLASS's min_iters_per_sk_unit_
// The k depth of one main-loop iteration of a tile: 32 in cuBLAS's Ampere tensor-core kernels
// (cutlass_80_tensorop_s1688gemm_128x128_32x3: 128 x 128 tile, k 32, 3 stages; HTA's trace) and
// CUTLASS's bf16 SM80 defaults; Hopper's bf16 kernels step 64 (a longer k loop splits sooner).
constexpr int64_t kTileK = 32;

// Waves of `tiles` output tiles of a GEMM with k reduction depth on `units` SMs, fractional where
// split-K shares a partial wave's k loop among more thread blocks (above).
double gemm_waves(double tiles, double units, int64_t k) {
  const double waves = std::ceil(tiles / units);
  const double k_iters = static_cast<double>(ceil_div(k, kTileK));
  if (2 * tiles >= units || k_iters <= kMinKItersPerUnit) return waves;
  const double split_units =
      std::min(units, std::floor(tiles * k_iters / static_cast<double>(kMinKItersPerUnit)));
  // Each of split_units blocks runs ceil(tiles x k_iters / split_units) iterations.
  return std::min(waves, std::ceil(tiles * k_iters / split_units) / k_iters);
}
}  // namespace

double gemm_k_half_of(const DeviceSpec& dev, const Profile& prof, Dtype dtype) {
  if (dev.vendor == "cpu") return prof.gemm_k_half;
  const double peak = dev.peak_flops(dtype), bf16 = dev.peak_flops(Dtype::kBf16);
  if (peak <= 0 || bf16 <= 0) return prof.gemm_k_half;
  return prof.gemm_k_half * peak / bf16;
}

double gemm_shape_factor(const DeviceSpec& dev, const Profile& prof, int64_t m, int64_t n,
                         int64_t k, int64_t batch, Dtype dtype) {
  if (m <= 0 || n <= 0 || k <= 0 || batch <= 0) return 1.0;
  const double kf = k / (k + gemm_k_half_of(dev, prof, dtype));
  // A CPU BLAS blocks a GEMM into register tiles of a few rows and columns (OpenBLAS sgemm:
  // 16 x 6 on AVX-512) and has no waves of thread blocks: no tile quantization to speak of.
  if (dev.vendor == "cpu") return kf;
  const double units = std::max(1, dev.compute_units);
  double best = 0;
  for (const Tile& t : kTiles) {
    double tiles = static_cast<double>(batch) * ceil_div(m, t.m) * ceil_div(n, t.n);
    double waves = gemm_waves(tiles, units, k);
    double useful = static_cast<double>(batch) * m * n / (waves * units * t.m * t.n);
    best = std::max(best, t.efficiency * useful);
  }
  return best * kf;
}

double gemm_time(const DeviceSpec& dev, const Profile& prof, Dtype dtype, int64_t m, int64_t n,
                 int64_t k, int64_t batch) {
  if (m <= 0 || n <= 0 || k <= 0 || batch <= 0) return 0;
  double flops = 2.0 * m * n * k * batch;
  double rate = dev.peak_flops(dtype) * prof.gemm_eff(dtype) *
                gemm_shape_factor(dev, prof, m, n, k, batch, dtype);
  double bytes =
      dtype_bytes(dtype) * batch *
      (static_cast<double>(m) * k + static_cast<double>(k) * n + static_cast<double>(m) * n);
  return std::max(flops / rate, bytes / (dev.hbm_bw * prof.memory_efficiency)) +
         prof.kernel_overhead_s;
}

double memory_time(const DeviceSpec& dev, const Profile& prof, double bytes) {
  if (bytes <= 0) return 0;
  return bytes / (dev.hbm_bw * prof.memory_efficiency) + prof.kernel_overhead_s;
}

double small_kernels_time(const DeviceSpec& dev, const Profile& prof, double bytes,
                          int64_t kernels) {
  return memory_time(dev, prof, bytes) +
         static_cast<double>(std::max<int64_t>(1, kernels) - 1) * prof.kernel_overhead_s;
}

double fp8_quantize_time(const DeviceSpec& dev, const Profile& prof, double elements) {
  return memory_time(dev, prof, 4.0 * elements);
}

Dtype output_layer_dtype(Dtype precision) {
  return precision == Dtype::kFp8 ? Dtype::kBf16 : precision;
}

double linear_gemm_time(const DeviceSpec& dev, const Profile& prof, Dtype dtype, int64_t m,
                        int64_t n, int64_t k, int64_t batch, GemmPass pass, bool router) {
  batch = std::max<int64_t>(1, batch);
  double t = gemm_time(dev, prof, dtype, m, n, k, batch);
  if (dtype == Dtype::kFp8 && !router && pass != GemmPass::kWeightGrad)
    t += fp8_quantize_time(dev, prof, static_cast<double>(m) * k * batch);
  return t;
}

double multi_stream_expert_gemm_time(const DeviceSpec& dev, const Profile& prof, Dtype dtype,
                                     int64_t m, int64_t n, int64_t k, int64_t experts,
                                     GemmPass pass) {
  const int64_t rounds = experts / kExpertGemmStreams, rest = experts % kExpertGemmStreams;
  double t = 0;
  if (rounds > 0)
    t += static_cast<double>(rounds) *
         linear_gemm_time(dev, prof, dtype, m, n, k, kExpertGemmStreams, pass, false);
  if (rest > 0) t += linear_gemm_time(dev, prof, dtype, m, n, k, rest, pass, false);
  return t;
}

namespace {
// Throughput at head dim `d` relative to head dim 128: log-linear in log2(d) through the
// figures at 64 and 256, held beyond them.
double head_dim_factor(const Profile::AttentionShape& sh, int64_t d) {
  if (d <= 0) return 1;
  const double t = std::clamp(std::log2(static_cast<double>(d)) - 7.0, -1.0, 1.0);
  return t < 0 ? std::pow(sh.head_dim_64, -t) : std::pow(sh.head_dim_256, t);
}
// Fraction of the plateau a pass reaches with `s` keys per query row, masked or not.
double row_factor(const Profile::AttentionShape& sh, double s, bool causal) {
  const double half = causal ? sh.causal_s_half : sh.s_half;
  return (causal ? sh.causal_plateau : 1.0) * (s > 0 ? s / (s + half) : 1.0);
}
}  // namespace

double attention_efficiency(const Profile& prof, const AttnShape& a, bool backward, int ring) {
  const Profile::AttentionShape& sh = prof.attention_shape_of(a.kernel, backward);
  const double base = prof.attention_eff(a.kernel, backward) * head_dim_factor(sh, a.head_dim);
  if (!a.causal) return base * row_factor(sh, static_cast<double>(a.seq_kv), false);
  if (ring > 1) {
    // One causal step over the rank's chunk pair, ring - 1 unmasked steps against half as many
    // keys; time adds, so rates combine harmonically.
    const double chunk = static_cast<double>(a.seq_q);
    const double diagonal = row_factor(sh, chunk, true),
                 rectangle = row_factor(sh, chunk / 2, false);
    return base / ((1.0 / diagonal + (ring - 1) / rectangle) / ring);
  }
  double s = static_cast<double>(a.seq_kv);
  if (a.window > 0) s = std::min<double>(s, a.window);
  return base * row_factor(sh, s, true);
}

double context_ring_merge_bytes(const AttnShape& a, int ring, bool backward, double eb,
                                CpImpl impl) {
  if (ring <= 1) return 0;
  const double dv = static_cast<double>(a.v_head_dim > 0 ? a.v_head_dim : a.head_dim);
  const double tokens = static_cast<double>(a.batch) * static_cast<double>(a.seq_q);
  const double q = eb * tokens * a.heads * a.head_dim;  // Q (dQ) of the rank's chunk pair
  const double o = eb * tokens * a.heads * dv;          // O (dO), in the attention's dtype
  const double kv = eb * tokens * a.kv_heads * (a.head_dim + dv);
  const double later = ring - 1;  // steps after the first (the causal one on the own chunk)
  double total;
  if (impl == CpImpl::kPytorch) {
    // torch/distributed/tensor/experimental/_attention.py @0123248 (the ALL_GATHER rotater's
    // buffer and the fp32 dK/dV exchange are ops of the lowering). f: fp32 bytes per byte of the
    // attention's dtype. A rank runs (ring - 1) / 2 lower and as many upper steps on average.
    const double f = 4.0 / eb;
    const double half = later / 2;
    const double cats = later * 2 * kv;  // torch.cat([key.flatten(), value.flatten()])
    if (!backward) {
      // _SDPAMerger.step: out_i.to(float32) (read, write fp32); _merge_one: out - out_i (read two
      // fp32, write one), sigmoid(lse_i - lse) * that (read, write), out - that (read two,
      // write one); an upper step on half, then _partial_update's torch.cat (read, write fp32).
      const double merge = o + 9 * f * o;
      total = (o + f * o) + half * merge + half * (0.5 * merge + 2 * f * o) + cats +
              (f * o + o);  // step 0's upcast ... results(): out.to(out_dtype)
    } else {
      // zeros_like(q, k, v, fp32); step 0: grad_key/value += (fp32 += eb) and grad_query +=;
      // lower: grad_query += whole, dK/dV half added then torch.cat'd back (the addition is the
      // lowering's dkv.acc); upper: dQ half added and torch.cat'd back; every step:
      // torch.cat([grad_key, grad_value]) in fp32; the end: grad_query.to(query.dtype).
      const double add_q = (2 * f + 1) * q;
      total = f * (q + kv) + cats + (2 * f + 1) * kv + add_q + half * (add_q + 2 * f * kv) +
              half * (0.5 * add_q + 2 * f * q) + ring * 2 * f * kv + (f * q + q);
    }
    return total / ring;
  }
  if (!backward) {
    // cp.py (TE@d0067d0 transformer_engine/pytorch/attention/dot_product_attention/
    // context_parallel.py): k_part/v_part.contiguous() (lower-triangle, L872-873) or
    // q_part.contiguous() (upper-triangle, L887); out correction in fp32 (L1980-2028): the first
    // step read (eb) and written fp32 (4 bytes an element), a full step read (eb) plus the fp32
    // out read and written, an upper step half of that; the final out.to(nominal dtype).
    const double f32 = 4.0 / eb;          // the fp32 output's bytes per byte of the step's output
    const double full = o + 2 * f32 * o;  // a lower step's merge: read out_i, read and write out
    const double first = o + f32 * o;
    const double step = 0.5 * (full + 0.5 * full);  // lower and upper steps alike on average
    const double cast = f32 * o + o;
    total = later * 0.5 * (kv + q) + first + later * step + cast;
  } else {
    // cp.py backward: k_part/v_part.contiguous() (lower, L1172-1173) or q, out, dout halves
    // contiguous (upper, L1178); dq.copy_ on the first step, dq.add_ (read dq, dq_; write dq) on
    // a full step and on half of dQ on an upper step (L2655-2698).
    const double copies = 0.5 * (kv + (q + 2 * o));
    total = later * copies + 2 * q + later * 0.5 * (3 * q + 1.5 * q);
  }
  return total / ring;
}

double attention_forward_time(const DeviceSpec& dev, const Profile& prof, Dtype dtype,
                              const AttnShape& a, int ring, CpImpl impl) {
  const double eb = dtype_bytes(dtype);
  if (a.flash) {
    double flops = attention_flops(a);
    double io = eb * a.batch * a.seq_q * (2.0 * a.heads * a.head_dim) +
                eb * a.batch * a.seq_kv * (2.0 * a.kv_heads * a.head_dim);
    return std::max(flops / (dev.peak_flops(dtype) * attention_efficiency(prof, a, false, ring)),
                    io / (dev.hbm_bw * prof.memory_efficiency)) +
           prof.kernel_overhead_s +
           (ring > 1 ? memory_time(dev, prof, context_ring_merge_bytes(a, ring, false, eb, impl))
                     : 0);
  }
  // Unfused: scores = QK^T (full matrix, masked afterwards), softmax, dropout, probs x V.
  const int64_t bh = a.batch * a.heads;
  double scores = static_cast<double>(bh) * a.seq_q * a.seq_kv;
  double t = gemm_time(dev, prof, dtype, a.seq_q, a.seq_kv, a.head_dim, bh);
  t += memory_time(dev, prof, scores * 2 * eb);  // fused scale-mask-softmax: read + write
  if (a.dropout) t += memory_time(dev, prof, scores * (2 * eb + 1));  // read, write, mask
  t += gemm_time(dev, prof, dtype, a.seq_q, a.head_dim, a.seq_kv, bh);
  return t;
}

double attention_backward_time(const DeviceSpec& dev, const Profile& prof, Dtype dtype,
                               const AttnShape& a, int ring, CpImpl impl) {
  const double eb = dtype_bytes(dtype);
  if (a.flash) {
    double flops = kFlashBackwardFlopRatio * attention_flops(a);
    double io = eb * a.batch * a.seq_q * (4.0 * a.heads * a.head_dim) +
                eb * a.batch * a.seq_kv * (4.0 * a.kv_heads * a.head_dim);
    return std::max(flops / (dev.peak_flops(dtype) * attention_efficiency(prof, a, true, ring)),
                    io / (dev.hbm_bw * prof.memory_efficiency)) +
           prof.kernel_overhead_s +
           (ring > 1 ? memory_time(dev, prof, context_ring_merge_bytes(a, ring, true, eb, impl))
                     : 0);
  }
  const int64_t bh = a.batch * a.heads;
  double scores = static_cast<double>(bh) * a.seq_q * a.seq_kv;
  // d(probs) = dO V^T and dV = P^T dO; then dropout and softmax backward; then dQ and dK.
  double t = gemm_time(dev, prof, dtype, a.seq_q, a.seq_kv, a.head_dim, bh);
  t += gemm_time(dev, prof, dtype, a.seq_kv, a.head_dim, a.seq_q, bh);
  if (a.dropout) t += memory_time(dev, prof, scores * (2 * eb + 1));
  t += memory_time(dev, prof, scores * 3 * eb);  // softmax backward: read y, dy; write dx
  t += gemm_time(dev, prof, dtype, a.seq_q, a.head_dim, a.seq_kv, bh);
  t += gemm_time(dev, prof, dtype, a.seq_kv, a.head_dim, a.seq_q, bh);
  return t;
}

double adam_bytes_per_param(Dtype dtype, Dtype state) {
  return adam_traffic_per_param(dtype, state).total();  // core/optimizer_traffic.h
}

double optimizer_time(const DeviceSpec& dev, const Profile& prof, Dtype dtype, double params,
                      Dtype state) {
  return memory_time(dev, prof, params * adam_bytes_per_param(dtype, state));
}

}  // namespace parasol::cost
