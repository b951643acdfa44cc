// Tests of runtime/checkpoint: every rank of a plan simulated in-process with its own buffers
// saves a training state; the files are byte for byte those of the serial run's save (so each
// element was written once, by its owner: non-owned copies hold poison), and loading under
// another plan gives every rank exactly its slice, shard, master row and moments of that state.
// Also the manifest, the tied head copy, and the errors (missing, incomplete, another model,
// truncated or missing files, unsupported version).
#include "runtime/checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/error.h"
#include "runtime/tensor.h"
#include "state_test_util.h"
#include "tests/core/expect_error.h"
#include "tests/runtime/temp_dir.h"

namespace parasol::runtime {
namespace {

namespace fs = std::filesystem;
using testing::Case;
using testing::flat_to_spec;
using testing::make_plan;
using testing::ref_full_index;
using testing::shard_begin;
using testing::SimRank;
using testing::SimRun;
using testing::TempDir;

// The training state the tests save: a distinct value per (kind, tensor, full element), where
// kind 0 = parameters, 1 = m, 2 = v.
float state_value(int kind, const std::string& name, int64_t full) {
  const uint64_t h = mix64(name_hash(name) ^ mix64(static_cast<uint64_t>(kind) * 7919 + 1) ^
                           mix64(static_cast<uint64_t>(full) + 0x1234));
  return static_cast<float>(static_cast<int64_t>(h % 2000001) - 1000000) * 1e-6f;
}
constexpr float kPoison = 1e30f;

// Sets every rank's state to state_value (0 in padding). With poison, the copies a rank does not
// own (tensors replicated over tp on tp ranks > 0; every copy but group index 0's under ZeRO 0;
// parameter elements outside the rank's ZeRO shard) hold kPoison instead, as a save must not
// write them.
void set_state(SimRun& run, bool poison) {
  for (SimRank& r : run.ranks)
    for (const ParamBucket& b : r.program->buckets) {
      const int index = r.index(run.plan, b);
      const bool copy_owner = b.zero >= 1 || index == 0;
      auto value = [&](int kind, int s, int64_t local, bool in_shard) {
        const std::string& name = b.specs[s].name;
        const int64_t f = ref_full_index(run.model, run.plan, r.coord, name, local);
        if (f < 0) return 0.0f;
        const bool owner = copy_owner && in_shard &&
                           (!tensor_info(run.model, name).tp_replicated || r.coord.tp == 0);
        return poison && !owner ? kPoison : state_value(kind, name, f);
      };
      const int64_t begin = shard_begin(b, index);
      auto fill_shard = [&](float* row, int kind) {
        for (int64_t k = 0; k < b.shard; ++k) {
          const auto [s, off] = flat_to_spec(b, begin + k);
          row[k] = s < 0 ? 0.0f : value(kind, s, off, true);
        }
      };
      if (b.zero < 3) {
        int64_t flat = 0;
        for (size_t s = 0; s < b.specs.size(); ++s) {
          std::vector<float>& p = r.buf(b.params[s]);
          for (int64_t i = 0; i < static_cast<int64_t>(p.size()); ++i, ++flat) {
            // The master values are read from here unless the optimizer holds them.
            const bool in_shard = b.master_in_opt || (flat >= begin && flat < begin + b.shard);
            p[i] = value(0, static_cast<int>(s), i, in_shard);
          }
        }
      } else {
        fill_shard(r.buf(b.param_shard).data(), 0);
      }
      float* opt = r.buf(b.opt).data();
      int row = 0;
      if (b.master_in_opt) fill_shard(opt + b.shard * row++, 0);
      fill_shard(opt + b.shard * row++, 1);
      fill_shard(opt + b.shard * row, 2);
    }
}

// Every rank's parameters, master row, m and v equal state_value (0 in padding).
void check_state(SimRun& run) {
  int64_t checked = 0;
  for (SimRank& r : run.ranks)
    for (const ParamBucket& b : r.program->buckets) {
      const int index = r.index(run.plan, b);
      auto want = [&](int kind, int s, int64_t local) {
        const std::string& name = b.specs[s].name;
        const int64_t f = ref_full_index(run.model, run.plan, r.coord, name, local);
        return f < 0 ? 0.0f : state_value(kind, name, f);
      };
      auto check_shard = [&](const float* row, int kind) {
        for (int64_t k = 0; k < b.shard; ++k) {
          const auto [s, off] = flat_to_spec(b, shard_begin(b, index) + k);
          ASSERT_EQ(row[k], s < 0 ? 0.0f : want(kind, s, off))
              << "kind " << kind << " of " << b.name << " shard element " << k << " on rank "
              << r.rank;
          ++checked;
        }
      };
      if (b.zero < 3) {
        for (size_t s = 0; s < b.specs.size(); ++s) {
          const std::vector<float>& p = r.buf(b.params[s]);
          for (int64_t i = 0; i < static_cast<int64_t>(p.size()); ++i) {
            ASSERT_EQ(p[i], want(0, static_cast<int>(s), i))
                << b.specs[s].name << " element " << i << " on rank " << r.rank;
            ++checked;
          }
        }
      } else {
        check_shard(r.buf(b.param_shard).data(), 0);
      }
      const float* opt = r.buf(b.opt).data();
      int row = 0;
      if (b.master_in_opt) check_shard(opt + b.shard * row++, 0);
      check_shard(opt + b.shard * row++, 1);
      check_shard(opt + b.shard * row, 2);
    }
  EXPECT_GT(checked, 0);
}

TrainProgress some_progress() {
  TrainProgress p;
  p.step = 37;
  p.tokens = 37 * 4096;
  p.data_position = 37 * 8;
  p.seed = 0xFEDCBA9876543210ull;
  p.adamw.lr = 6e-4;
  p.adamw.beta1 = 0.85;
  p.adamw.beta2 = 0.999;
  p.adamw.eps = 1e-7;
  p.adamw.weight_decay = 0.05;
  p.adamw.step = 38;
  return p;
}

// The three steps of a save, every rank in turn (the barriers are trivially there).
void save(SimRun& run, const std::string& dir, const TrainProgress& progress = some_progress()) {
  begin_checkpoint(dir, run.model, run.plan);
  for (SimRank& r : run.ranks)
    save_checkpoint_rank(dir, run.model, run.plan, r.coord, r.program->buckets, r.access());
  commit_checkpoint(dir, run.model, run.plan, progress);
}

TrainProgress load(SimRun& run, const std::string& dir) {
  TrainProgress p;
  for (SimRank& r : run.ranks)
    p = load_checkpoint_rank(dir, run.model, run.plan, r.coord, r.program->buckets, r.access());
  return p;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Same tensor files, byte for byte.
void expect_same_files(const std::string& a, const std::string& b, const Model& m) {
  for (const TensorInfo& t : model_tensors(m))
    for (const char* kind : {"params", "adam_m", "adam_v"}) {
      const std::string fa = checkpoint_file(a, kind, t.name),
                        fb = checkpoint_file(b, kind, t.name);
      const std::string da = read_bytes(fa), db = read_bytes(fb);
      EXPECT_EQ(da.size(), static_cast<size_t>(t.elements() * 4)) << fa;
      EXPECT_TRUE(da == db) << fa << " differs from " << fb;
    }
}

struct Transfer {
  std::string name;
  Model model;
  Plan from, to;
};

// A state saved under one plan loads under another exactly, and the saved files are the serial
// run's.
TEST(Checkpoint, SavedUnderOnePlanLoadsUnderAnother) {
  const Model tiny = model_preset("tiny"), moe = model_preset("tiny-moe");
  const Model gpt = testing::gpt_untied(), gmoe = testing::gpt_moe();
  const std::vector<Transfer> transfers = {
      {"tiny serial -> tp2 sp", tiny, make_plan({}), make_plan({.tp = 2, .sp = true})},
      {"tiny tp2 -> dp2 zero3", tiny, make_plan({.tp = 2}), make_plan({.dp = 2, .zero = 3})},
      {"tiny dp2 zero0 -> cp2 zero1 fp32", tiny, make_plan({.dp = 2}),
       make_plan({.cp = 2, .zero = 1, .precision = Dtype::kFp32})},
      {"tiny dp2 zero2 fp32 -> dp2 zero1", tiny,
       make_plan({.dp = 2, .zero = 2, .precision = Dtype::kFp32}), make_plan({.dp = 2, .zero = 1})},
      {"tiny dp2 zero3 fp32 -> serial", tiny,
       make_plan({.dp = 2, .zero = 3, .precision = Dtype::kFp32}), make_plan({})},
      {"tiny offload -> tp2", tiny,
       make_plan({.dp = 2, .zero = 1, .precision = Dtype::kFp32, .offload_optimizer = true}),
       make_plan({.tp = 2})},
      {"gpt tp4 -> pp2", gpt, make_plan({.tp = 4}), make_plan({.pp = 2})},
      {"gpt tp2 pp2 dp2 zero1 dp-tp order -> dp3 zero3", gpt,
       make_plan({.tp = 2, .pp = 2, .dp = 2, .zero = 1, .custom_order = true}),
       make_plan({.dp = 3, .zero = 3})},
      {"gpt 4 layers pp2 vpp2 -> tp2", testing::gpt_untied(4), make_plan({.pp = 2, .vpp = 2}),
       make_plan({.tp = 2})},
      {"tiny-moe dp2 ep2 -> dp4 ep2 zero1", moe, make_plan({.dp = 2, .ep = 2}),
       make_plan({.dp = 4, .ep = 2, .zero = 1})},
      {"gpt-moe tp2 dp2 ep2 zero2 -> serial", gmoe,
       make_plan({.tp = 2, .dp = 2, .ep = 2, .zero = 2}), make_plan({})},
      {"gpt-moe tp2 dp4 ep2 zero3 -> tp2 cp2 dp2 ep2 zero1 sp", gmoe,
       make_plan({.tp = 2, .dp = 4, .ep = 2, .zero = 3}),
       make_plan({.tp = 2, .dp = 2, .cp = 2, .ep = 2, .zero = 1, .sp = true})},
  };
  for (const Transfer& t : transfers) {
    SCOPED_TRACE(t.name);
    TempDir tmp;
    SimRun serial(t.model, make_plan({}));
    set_state(serial, false);
    save(serial, tmp.sub("serial"));

    SimRun a(t.model, t.from);
    set_state(a, true);
    save(a, tmp.sub("a"));
    expect_same_files(tmp.sub("a"), tmp.sub("serial"), t.model);

    SimRun b(t.model, t.to);
    const TrainProgress p = load(b, tmp.sub("a"));
    check_state(b);
    EXPECT_EQ(p.step, some_progress().step);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(Checkpoint, ManifestKeepsTheProgressAndTheTensorList) {
  TempDir tmp;
  const Model m = model_preset("tiny");
  SimRun run(m, make_plan({.tp = 2}));
  set_state(run, false);
  const TrainProgress want = some_progress();
  save(run, tmp.sub("c"), want);
  for (const TrainProgress& got :
       {read_checkpoint_manifest(tmp.sub("c"), m), load(run, tmp.sub("c"))}) {
    EXPECT_EQ(got.step, want.step);
    EXPECT_EQ(got.tokens, want.tokens);
    EXPECT_EQ(got.data_position, want.data_position);
    EXPECT_EQ(got.seed, want.seed);
    EXPECT_EQ(got.adamw.lr, want.adamw.lr);
    EXPECT_EQ(got.adamw.beta1, want.adamw.beta1);
    EXPECT_EQ(got.adamw.beta2, want.adamw.beta2);
    EXPECT_EQ(got.adamw.eps, want.adamw.eps);
    EXPECT_EQ(got.adamw.weight_decay, want.adamw.weight_decay);
    EXPECT_EQ(got.adamw.step, want.adamw.step);
  }
  const Json j = read_json_file(tmp.sub("c") + "/manifest.json");
  EXPECT_EQ(j.at("format"), "parasol-checkpoint");
  EXPECT_EQ(j.at("version"), 2);
  EXPECT_EQ(j.at("model").at("hidden"), 64);
  bool found = false;
  for (const Json& t : j.at("tensors"))
    if (t.at("name") == "L1.qkv") {
      found = true;
      EXPECT_EQ(t.at("shape"), Json::array({64, 128}));  // the full tensor, not a tp slice
    }
  EXPECT_TRUE(found);
  EXPECT_EQ(j.at("tensors").size(), model_tensors(m).size());
}

// A tensor file is the row-major full tensor in little-endian fp32, without header.
TEST(Checkpoint, TensorFilesAreRawLittleEndianFullTensors) {
  TempDir tmp;
  const Model m = model_preset("tiny");
  SimRun run(m, make_plan({.tp = 2}));
  set_state(run, false);
  save(run, tmp.sub("c"));
  const std::string bytes = read_bytes(tmp.sub("c") + "/adam_v/L0.qkv.bin");
  ASSERT_EQ(bytes.size(), 64u * 128u * 4u);
  for (int64_t i : {0, 1, 63, 64, 100, 8191}) {
    const auto* p = reinterpret_cast<const unsigned char*>(bytes.data()) + 4 * i;
    const uint32_t u = p[0] | p[1] << 8 | p[2] << 16 | static_cast<uint32_t>(p[3]) << 24;
    float f;
    std::memcpy(&f, &u, 4);
    EXPECT_EQ(f, state_value(2, "L0.qkv", i)) << i;
  }
}

// A tied model saved serially (no head copy) loads under pp 2, whose copy is the table
// transposed; saved under pp 2 (with the copy), it loads serially.
TEST(Checkpoint, TiedHeadCopyComesFromTheTable) {
  TempDir tmp;
  const Model m = model_preset("tiny-gpt");
  SimRun serial(m, make_plan({}));
  set_state(serial, false);
  save(serial, tmp.sub("serial"));
  EXPECT_FALSE(fs::exists(checkpoint_file(tmp.sub("serial"), "params", "head.head")));

  SimRun pp(m, make_plan({.pp = 2, .dp = 2, .zero = 1}));
  load(pp, tmp.sub("serial"));
  int64_t checked = 0, moments = 0;
  for (SimRank& r : pp.ranks)
    for (const ParamBucket& b : r.program->buckets)
      for (size_t s = 0; s < b.specs.size(); ++s) {
        if (b.specs[s].name != "head.head") continue;
        const std::vector<float>& p = r.buf(b.params[s]);
        const int64_t V = m.vocab, h = m.hidden;
        for (int64_t j = 0; j < V * h; j += 37) {
          ASSERT_EQ(p[j], state_value(0, "emb.table", (j % V) * h + j / V)) << j;
          ++checked;
        }
        // The moments of this rank's shard come from the table's too.
        const float* m_row = r.buf(b.opt).data() + (b.master_in_opt ? b.shard : 0);
        const int64_t begin = shard_begin(b, r.index(pp.plan, b));
        for (int64_t k = 0; k < b.shard; ++k) {
          const auto [sk, j] = flat_to_spec(b, begin + k);
          if (sk != static_cast<int>(s)) continue;
          ASSERT_EQ(m_row[k], state_value(1, "emb.table", (j % V) * h + j / V)) << j;
          ++moments;
        }
      }
  EXPECT_GT(moments, 0);
  EXPECT_GT(checked, 0);

  save(pp, tmp.sub("pp"));
  EXPECT_TRUE(fs::exists(checkpoint_file(tmp.sub("pp"), "params", "head.head")));
  SimRun back(m, make_plan({.tp = 2}));
  load(back, tmp.sub("pp"));
  check_state(back);  // head.head of the pp run is not needed: the table is the serial state
}

// Two flipped bytes in a tensor file of the right size: the size check cannot see it, the
// checksum must (a resume would otherwise train on from corrupted weights).
TEST(Checkpoint, FlippedBytesFailVerificationNamingTheFile) {
  TempDir tmp;
  const Model m = model_preset("tiny");
  SimRun run(m, make_plan({}));
  set_state(run, false);
  const std::string dir = tmp.sub("ckpt");
  save(run, dir);
  EXPECT_NO_THROW(verify_checkpoint(dir, m));
  const std::string file = checkpoint_file(dir, "adam_v", model_tensors(m, false).back().name);
  const auto size = std::filesystem::file_size(file);
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good());
    for (std::streamoff at : {std::streamoff(17), std::streamoff(size / 2)}) {
      f.seekg(at);
      char c = 0;
      f.read(&c, 1);
      c = static_cast<char>(c ^ 0x5a);
      f.seekp(at);
      f.write(&c, 1);
    }
  }
  ASSERT_EQ(std::filesystem::file_size(file), size);
  // The per-rank load still reads it (the sizes match): only the checksum tells.
  EXPECT_NO_THROW(load(run, dir));
  ExpectError([&] { verify_checkpoint(dir, m); }, file, "checksum mismatch");
  // A missing file is named too.
  std::filesystem::remove(file);
  ExpectError([&] { verify_checkpoint(dir, m); }, file, "missing");
}

// A version 1 checkpoint (written before checksums) still resumes, unverified.
TEST(Checkpoint, VersionOneWithoutChecksumsStillLoads) {
  TempDir tmp;
  const Model m = model_preset("tiny");
  SimRun run(m, make_plan({}));
  set_state(run, false);
  const std::string dir = tmp.sub("ckpt");
  save(run, dir);
  Json j = read_json_file(dir + "/manifest.json");
  j["version"] = 1;
  j.erase("checksums");
  std::ofstream(dir + "/manifest.json") << j.dump();
  EXPECT_NO_THROW(verify_checkpoint(dir, m));
  EXPECT_EQ(load(run, dir).step, some_progress().step);
  // Version 2 requires them.
  j["version"] = 2;
  std::ofstream(dir + "/manifest.json") << j.dump();
  ExpectError([&] { verify_checkpoint(dir, m); }, dir + "/manifest.json.checksums", "");
}

// Atomic saves under a root: publish renames the staging directory and points latest at it;
// resolve follows latest (before a first-layout manifest in the root); keep prunes.
TEST(Checkpoint, PublishedStepsResolveThroughLatest) {
  TempDir tmp;
  const Model m = model_preset("tiny");
  SimRun run(m, make_plan({}));
  set_state(run, false);
  const std::string root = tmp.sub("root");
  // A checkpoint of the first layout in the root itself.
  save(run, root);
  EXPECT_EQ(resolve_checkpoint(root), root);
  for (int64_t step : {1, 2, 3}) {
    const std::string staging = checkpoint_staging_dir(root, step);
    save(run, staging);
    const std::string published = publish_checkpoint(root, step, /*keep=*/2);
    EXPECT_FALSE(std::filesystem::exists(staging));
    EXPECT_EQ(resolve_checkpoint(root), published);
    EXPECT_NO_THROW(verify_checkpoint(published, m));
  }
  EXPECT_FALSE(std::filesystem::exists(root + "/step-00000001"));  // keep 2
  EXPECT_TRUE(std::filesystem::exists(root + "/step-00000002"));
  // A crashed save (a staging directory never published) changes nothing.
  save(run, checkpoint_staging_dir(root, 4));
  EXPECT_EQ(resolve_checkpoint(root), root + "/step-00000003");
  ExpectError([&] { resolve_checkpoint(tmp.sub("empty")); }, tmp.sub("empty"), "missing");
}

TEST(Checkpoint, ManifestCarriesAChecksumPerFile) {
  TempDir tmp;
  const Model m = model_preset("tiny");
  SimRun run(m, make_plan({}));
  set_state(run, false);
  const std::string dir = tmp.sub("ckpt");
  save(run, dir);
  const Json j = read_json_file(dir + "/manifest.json");
  EXPECT_EQ(j["version"].get<int>(), kCheckpointVersion);
  size_t files = 0;
  for (const auto& t : j["tensors"])
    for (const char* kind : {"params", "adam_m", "adam_v"}) {
      const std::string rel = std::string(kind) + "/" + t["name"].get<std::string>() + ".bin";
      ASSERT_TRUE(j["checksums"].contains(rel)) << rel;
      EXPECT_EQ(j["checksums"][rel].get<std::string>().rfind("xxh3-64:", 0), 0u) << rel;
      ++files;
    }
  EXPECT_EQ(j["checksums"].size(), files);
}

TEST(Checkpoint, ErrorsNameTheFileAndField) {
  TempDir tmp;
  const Model m = model_preset("tiny");
  SimRun run(m, make_plan({}));
  set_state(run, false);
  SimRank& r = run.ranks[0];
  auto load0 = [&](const std::string& dir) {
    load_checkpoint_rank(dir, m, run.plan, r.coord, r.program->buckets, r.access());
  };
  const std::string none = tmp.sub("none");
  ExpectError([&] { load0(none); }, none + "/manifest.json", "missing: no directory");

  const std::string half = tmp.sub("half");
  begin_checkpoint(half, m, run.plan);
  save_checkpoint_rank(half, m, run.plan, r.coord, r.program->buckets, r.access());
  ExpectError([&] { load0(half); }, half + "/manifest.json", "did not complete");

  // Saving without begin_checkpoint: the files are missing.
  const std::string bare = tmp.sub("bare");
  fs::create_directories(bare);
  ExpectError(
      [&] { save_checkpoint_rank(bare, m, run.plan, r.coord, r.program->buckets, r.access()); },
      checkpoint_file(bare, "params", "emb.table"), "missing");

  const std::string ok = tmp.sub("ok");
  save(run, ok);
  load0(ok);  // loads

  // Another model.
  const Model wide = llama_model("tiny", 2, 128, 4, 2, 256, 512, 64);
  SimRun wrun(wide, make_plan({}));
  ExpectError([&] { read_checkpoint_manifest(ok, wide); }, ok + "/manifest.json.model.hidden",
              "the checkpoint has 64, the model 128");
  ExpectError([&] { read_checkpoint_manifest(ok, model_preset("tiny-moe")); },
              ok + "/manifest.json.model.ffn", "the checkpoint has 256, the model 128");

  // A truncated tensor file, a missing one.
  const std::string qkv = checkpoint_file(ok, "params", "L0.qkv");
  fs::resize_file(qkv, fs::file_size(qkv) / 2);
  ExpectError([&] { load0(ok); }, qkv, "truncated");
  save(run, ok);
  const std::string v = checkpoint_file(ok, "adam_v", "L1.fc2");
  fs::remove(v);
  ExpectError([&] { load0(ok); }, v, "missing");

  // An unsupported version.
  save(run, ok);
  Json j = read_json_file(ok + "/manifest.json");
  j["version"] = 3;
  std::ofstream(ok + "/manifest.json") << j.dump();
  ExpectError([&] { load0(ok); }, ok + "/manifest.json.version", "unsupported version 3");

  // A directory that cannot be created.
  std::ofstream(tmp.sub("file")) << "x";
  ExpectError([&] { begin_checkpoint(tmp.sub("file"), m, run.plan); }, tmp.sub("file") + "/params",
              "cannot create directory");
}

}  // namespace
}  // namespace parasol::runtime
