// Parameter initialisation: counter-based normal draws per full-tensor element, cut into each
// rank's slices and shards through runtime/param_layout.h.
#include "runtime/param_init.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "core/error.h"
#include "runtime/tensor.h"

namespace parasol::runtime {

namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

double init_std(const Model& m, TensorKind k) {
  switch (k) {
    case TensorKind::kOut:
    case TensorKind::kFc2:
    case TensorKind::kSfc2:
    case TensorKind::kEfc2:
      return 0.02 / std::sqrt(2.0 * m.layers);
    case TensorKind::kPos:
      return 0.01;
    default:
      return 0.02;
  }
}

}  // namespace

uint64_t name_hash(const std::string& name) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001B3ull;
  }
  return h;
}

double normal_draw(uint64_t seed, uint64_t stream, uint64_t index) {
  const uint64_t key = mix64(seed ^ mix64(stream + kGolden));
  const uint64_t a = mix64(key + (2 * index + 1) * kGolden);
  const uint64_t b = mix64(key + (2 * index + 2) * kGolden);
  const double u1 = (static_cast<double>(a >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
  const double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;          // [0, 1)
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

namespace {

// init_value with the name hash of t (its stream) computed once by the caller.
float value_of(const Model& model, const TensorInfo& t, uint64_t stream, uint64_t seed,
               int64_t index) {
  switch (t.kind) {
    case TensorKind::kNorm:  // layernorm: weight row 1, bias row 0
    case TensorKind::kQNorm:
    case TensorKind::kKvNorm:
      return index < t.shape.back() ? 1.0f : 0.0f;
    case TensorKind::kQkvBias:
    case TensorKind::kOutBias:
    case TensorKind::kFc1Bias:
    case TensorKind::kFc2Bias:
    case TensorKind::kEfc1Bias:
    case TensorKind::kEfc2Bias:
    case TensorKind::kQDownBias:
    case TensorKind::kQUpBias:
    case TensorKind::kKvDownBias:
    case TensorKind::kKvUpBias:
    case TensorKind::kSfc1Bias:
    case TensorKind::kSfc2Bias:
      return 0.0f;
    case TensorKind::kHead:
      if (t.tied_copy) {  // head[i][v] = table[v][i]
        const int64_t i = index / model.vocab, v = index % model.vocab;
        return static_cast<float>(
            init_std(model, TensorKind::kTable) *
            normal_draw(seed, name_hash("emb.table"), static_cast<uint64_t>(v * model.hidden + i)));
      }
      break;
    default:
      break;
  }
  return static_cast<float>(init_std(model, t.kind) *
                            normal_draw(seed, stream, static_cast<uint64_t>(index)));
}

}  // namespace

float init_value(const Model& model, const TensorInfo& t, uint64_t seed, int64_t index) {
  return value_of(model, t, name_hash(t.name), seed, index);
}

float init_value(const Model& model, const std::string& name, uint64_t seed, int64_t index) {
  return init_value(model, tensor_info(model, name), seed, index);
}

void init_bucket(const Model& model, const Plan& plan, const RankCoord& coord, int index,
                 const ParamBucket& b, const BufferAccess& buffer, uint64_t seed) {
  std::vector<TensorInfo> infos;
  std::vector<uint64_t> streams;
  for (const ParamSpec& s : b.specs) {
    infos.push_back(tensor_info(model, s.name));
    streams.push_back(name_hash(s.name));
  }
  auto value = [&](int spec, int64_t full) {
    return value_of(model, infos[spec], streams[spec], seed, full);
  };

  const std::vector<ShardPiece> pieces = shard_pieces(model, plan, coord, b, index);
  auto fill_shard = [&](float* row) {
    std::fill(row, row + b.shard, 0.0f);
    for (const ShardPiece& p : pieces)
      for (int64_t k = 0; k < p.count; ++k)
        row[p.shard_offset + k] = value(p.spec, p.full_offset + k);
  };

  if (b.zero < 3) {
    if (b.params.size() != b.specs.size())
      throw Error("bucket." + b.name, "expects one parameter buffer per spec");
    for (size_t s = 0; s < b.specs.size(); ++s) {
      float* p = buffer(b.params[s]);
      std::fill(p, p + b.specs[s].elements(), 0.0f);
      for (const SliceRun& r : slice_runs(model, plan, coord, b.specs[s]))
        for (int64_t k = 0; k < r.count; ++k)
          p[r.local_offset + k] = value(static_cast<int>(s), r.full_offset + k);
    }
  } else {
    fill_shard(buffer(b.param_shard));
  }
  float* opt = buffer(b.opt);
  const int64_t rows = b.master_in_opt ? 3 : 2;
  std::fill(opt, opt + rows * b.shard, 0.0f);
  if (b.master_in_opt) fill_shard(opt);
}

void init_buckets(const Model& model, const Plan& plan, const RankCoord& coord,
                  const std::vector<ParamBucket>& buckets, const BufferAccess& buffer,
                  uint64_t seed) {
  for (const ParamBucket& b : buckets)
    init_bucket(model, plan, coord, group_index(plan, coord, b.group), b, buffer, seed);
}

}  // namespace parasol::runtime
