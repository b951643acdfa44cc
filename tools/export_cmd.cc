// `parasol export --to megatron|deepspeed|torchtitan (--plan FILE | plan flags) [-o DIR]
// [--json]`: the plan as the target framework's launch files (interop/). Without -o the files go
// to stdout, each after a header line naming it; with -o they are written into DIR (scripts
// executable). --json prints them as one document instead (tools/api.h export_document: the
// Python module's export), also when -o writes them.
// `parasol export --to chakra (--plan FILE | plan flags) [--profile FILE] -o DIR`: the plan's
// per-rank Programs as MLCommons Chakra execution traces, one binary file per rank and
// comm_group.json (traces/chakra_export.h), written into DIR (-o is required; no --json).
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>

#include "core/error.h"
#include "interop/interop.h"
#include "tools/api.h"
#include "tools/commands.h"
#include "tools/spec.h"

namespace parasol::tools {

namespace {

// Writes `e`'s files into `dir` (created when missing), naming each on stdout unless `quiet`.
// Throws parasol::Error("-o") when a file cannot be written.
void write_export(const interop::Export& e, const std::string& dir, bool quiet) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error("-o", dir + ": " + ec.message());
  for (const interop::ExportedFile& f : e.files) {
    const fs::path path = fs::path(dir) / f.name;
    std::ofstream out(path, std::ios::binary);
    out << f.text;
    out.close();
    if (!out) throw Error("-o", path.string() + ": cannot write");
    if (f.executable) {
      fs::permissions(path, fs::perms::owner_exec | fs::perms::group_exec | fs::perms::others_exec,
                      fs::perm_options::add, ec);
      if (ec) throw Error("-o", path.string() + ": " + ec.message());
    }
    if (!quiet) std::cout << "wrote " << path.string() << "\n";
  }
}

}  // namespace

Runner add_export(CLI::App& app, ChakraExport chakra) {
  auto* cmd = app.add_subcommand("export",
                                 "write a plan as Megatron-LM, DeepSpeed or torchtitan "
                                 "launch files, or as Chakra execution traces");
  auto o = std::make_shared<SpecOptions>();
  auto to = std::make_shared<std::string>();
  auto out_dir = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  std::vector<std::string> targets = interop::framework_names();
  targets.push_back("chakra");
  cmd->add_option("--to", *to, "target framework, or chakra (execution traces)")
      ->required()
      ->check(CLI::IsMember(targets));
  cmd->add_option("-o,--out", *out_dir, "write the files into this folder (default: stdout)");
  cmd->add_flag("--json", *json, "print the files as one JSON document");
  add_target_flags(cmd, *o);
  add_plan_flags(cmd, *o);
  add_profile_flag(cmd, *o);
  return [=]() {
    if (*to == "chakra") {
      // Binary files, one per rank: only into a folder.
      if (out_dir->empty()) throw Error("-o", "--to chakra writes binary files: give -o DIR");
      if (*json) throw Error("--json", "not with --to chakra (it writes binary files)");
      if (!chakra) throw Error("export.to", "chakra: this parasol was built without it");
    } else if (!o->profile_file.empty()) {
      throw Error("--profile", "only with --to chakra (its op durations)");
    }
    Spec s = load_spec(*o, cmd, true);
    validate(s.plan, s.model, *s.cluster);
    if (*to == "chakra") {
      interop::Export e{"chakra", "", chakra(s.model, *s.cluster, s.plan, s.profile)};
      write_export(e, *out_dir, false);
      return 0;
    }
    const interop::Export e = interop::export_plan(*to, s.model, *s.cluster, s.plan, "export.to");
    if (!out_dir->empty()) write_export(e, *out_dir, *json);
    if (*json) {
      std::cout << export_document(e).dump(1) << "\n";
      return 0;
    }
    if (!out_dir->empty()) return 0;
    for (size_t i = 0; i < e.files.size(); ++i) {
      const interop::ExportedFile& f = e.files[i];
      std::cout << (i ? "\n" : "") << "==> " << f.name << " <==\n"
                << f.text << (f.text.empty() || f.text.back() == '\n' ? "" : "\n");
    }
    return 0;
  };
}

}  // namespace parasol::tools
