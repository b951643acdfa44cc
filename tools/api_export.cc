// The export request of tools/api.h: a plan in another framework's terms (interop/), as
// `parasol export` (tools/export_cmd.cc) writes it.
#include "core/error.h"
#include "interop/deepspeed.h"
#include "interop/megatron.h"
#include "interop/torchtitan.h"
#include "tools/api.h"

namespace parasol::tools {

Json export_request(const Json& request, const std::string& framework) {
  Spec s = load_request(request, true);
  validate(s.plan, s.model, *s.cluster);
  interop::Export e;
  if (framework == "megatron")
    e = interop::export_megatron(s.model, *s.cluster, s.plan);
  else if (framework == "deepspeed")
    e = interop::export_deepspeed(s.model, *s.cluster, s.plan);
  else if (framework == "torchtitan")
    e = interop::export_torchtitan(s.model, *s.cluster, s.plan);
  else
    throw Error("export.framework",
                "'" + framework + "' is not one of megatron|deepspeed|torchtitan");
  Json files = Json::object(), executable = Json::array();
  for (const interop::ExportedFile& f : e.files) {
    files[f.name] = f.text;
    if (f.executable) executable.push_back(f.name);
  }
  return Json{{"framework", e.framework},
              {"version", e.version},
              {"files", files},
              {"executable", executable}};
}

}  // namespace parasol::tools
