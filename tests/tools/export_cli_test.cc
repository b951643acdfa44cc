// Tests of `parasol export` and of the Megatron-LM inputs of the other commands through the
// executable: export of a searched plan to stdout and to a folder, the refusal of a GPipe plan
// (exit 2 naming the field), `estimate --plan megatron_args.txt` against the same plan given as
// flags, flags over an imported plan, every export read back (and the flags a bare import
// needs named), and `compare` with a Megatron-LM training log.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "tests/tools/run_parasol.h"

namespace {

using parasol::testing_cli::Result;
using parasol::testing_cli::run;

std::string temp_path(const std::string& name) {
  return (testing::TempDir().empty() ? std::string("/tmp/") : testing::TempDir()) + "export_cli_" +
         name;
}

nlohmann::json json_of(const Result& r) {
  EXPECT_EQ(r.code, 0) << r.out;
  return nlohmann::json::parse(r.out);
}

TEST(ExportCli, ExportsTheSearchedPlanToStdoutAndToAFolder) {
  // The default search (gpt3-175b on 1,024 A100s).
  const std::string plan = temp_path("best.json");
  Result s = run("search --top 1 --out " + plan);
  ASSERT_EQ(s.code, 0) << s.out;
  const nlohmann::json best = nlohmann::json::parse(std::ifstream(plan));
  Result e = run("export --to megatron --plan " + plan);
  if (best["zero"] == 3 && best["reshard"] != "after_forward") {
    // Its parameters stay gathered to the end of the step (torchtitan's pipelines): Megatron
    // FSDP has no such mode, so the export names the field; with after_forward
    // (a flag over the plan file) it exports.
    EXPECT_EQ(e.code, 2) << e.out;
    EXPECT_NE(e.out.find("error: plan.reshard"), std::string::npos) << e.out;
  }
  const std::string args = "--plan " + plan + (e.code == 2 ? " --reshard after_forward" : "");
  e = run("export --to megatron " + args);
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_NE(e.out.find("==> megatron_args.txt <=="), std::string::npos) << e.out;
  EXPECT_NE(e.out.find("==> launch_megatron.sh <=="), std::string::npos) << e.out;
  EXPECT_NE(e.out.find("--tensor-model-parallel-size " + std::to_string(best["tp"].get<int>())),
            std::string::npos)
      << e.out;
  EXPECT_NE(e.out.find("--expert-tensor-parallel-size"), std::string::npos);

  const std::string dir = temp_path("out");
  std::filesystem::remove_all(dir);
  Result o = run("export --to megatron " + args + " -o " + dir);
  ASSERT_EQ(o.code, 0) << o.out;
  struct stat st {};
  ASSERT_EQ(stat((dir + "/launch_megatron.sh").c_str(), &st), 0);
  EXPECT_TRUE(st.st_mode & S_IXUSR);
  ASSERT_EQ(stat((dir + "/megatron_args.txt").c_str(), &st), 0);
  EXPECT_FALSE(st.st_mode & S_IXUSR);
  // The launch script read back (its torchrun line gives the GPU count) predicts what the plan
  // predicts.
  const double want = json_of(run("estimate " + args + " --json"))["step_time_s"].get<double>();
  const double got = json_of(run("estimate --cluster " + best["cluster"].get<std::string>() +
                                 " --plan " + dir + "/launch_megatron.sh --json"))["step_time_s"]
                         .get<double>();
  EXPECT_DOUBLE_EQ(got, want);
}

// --json: the files as one document (the Python module's export), the same with -o, which
// also writes them.
TEST(ExportCli, JsonIsTheFilesAsOneDocument) {
  const std::string args =
      "export --to deepspeed --model llama3-8b --cluster dgx-h100 --gpus 16 --gbs 64 --zero 2";
  const nlohmann::json doc = json_of(run(args + " --json"));
  EXPECT_EQ(doc["framework"], "deepspeed");
  ASSERT_TRUE(doc["files"].contains("ds_config.json"));
  const std::string dir = temp_path("json_dir");
  std::filesystem::remove_all(dir);
  const nlohmann::json written = json_of(run(args + " --json -o " + dir));
  EXPECT_EQ(written, doc);
  for (const auto& [name, text] : doc["files"].items()) {
    std::ifstream f(dir + "/" + name);
    const std::string on_disk((std::istreambuf_iterator<char>(f)),
                              std::istreambuf_iterator<char>());
    EXPECT_EQ(on_disk, text.get<std::string>()) << name;
  }
  for (const auto& name : doc["executable"]) {
    struct stat st {};
    ASSERT_EQ(stat((dir + "/" + name.get<std::string>()).c_str(), &st), 0);
    EXPECT_TRUE(st.st_mode & S_IXUSR) << name;
  }
}

TEST(ExportCli, RefusesAGpipePlanNamingTheField) {
  Result r =
      run("export --to megatron --model llama3-8b --cluster dgx-h100 --gpus 16 --tp 8 --pp 2 "
          "--schedule gpipe --gbs 32");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("error: plan.schedule"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("GPipe"), std::string::npos) << r.out;
}

TEST(ExportCli, EstimateOfMegatronArgumentsEqualsTheSamePlanAsFlags) {
  const std::string flags =
      "--cluster dgx-h100 --gpus 32 --tp 4 --pp 2 --vpp 2 --zero 1 --sp --gbs 128 --recompute "
      "selective";
  const std::string dir = temp_path("args");
  std::filesystem::remove_all(dir);
  ASSERT_EQ(run("export --to megatron --model llama3-70b " + flags + " -o " + dir).code, 0);
  const nlohmann::json a = json_of(run("estimate --model llama3-70b " + flags + " --json"));
  const nlohmann::json b = json_of(
      run("estimate --cluster dgx-h100 --gpus 32 --plan " + dir + "/megatron_args.txt --json"));
  EXPECT_DOUBLE_EQ(b["step_time_s"].get<double>(), a["step_time_s"].get<double>());
  EXPECT_DOUBLE_EQ(b["memory_per_gpu_bytes"].get<double>(),
                   a["memory_per_gpu_bytes"].get<double>());
  nlohmann::json pa = a["plan"], pb = b["plan"];
  pa.erase("model");  // the imported model is the arguments' shape, not a preset name
  EXPECT_EQ(pb, pa);
  // Flags override the imported fields, as over a plan file.
  const nlohmann::json c = json_of(run("estimate --cluster dgx-h100 --gpus 32 --plan " + dir +
                                       "/megatron_args.txt --tp 8 --json"));
  EXPECT_EQ(c["plan"]["tp"], 8);
  EXPECT_EQ(c["plan"]["dp"], 2);
  EXPECT_EQ(c["plan"]["zero"], 1);
}

TEST(ExportCli, AMegatronFlagParasolCannotReadIsAUserError) {
  const std::string path = temp_path("bad_args.sh");
  std::ofstream(path) << "torchrun pretrain_gpt.py --num-layers 2 --hidden-size 64 "
                         "--num-attention-heads 4 --seq-length 64 --vocab-size 512 "
                         "--use-torch-fsdp2\n";
  Result r = run("estimate --cluster dgx-h100 --gpus 8 --plan " + path);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("error: --use-torch-fsdp2"), std::string::npos) << r.out;
}

