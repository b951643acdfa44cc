// `parasol validate`: exit 0 when the plan can run, 2 with the reason when it cannot.
#include <iostream>

#include "tools/api.h"
#include "tools/commands.h"
#include "tools/spec.h"

namespace parasol::tools {

Runner add_validate(CLI::App& app) {
  auto* cmd = app.add_subcommand("validate", "check that a plan can run on a cluster");
  auto o = std::make_shared<SpecOptions>();
  auto json = std::make_shared<bool>(false);
  add_target_flags(cmd, *o);
  add_plan_flags(cmd, *o);
  cmd->add_flag("--json", *json, "print JSON");
  return [=]() {
    Spec s = load_spec(*o, cmd, true);
    const Json doc = validate_document(s);  // throws parasol::Error -> exit 2
    if (*json)
      std::cout << doc.dump(1) << "\n";
    else
      std::cout << "valid: " << s.plan.gpus() << " GPUs, " << s.plan.micro_batches()
                << " micro-batches per step\n";
    return 0;
  };
}

}  // namespace parasol::tools
