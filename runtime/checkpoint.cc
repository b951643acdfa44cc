// Checkpoints: a manifest and one raw fp32 file per full tensor and state kind, written and read
// per rank with pwrite/pread at the offsets runtime/param_layout.h maps each rank's elements to.
#include "runtime/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>

#include "core/error.h"
#include "core/json_reader.h"
#include "runtime/param_layout.h"

namespace parasol::runtime {

static_assert(std::endian::native == std::endian::little,
              "checkpoint files are little-endian fp32, written with native stores");

namespace {

namespace fs = std::filesystem;

constexpr const char* kFormat = "parasol-checkpoint";
constexpr const char* kKinds[3] = {"params", "adam_m", "adam_v"};
enum Kind { kParams = 0, kAdamM = 1, kAdamV = 2 };

std::string manifest_path(const std::string& dir) { return (fs::path(dir) / "manifest.json"); }

// A file descriptor closed on scope exit.
class File {
 public:
  File() = default;
  File(const std::string& path, int flags) : path_(path), fd_(::open(path.c_str(), flags, 0644)) {
    if (fd_ < 0)
      throw Error(path,
                  errno == ENOENT ? "missing" : std::string("cannot open: ") + strerror(errno));
  }
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File() {
    if (fd_ >= 0) ::close(fd_);
  }
  int64_t size() const {
    struct stat st;
    if (::fstat(fd_, &st) != 0) throw Error(path_, std::string("cannot stat: ") + strerror(errno));
    return st.st_size;
  }
  void resize(int64_t bytes) const {
    if (::ftruncate(fd_, bytes) != 0)
      throw Error(path_, std::string("cannot size the file: ") + strerror(errno));
  }
  void write_at(const void* data, int64_t bytes, int64_t offset) const {
    const char* p = static_cast<const char*>(data);
    while (bytes > 0) {
      const ssize_t n = ::pwrite(fd_, p, static_cast<size_t>(bytes), offset);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) throw Error(path_, std::string("write failed: ") + strerror(errno));
      p += n;
      bytes -= n;
      offset += n;
    }
  }
  void read_at(void* data, int64_t bytes, int64_t offset) const {
    char* p = static_cast<char*>(data);
    while (bytes > 0) {
      const ssize_t n = ::pread(fd_, p, static_cast<size_t>(bytes), offset);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw Error(path_, std::string("read failed: ") + strerror(errno));
      if (n == 0) throw Error(path_, "truncated: ends at byte " + std::to_string(offset));
      p += n;
      bytes -= n;
      offset += n;
    }
  }
  // Flushes the file's (or directory's) data, written by any process of this host, to disk.
  void sync() const {
    if (::fsync(fd_) != 0)
      throw Error(path_, std::string("cannot flush to disk: ") + strerror(errno));
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

// The XXH3 64-bit hash of a whole file, as "xxh3-64:<16 hex digits>" (xxHash, Debian's
// libxxhash): streamed in 4 MiB reads.
std::string file_checksum(const std::string& path) {
  const File f(path, O_RDONLY);
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> st(XXH3_createState(), &XXH3_freeState);
  XXH3_64bits_reset(st.get());
  std::vector<char> buf(size_t{4} << 20);
  const int64_t size = f.size();
  for (int64_t at = 0; at < size;) {
    const int64_t n = std::min<int64_t>(size - at, static_cast<int64_t>(buf.size()));
    f.read_at(buf.data(), n, at);
    XXH3_64bits_update(st.get(), buf.data(), static_cast<size_t>(n));
    at += n;
  }
  char hex[32];
  std::snprintf(hex, sizeof hex, "%016llx",
                static_cast<unsigned long long>(XXH3_64bits_digest(st.get())));
  return std::string("xxh3-64:") + hex;
}

void sync_path(const std::string& path) { File(path, O_RDONLY).sync(); }

// Writes `text` to `path` through a temporary file flushed to disk and renamed over it: readers
// see the old file or the whole new one.
void write_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    out.close();
    if (!out) throw SystemError(tmp, "write failed");
  }
  sync_path(tmp);
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw Error(path, "cannot write: " + ec.message());
}

struct Manifest {
  TrainProgress progress;
  std::map<std::string, std::vector<int64_t>> tensors;  // name -> full shape
  std::map<std::string, std::string> checksums;         // "params/<name>.bin" -> "xxh3-64:..."
};

void expect_equal(const JsonReader& r, const std::string& key, const Json& want) {
  if (!r.has(key)) throw Error(r.field(key), "is required");
  const Json& got = r.raw(key);
  if (got != want)
    throw Error(r.field(key), "the checkpoint has " + got.dump() + ", the model " + want.dump());
}

Manifest read_manifest(const std::string& dir, const Model& model) {
  const std::string path = manifest_path(dir);
  if (!fs::exists(path))
    throw Error(path, fs::exists(dir) ? "missing (not a checkpoint, or its save did not complete)"
                                      : "missing: no directory " + dir);
  const Json j = read_json_file(path);
  JsonReader r(j, path);
  if (r.string("format") != kFormat)
    throw Error(r.field("format"), "must be \"" + std::string(kFormat) + "\"");
  const int64_t version = r.integer("version", 1, 1 << 20);
  if (version != kCheckpointVersion && version != 1)
    throw Error(r.field("version"), "unsupported version " + std::to_string(version) +
                                        " (this build reads 1 and " +
                                        std::to_string(kCheckpointVersion) + ")");
  // The model's shape figures.
  const JsonReader mr = r.object("model");
  const Json mj = model_to_json(model);
  for (const char* key :
       {"layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab", "norm", "activation",
        "tied_embeddings", "learned_positions", "linear_bias"})
    expect_equal(mr, key, mj[key]);
  if (model.learned_positions) expect_equal(mr, "seq_len", mj["seq_len"]);
  if (model.is_moe() != mr.has("moe"))
    throw Error(mr.field("moe"), std::string("the checkpoint's model is ") +
                                     (mr.has("moe") ? "" : "not ") + "MoE, the model " +
                                     (model.is_moe() ? "is" : "is not"));
  if (model.is_moe()) {
    const JsonReader moe = mr.object("moe");
    for (const char* key : {"experts", "expert_ffn", "every"})
      expect_equal(moe, key, mj["moe"][key]);
  }

  Manifest m;
  TrainProgress& p = m.progress;
  const int64_t big = int64_t{1} << 62;
  p.step = r.integer("step", 0, big);
  p.tokens = r.integer("tokens", 0, big);
  p.data_position = r.integer("data_position", 0, big);
  if (!r.has("seed") || !r.raw("seed").is_number_integer() ||
      (!r.raw("seed").is_number_unsigned() && r.raw("seed").get<int64_t>() < 0))
    throw Error(r.field("seed"), "must be an integer >= 0");
  p.seed = r.raw("seed").get<uint64_t>();
  const JsonReader a = r.object("adamw");
  p.adamw.lr = a.number("lr", 0, 1e9);
  p.adamw.beta1 = a.number("beta1", 0, 1);
  p.adamw.beta2 = a.number("beta2", 0, 1);
  p.adamw.eps = a.number("eps", 0, 1e9);
  p.adamw.weight_decay = a.number("weight_decay", 0, 1e9);
  p.adamw.step = a.integer("step", 0, big);
  if (r.has("loss_scaler")) {
    const JsonReader ls = r.object("loss_scaler");
    LossScalerState st;
    st.scale = ls.number("scale", 1e-30, 1e38);
    st.growth_tracker = ls.integer("growth_tracker", 0, big);
    st.hysteresis_tracker = static_cast<int>(ls.integer("hysteresis_tracker", -(1 << 30), 1 << 30));
    p.loss_scaler = st;
  }
  for (const auto& [field, t] : r.array("tensors")) {
    const JsonReader tr(*t, field);
    std::vector<int64_t> shape;
    for (const auto& [dfield, d] : tr.array("shape")) {
      if (!d->is_number_integer() || d->get<int64_t>() < 1)
        throw Error(dfield, "must be an integer >= 1");
      shape.push_back(d->get<int64_t>());
    }
    m.tensors[tr.string("name")] = std::move(shape);
  }
  // Version 2: a checksum per tensor file (version 1 checkpoints have none to verify).
  if (version >= 2) {
    const JsonReader cr = r.object("checksums");
    for (const auto& [name, shape] : m.tensors)
      for (const char* kind : kKinds) {
        const std::string rel = std::string(kind) + "/" + name + ".bin";
        m.checksums[rel] = cr.string(rel);
      }
  }
  return m;
}

// Where one spec's values come from in a checkpoint being loaded: its own file per kind, or
// (a tied head copy saved without one) emb.table's, transposed.
struct Source {
  TensorInfo info;
  bool transposed = false;
  std::array<std::unique_ptr<File>, 3> files;
  std::array<std::vector<float>, 3> table;  // transposed: emb.table of each kind, read whole
};

std::unique_ptr<File> open_tensor(const std::string& dir, int kind, const std::string& name,
                                  const std::vector<int64_t>& shape, int64_t elements) {
  auto f = std::make_unique<File>(checkpoint_file(dir, kKinds[kind], name), O_RDONLY);
  const int64_t want = elements * 4;
  if (f->size() != want)
    throw Error(f->path(), "has " + std::to_string(f->size()) + " bytes; the full tensor " +
                               shape_text(shape) + " in fp32 has " + std::to_string(want) +
                               (f->size() < want ? " (truncated)" : ""));
  return f;
}

Source open_source(const std::string& dir, const Model& model, const Manifest& m,
                   const std::string& name) {
  Source s;
  s.info = tensor_info(model, name);
  std::string file_name = name;
  auto it = m.tensors.find(name);
  if (it == m.tensors.end() && s.info.tied_copy) {
    s.transposed = true;
    file_name = "emb.table";
    it = m.tensors.find(file_name);
  }
  const std::string tensors_field = manifest_path(dir) + ".tensors";
  if (it == m.tensors.end()) throw Error(tensors_field, "lacks tensor " + name);
  const TensorInfo file_info = tensor_info(model, file_name);
  if (it->second != file_info.shape)
    throw Error(tensors_field, file_name + " has shape " + shape_text(it->second) +
                                   ", the model's is " + shape_text(file_info.shape));
  for (int k = 0; k < 3; ++k) {
    s.files[k] = open_tensor(dir, k, file_name, file_info.shape, file_info.elements());
    if (s.transposed) {
      s.table[k].resize(static_cast<size_t>(file_info.elements()));
      s.files[k]->read_at(s.table[k].data(), file_info.elements() * 4, 0);
    }
  }
  return s;
}

// Reads full elements [full, full + count) of `s`'s kind `kind` into dst.
void read_full(const Model& model, const Source& s, int kind, int64_t full, int64_t count,
               float* dst) {
  if (!s.transposed) {
    s.files[kind]->read_at(dst, count * 4, full * 4);
    return;
  }
  const int64_t V = model.vocab, h = model.hidden;
  for (int64_t k = 0; k < count; ++k) {  // head[i][v] = table[v][i]
    const int64_t j = full + k;
    dst[k] = s.table[kind][static_cast<size_t>((j % V) * h + j / V)];
  }
}

}  // namespace