TEST(ExportCli, PlanReadsADeepSpeedConfigWithTheGpuCount) {
  const std::string path = temp_path("ds_config.json");
  std::ofstream(path) << R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
                             "zero_optimization": {"stage": 1}, "bf16": {"enabled": true}})";
  const nlohmann::json j =
      json_of(run("estimate --model llama3-8b --cluster dgx-h100 --gpus 16 "
                  "--plan " +
                  path + " --json"));
  EXPECT_EQ(j["plan"]["zero"], 1);
  EXPECT_EQ(j["plan"]["dp"], 16);
  EXPECT_EQ(j["plan"]["mbs"], 2);
  EXPECT_EQ(j["plan"]["gbs"], 128);  // 2 x 4 x 16
  Result r = run("estimate --model llama3-8b --cluster dgx-h100 --plan " + path);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("error: --gpus"), std::string::npos) << r.out;
}

// Every export reads back through --plan as the plan it came from (the cluster from the export's
// tag line), and an import that lacks what it needs says which flag gives it (exit 2) instead of
// pricing a default model or cluster.
TEST(ExportCli, ExportsImportBackAndMissingTargetsAreNamed) {
  const std::string job = "--model llama3-8b --cluster dgx-h100 --gpus 16 --tp 2 --gbs 64 --sp";
  // torchtitan has no ZeRO-1 (FSDP2 or replication): its plan shards with zero 3, and its tensor
  // parallelism is PyTorch's (the torchtitan import reads tp > 1 as tp_impl torch).
  const std::pair<std::string, std::string> exports[] = {
      {"megatron", job + " --zero 1"},
      {"deepspeed", job + " --zero 1"},
      {"torchtitan", job + " --zero 3 --tp-impl torch"}};
  nlohmann::json want;
  for (const auto& [to, flags] : exports) {
    SCOPED_TRACE(to);
    want = json_of(run("estimate " + flags + " --json"));
    const std::string dir = temp_path("import_" + to);
    std::filesystem::remove_all(dir);
    ASSERT_EQ(run("export --to " + to + " " + flags + " -o " + dir).code, 0);
    const std::string launch =
        to == "torchtitan" ? dir + "/torchtitan.toml" : dir + "/launch_" + to + ".sh";
    const nlohmann::json got = json_of(run("estimate --plan " + launch + " --json"));
    EXPECT_EQ(got["step_time_s"], want["step_time_s"]);
    EXPECT_EQ(got["plan"]["tp"], 2);
  }
  want = json_of(run("estimate " + job + " --zero 1 --json"));
  // The launcher's ds_config.json beside it reads back too.
  const std::string ds = temp_path("import_deepspeed");
  EXPECT_EQ(json_of(run("estimate --plan " + ds + "/ds_config.json --json"))["step_time_s"],
            want["step_time_s"]);
  // Without the tag line the cluster is unknown: named, not defaulted.
  const std::string untagged = temp_path("untagged.sh");
  {
    std::ifstream in(temp_path("import_megatron") + "/launch_megatron.sh");
    std::ofstream out(untagged);
    for (std::string line; std::getline(in, line);)
      if (line.find("parasol-export:") == std::string::npos) out << line << "\n";
  }
  Result r = run("estimate --plan " + untagged);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("error: --cluster"), std::string::npos) << r.out;
  EXPECT_EQ(
      json_of(run("estimate --plan " + untagged + " --cluster dgx-h100 --json"))["step_time_s"],
      want["step_time_s"]);
  // A bare ds_config.json does not describe the model.
  const std::string bare = temp_path("bare_ds_config.json");
  std::filesystem::copy_file(ds + "/ds_config.json", bare,
                             std::filesystem::copy_options::overwrite_existing);
  r = run("estimate --plan " + bare + " --gpus 16 --cluster dgx-h100");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("error: --model"), std::string::npos) << r.out;
  // A TOML file that is no torchtitan job is named as TOML, not as malformed JSON.
  const std::string toml = temp_path("other.toml");
  std::ofstream(toml) << "[project]\nname = \"x\"\n";
  r = run("estimate --plan " + toml);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("TOML"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("JSON:"), std::string::npos) << r.out;
}

