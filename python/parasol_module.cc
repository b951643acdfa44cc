// _parasol: the compiled half of `import parasol` (python/parasol/__init__.py). Each function
// takes a request as JSON text and returns the command's --json document as JSON text, calling
// the commands' own functions (tools/api.h); the package turns dicts into text and back. A user
// error (parasol::Error) is raised as _parasol.RawError(field, reason), which the package raises
// as parasol.Error.
#include <pybind11/pybind11.h>

#include <string>

#include "core/error.h"
#include "tools/api.h"
#include "tools/sweep.h"

namespace py = pybind11;

namespace {

// Runs `f` on the parsed request without the GIL (search runs on every core) and returns the
// document as JSON text.
template <class F>
std::string call(const std::string& request, F f) {
  py::gil_scoped_release release;
  return f(parasol::parse_json(request, "request")).dump();
}

}  // namespace

PYBIND11_MODULE(_parasol, m) {
  m.doc() = "parasol's commands as functions: JSON text in, the --json document out";
  static py::exception<parasol::Error> raw_error(m, "RawError", PyExc_ValueError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const parasol::Error& e) {
      if (!e.is_user_error()) {  // a parasol bug or a system fault: not a ValueError
        PyErr_SetString(PyExc_RuntimeError, parasol::error_line(e).c_str());
        return;
      }
      py::tuple args = py::make_tuple(e.field(), e.reason());
      PyErr_SetObject(raw_error.ptr(), args.ptr());
    }
  });
  using parasol::Json;
  m.def(
      "estimate", [](const std::string& r) { return call(r, parasol::tools::estimate_request); },
      "parasol estimate --json of a request (JSON text)");
  m.def(
      "simulate", [](const std::string& r) { return call(r, parasol::tools::simulate_request); },
      "parasol simulate --json of a request (JSON text)");
  m.def(
      "search", [](const std::string& r) { return call(r, parasol::tools::search_request); },
      "parasol search --json of a request (JSON text)");
  m.def(
      "sweep", [](const std::string& r) { return call(r, parasol::tools::sweep_request); },
      "parasol sweep --json of a sweep request (JSON text)");
  m.def(
      "validate", [](const std::string& r) { return call(r, parasol::tools::validate_request); },
      "parasol validate --json of a request (JSON text)");
  m.def(
      "export",
      [](const std::string& r, const std::string& framework) {
        return call(r, [&framework](const Json& j) {
          return parasol::tools::export_request(j, framework);
        });
      },
      "the plan of a request (JSON text) in another framework's terms");
}