std::string checkpoint_file(const std::string& dir, const std::string& kind,
                            const std::string& name) {
  return fs::path(dir) / kind / (name + ".bin");
}

void begin_checkpoint(const std::string& dir, const Model& model, const Plan& plan) {
  for (const char* kind : kKinds) {
    const fs::path p = fs::path(dir) / kind;
    std::error_code ec;
    fs::create_directories(p, ec);
    if (ec || !fs::is_directory(p))
      throw Error(p.string(), "cannot create directory" + (ec ? ": " + ec.message() : ""));
  }
  std::error_code ec;
  fs::remove(manifest_path(dir), ec);
  if (ec) throw Error(manifest_path(dir), "cannot remove the old manifest: " + ec.message());
  for (const TensorInfo& t : model_tensors(model, has_tied_head_copy(model, plan)))
    for (const char* kind : kKinds) {
      File f(checkpoint_file(dir, kind, t.name), O_WRONLY | O_CREAT | O_TRUNC);
      f.resize(t.elements() * 4);
    }
}

void save_checkpoint_rank(const std::string& dir, const Model& model, const Plan& plan,
                          const RankCoord& coord, const std::vector<ParamBucket>& buckets,
                          const BufferAccess& buffer) {
  for (const ParamBucket& b : buckets) {
    const int index = group_index(plan, coord, b.group);
    if (b.zero == 0 && index != 0) continue;           // replicas: group index 0 writes
    if (replica_index(plan, coord, b) != 0) continue;  // HSDP: the first replica writes
    std::vector<std::array<std::unique_ptr<File>, 3>> files(b.specs.size());
    for (size_t s = 0; s < b.specs.size(); ++s) {
      if (!counts_in_grad_norm(model, coord, b.specs[s].name)) continue;  // tp rank 0 writes
      for (int k = 0; k < 3; ++k)
        files[s][k] =
            std::make_unique<File>(checkpoint_file(dir, kKinds[k], b.specs[s].name), O_WRONLY);
    }
    const float* opt = buffer(b.opt);
    const int64_t row0 = b.master_in_opt ? 1 : 0;  // the m row
    const float* shard_params = b.zero >= 3 && !b.master_in_opt ? buffer(b.param_shard) : nullptr;
    for (const ShardPiece& p : shard_pieces(model, plan, coord, b, index)) {
      const auto& f = files[p.spec];
      if (!f[0]) continue;
      const float* values = b.master_in_opt ? opt + p.shard_offset
                            : shard_params  ? shard_params + p.shard_offset
                                            : buffer(b.params[p.spec]) + p.spec_offset;
      const int64_t bytes = p.count * 4, at = p.full_offset * 4;
      f[kParams]->write_at(values, bytes, at);
      f[kAdamM]->write_at(opt + row0 * b.shard + p.shard_offset, bytes, at);
      f[kAdamV]->write_at(opt + (row0 + 1) * b.shard + p.shard_offset, bytes, at);
    }
  }
}

