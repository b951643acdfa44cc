// The export request of tools/api.h: a plan in another framework's terms (interop/), as
// `parasol export` (tools/export_cmd.cc) writes it.
#include "core/error.h"
#include "interop/interop.h"
#include "tools/api.h"

namespace parasol::tools {

Json export_request(const Json& request, const std::string& framework) {
  Spec s = load_request(request, true);
  validate(s.plan, s.model, *s.cluster);
  return export_document(interop::export_plan(framework, s.model, *s.cluster, s.plan));
}

Json export_document(const interop::Export& e) {
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
