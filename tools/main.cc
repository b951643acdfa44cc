// The parasol command line: show, validate, estimate, simulate, search, accuracy, compare,
// calibrate, run, report, export, sweep, trace.
#include <iostream>
#include <map>

#include "core/error.h"
#include "tools/commands.h"
#include "tools/link_probe.h"
#include "traces/chakra_export.h"

namespace {

// `export --to chakra`'s files (traces/chakra_export.h), as the export command writes them.
std::vector<parasol::interop::ExportedFile> chakra_files(const parasol::Model& model,
                                                         const parasol::Cluster& cluster,
                                                         const parasol::Plan& plan,
                                                         const parasol::cost::Profile& profile) {
  std::vector<parasol::interop::ExportedFile> out;
  for (parasol::traces::ChakraFile& f :
       parasol::traces::chakra_export(model, cluster, plan, profile))
    out.push_back({std::move(f.name), std::move(f.bytes), false});
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace parasol::tools;
  CLI::App app{"parasol: plan, predict and run hybrid-parallel transformer training"};
  app.require_subcommand(1);
  std::map<CLI::App*, Runner> runners;
  std::vector<Runner> list = {add_show(app),
                              add_validate(app),
                              add_estimate(app),
                              add_simulate(app),
                              add_search(app),
                              add_accuracy(app),
                              add_compare(app),
                              add_calibrate(app, probe_host_and_link),
                              add_run(app),
                              add_report(app),
                              add_export(app, chakra_files),
                              add_sweep(app),
                              add_trace(app)};
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }
  try {
    auto subs = app.get_subcommands();
    for (size_t i = 0; i < app.get_subcommands({}).size(); ++i)
      if (app.get_subcommands({})[i]->parsed()) return list[i]();
    return 2;
  } catch (const parasol::Error& e) {
    std::cerr << parasol::error_line(e) << "\n";
    return parasol::exit_code(e.kind());
  } catch (const std::bad_alloc&) {
    std::cerr << "system error: out of host memory\n";
    return 1;
  } catch (const std::exception& e) {  // not parasol's own: a bug of parasol's all the same
    std::cerr << parasol::error_line(parasol::InternalError("", e.what())) << "\n";
    return 1;
  }
}