void commit_checkpoint(const std::string& dir, const Model& model, const Plan& plan,
                       const TrainProgress& progress) {
  Json tensors = Json::array();
  Json checksums = Json::object();
  for (const TensorInfo& t : model_tensors(model, has_tied_head_copy(model, plan))) {
    tensors.push_back({{"name", t.name}, {"shape", t.shape}});
    // Every rank has written its part (the caller's barrier): hash the whole files.
    for (const char* kind : kKinds)
      checksums[std::string(kind) + "/" + t.name + ".bin"] =
          file_checksum(checkpoint_file(dir, kind, t.name));
  }
  const AdamWConfig& a = progress.adamw;
  Json j = {{"format", kFormat},
            {"version", kCheckpointVersion},
            {"dtype", "fp32"},
            {"byte_order", "little"},
            {"model", model_to_json(model)},
            {"plan", plan_to_json(plan)},
            {"step", progress.step},
            {"tokens", progress.tokens},
            {"data_position", progress.data_position},
            {"seed", progress.seed},
            {"adamw",
             {{"lr", a.lr},
              {"beta1", a.beta1},
              {"beta2", a.beta2},
              {"eps", a.eps},
              {"weight_decay", a.weight_decay},
              {"step", a.step}}},
            {"tensors", tensors},
            {"checksums", checksums}};
  if (progress.loss_scaler)
    j["loss_scaler"] = {{"scale", progress.loss_scaler->scale},
                        {"growth_tracker", progress.loss_scaler->growth_tracker},
                        {"hysteresis_tracker", progress.loss_scaler->hysteresis_tracker}};
  write_atomically(manifest_path(dir), j.dump(2) + "\n");
}