TEST(ExportCli, CompareReadsAMegatronTrainingLog) {
  const std::string trace = temp_path("pred.json");
  ASSERT_EQ(
      run("simulate --model tiny --cluster localhost --gpus 2 --tp 2 --gbs 4 --trace " + trace)
          .code,
      0);
  const std::string log = temp_path("train.log");
  std::ofstream(log)
      << "building GPT model ...\n"
         " [2026-12-02 01:00:00] iteration        1/      10 | consumed samples:            4 | "
         "elapsed time per iteration (ms): 950.0 | throughput per GPU (TFLOP/s/GPU): 1.0 |\n"
         " [2026-12-02 01:00:01] iteration        2/      10 | consumed samples:            8 | "
         "elapsed time per iteration (ms): 4.0 |\n"
         " [2026-12-02 01:00:01] iteration        3/      10 | consumed samples:           12 | "
         "elapsed time per iteration (ms): 6.0 |\n";
  Result text = run("compare " + trace + " " + log);
  ASSERT_EQ(text.code, 0) << text.out;
  EXPECT_NE(text.out.find("step time error"), std::string::npos) << text.out;
  const nlohmann::json j = json_of(run("compare " + trace + " " + log + " --json"));
  EXPECT_DOUBLE_EQ(j["step"]["measured_s"].get<double>(), 0.005);  // median of 4 and 6 ms
  EXPECT_EQ(j["log_lines_skipped"], 1);
  const double predicted = j["step"]["predicted_s"].get<double>();
  EXPECT_GT(predicted, 0);
  EXPECT_NEAR(j["step"]["error"].get<double>(), (predicted - 0.005) / 0.005, 1e-12);
}

}  // namespace

// `search --framework F` lists only plans F can run: its best plan exports to F, and it is the
// best plan of the unrestricted search whenever that one exports too.
TEST(ExportCli, SearchForAFrameworkFindsAPlanItExports) {
  const std::string space = "--model llama3-8b --cluster dgx-h100 --gpus 16 --gbs 64";
  const std::string any_plan = temp_path("any.json");
  ASSERT_EQ(run("search " + space + " --top 1 --out " + any_plan).code, 0);
  for (const char* framework : {"megatron", "deepspeed", "torchtitan"}) {
    SCOPED_TRACE(framework);
    const std::string plan = temp_path(std::string(framework) + ".json");
    Result s = run("search " + space + " --top 3 --framework " + framework + " --out " + plan);
    ASSERT_EQ(s.code, 0) << s.out;
    EXPECT_NE(s.out.find(std::string("only plans ") + framework + " can run"), std::string::npos)
        << s.out;
    Result e = run(std::string("export --to ") + framework + " --plan " + plan);
    EXPECT_EQ(e.code, 0) << e.out;
    if (run(std::string("export --to ") + framework + " --plan " + any_plan).code == 0) {
      const auto a = nlohmann::json::parse(std::ifstream(any_plan));
      const auto b = nlohmann::json::parse(std::ifstream(plan));
      EXPECT_EQ(a, b);
    }
  }
  // Every listed plan of the JSON output exports, not only the best.
  const nlohmann::json j =
      json_of(run("search " + space + " --top 3 --framework deepspeed --json"));
  ASSERT_TRUE(j.contains("top"));
  for (const auto& row : j["top"]) {
    const std::string p = temp_path("row.json");
    std::ofstream(p) << row["plan"].dump();
    EXPECT_EQ(
        run("export --to deepspeed --plan " + p + " " + space.substr(0, space.find(" --gbs"))).code,
        0)
        << row["plan"].dump();
  }
  Result bad = run("search " + space + " --framework nemo");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.out.find("--framework"), std::string::npos) << bad.out;
}