namespace {

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}

}  // namespace

std::string checkpoint_staging_dir(const std::string& root, int64_t step) {
  return (fs::path(root) / ("." + step_name(step) + ".partial")).string();
}

std::string publish_checkpoint(const std::string& root, int64_t step, int keep) {
  const std::string staging = checkpoint_staging_dir(root, step);
  const std::string final_dir = (fs::path(root) / step_name(step)).string();
  // Everything on disk before the rename makes it visible.
  for (const auto& e : fs::recursive_directory_iterator(staging)) sync_path(e.path().string());
  sync_path(staging);
  std::error_code ec;
  fs::remove_all(final_dir, ec);  // an older save of the same step
  if (ec) throw Error(final_dir, "cannot replace: " + ec.message());
  fs::rename(staging, final_dir, ec);
  if (ec) throw Error(final_dir, "cannot publish the checkpoint: " + ec.message());
  sync_path(root);
  write_atomically((fs::path(root) / "latest").string(), step_name(step) + "\n");
  sync_path(root);
  // Keep the newest `keep` step directories; drop crashed saves' staging directories.
  std::vector<std::string> steps;
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    if (!e.is_directory()) continue;
    if (name.rfind("step-", 0) == 0) steps.push_back(name);
    if (name.rfind(".step-", 0) == 0) fs::remove_all(e.path(), ec);
  }
  std::sort(steps.begin(), steps.end());
  if (keep > 0 && static_cast<int>(steps.size()) > keep)
    for (size_t i = 0; i + keep < steps.size(); ++i)
      if (steps[i] != step_name(step)) fs::remove_all(fs::path(root) / steps[i], ec);
  return final_dir;
}

std::string resolve_checkpoint(const std::string& path) {
  // `latest` first: a root that also holds a checkpoint of the first layout (manifest.json in
  // the root itself) resumes from the newest save, not the old one.
  const fs::path latest = fs::path(path) / "latest";
  if (!fs::exists(latest)) {
    if (fs::exists(fs::path(path) / "manifest.json")) return path;
    throw Error(path, fs::exists(path)
                          ? "not a checkpoint: no manifest.json and no latest (a save that did "
                            "not complete leaves neither)"
                          : "missing: no directory " + path);
  }
  std::ifstream in(latest);
  std::string name;
  in >> name;
  // What step_name writes: "step-" and the step's digits (at most 19: an int64). Anything else
  // (found by fuzzing: a name too long for the file system) is refused before it reaches one.
  const bool digits =
      name.size() > 5 && name.size() <= 5 + 19 &&
      std::all_of(name.begin() + 5, name.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (name.rfind("step-", 0) != 0 || !digits)
    throw Error(latest.string(), "does not name a step directory ('" + name.substr(0, 64) + "')");
  return (fs::path(path) / name).string();
}

void verify_checkpoint(const std::string& dir, const Model& model) {
  const Manifest m = read_manifest(dir, model);
  for (const auto& [rel, want] : m.checksums) {
    const std::string path = (fs::path(dir) / rel).string();
    const std::string got = file_checksum(path);
    if (got != want)
      throw Error(path, "checksum mismatch: the manifest has " + want + ", the file " + got +
                            " (corrupted or changed after the save)");
  }
}

TrainProgress read_checkpoint_manifest(const std::string& dir, const Model& model) {
  return read_manifest(dir, model).progress;
}

TrainProgress load_checkpoint_rank(const std::string& dir, const Model& model, const Plan& plan,
                                   const RankCoord& coord, const std::vector<ParamBucket>& buckets,
                                   const BufferAccess& buffer) {
  const Manifest m = read_manifest(dir, model);
  for (const ParamBucket& b : buckets) {
    const int index = group_index(plan, coord, b.group);
    std::vector<Source> src;
    src.reserve(b.specs.size());
    for (const ParamSpec& s : b.specs) src.push_back(open_source(dir, model, m, s.name));
    const std::vector<ShardPiece> pieces = shard_pieces(model, plan, coord, b, index);
    auto fill_shard = [&](float* row, int kind) {
      std::fill(row, row + b.shard, 0.0f);
      for (const ShardPiece& p : pieces)
        read_full(model, src[p.spec], kind, p.full_offset, p.count, row + p.shard_offset);
    };
    if (b.zero < 3) {
      if (b.params.size() != b.specs.size())
        throw Error("bucket." + b.name, "expects one parameter buffer per spec");
      for (size_t s = 0; s < b.specs.size(); ++s) {
        float* p = buffer(b.params[s]);
        std::fill(p, p + b.specs[s].elements(), 0.0f);
        for (const SliceRun& r : slice_runs(model, plan, coord, b.specs[s]))
          read_full(model, src[s], kParams, r.full_offset, r.count, p + r.local_offset);
      }
    } else {
      fill_shard(buffer(b.param_shard), kParams);
    }
    float* opt = buffer(b.opt);
    int64_t row = 0;
    if (b.master_in_opt) fill_shard(opt + b.shard * row++, kParams);
    fill_shard(opt + b.shard * row++, kAdamM);
    fill_shard(opt + b.shard * row, kAdamV);
  }
  return m.progress;
}

}  // namespace parasol::runtime
