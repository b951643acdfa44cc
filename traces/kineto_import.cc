// Kineto trace import: device activities classified by kernel name and launch stack, sized from
// the CPU ops' and NCCL's args (see kineto_import.h).
#include "traces/kineto_import.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <set>
#include <unordered_map>

#include "core/error.h"
#include "traces/kernel_kinds.h"
#include "traces/summary.h"
#include "traces/text_file.h"

namespace parasol::traces {

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool has(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

// Letters and digits of `s`, lower-cased ("_allgather_base_" -> "allgatherbase").
std::string squash(const std::string& s) {
  std::string out;
  for (char c : s)
    if (std::isalnum(static_cast<unsigned char>(c)))
      out.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  return out;
}

// Bytes of one element of a PyTorch or NCCL dtype name and parasol's name of it ("" when parasol
// has none); 0 bytes when unknown.
struct DtypeInfo {
  double bytes = 0;
  std::string name;
};
DtypeInfo dtype_info(const std::string& t) {
  const std::string s = squash(t);
  if (s == "float" || s == "float32" || s == "fp32") return {4, "fp32"};
  if (s == "c10bfloat16" || s == "bfloat16" || s == "bf16") return {2, "bf16"};
  if (s == "c10half" || s == "half" || s == "float16" || s == "fp16") return {2, "fp16"};
  if (has(s, "float8")) return {1, "fp8"};
  if (s == "double" || s == "float64") return {8, ""};
  if (s == "int" || s == "int32" || s == "uint32") return {4, ""};
  if (s == "long" || s == "int64" || s == "longint" || s == "uint64") return {8, ""};
  if (s == "short" || s == "int16") return {2, ""};
  if (s == "unsignedchar" || s == "signedchar" || s == "char" || s == "byte" || s == "bool" ||
      s == "int8" || s == "uint8")
    return {1, ""};
  return {};
}

// One CPU-side event: a cpu_op or a runtime call.
struct HostEvent {
  double ts = 0, dur = 0;  // microseconds
  size_t index = 0;        // into the traceEvents array
};

// A device activity before classification.
struct Activity {
  size_t index = 0;  // into traceEvents
  std::string cat;
  int64_t tid = 0;  // its stream
};

const Json* arg(const Json& e, const char* key) {
  auto a = e.find("args");
  if (a == e.end() || !a->is_object()) return nullptr;
  auto it = a->find(key);
  return it == a->end() || it->is_null() ? nullptr : &*it;
}

// A number from an arg that may also be written as a numeric string; NaN when absent or not one.
double arg_number(const Json& e, const char* key) {
  const Json* v = arg(e, key);
  if (!v) return std::nan("");
  if (v->is_number()) return v->get<double>();
  if (v->is_string()) {
    try {
      size_t used = 0;
      const std::string s = v->get<std::string>();
      const double d = std::stod(s, &used);
      return used == s.size() ? d : std::nan("");
    } catch (const std::exception&) {
    }
  }
  return std::nan("");
}

std::string arg_string(const Json& e, const char* key) {
  const Json* v = arg(e, key);
  return v && v->is_string() ? v->get<std::string>() : "";
}

// "Input Dims" of a cpu op: one vector per input (empty: a scalar or not a tensor; a tensor list
// counts as empty).
std::vector<std::vector<int64_t>> input_dims(const Json& e) {
  std::vector<std::vector<int64_t>> out;
  const Json* d = arg(e, "Input Dims");
  if (!d || !d->is_array()) return out;
  for (const Json& x : *d) {
    std::vector<int64_t> dims;
    if (x.is_array())
      for (const Json& v : x) {
        if (!v.is_number_integer() || v.get<int64_t>() < 0) {
          dims.clear();
          break;
        }
        dims.push_back(v.get<int64_t>());
      }
    out.push_back(std::move(dims));
  }
  return out;
}

std::vector<std::string> input_types(const Json& e) {
  std::vector<std::string> out;
  const Json* t = arg(e, "Input type");
  if (!t || !t->is_array()) return out;
  for (const Json& x : *t) out.push_back(x.is_string() ? x.get<std::string>() : "");
  return out;
}

// Elements of a tensor of `dims`; capped at 1e30 (no real tensor is near it) so that sums and
// byte counts of a broken trace stay finite.
double product(const std::vector<int64_t>& dims) {
  double p = 1;
  for (int64_t d : dims) p = std::min(p * static_cast<double>(d), 1e30);
  return p;
}

// The name of traceEvents[i]'s field `key` in errors.
std::string at(const std::string& what, size_t i, const char* key) {
  return what + ".traceEvents[" + std::to_string(i) + "]." + key;
}

// Times in microseconds: a microsecond clock of up to 1e18 (30,000 years) in either direction.
constexpr double kMaxMicroseconds = 1e18;

double number_field(const Json& e, const std::string& what, size_t i, const char* key, double min) {
  auto it = e.find(key);
  if (it == e.end()) throw Error(at(what, i, key), "missing");
  if (!it->is_number()) throw Error(at(what, i, key), "must be a number");
  const double v = it->get<double>();
  if (!(v >= min && v <= kMaxMicroseconds))
    throw Error(at(what, i, key), std::string("must be a number of microseconds in [") +
                                      (min == 0 ? "0" : "-1e18") + ", 1e18]");
  return v;
}

// An integer id ("pid", "tid"); older exports write a stream as "stream 7", read as 7.
int64_t int_field(const Json& e, const std::string& what, size_t i, const char* key) {
  auto it = e.find(key);
  if (it == e.end()) throw Error(at(what, i, key), "missing");
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_string()) {
    const std::string v = it->get<std::string>();
    const size_t digits = v.rfind("stream ", 0) == 0 ? 7 : 0;
    if (v.size() > digits && v.size() - digits <= 9 &&
        v.find_first_not_of("0123456789", digits) == std::string::npos)
      return std::stoll(v.substr(digits));
  }
  throw Error(at(what, i, key), "must be an integer (or \"stream N\")");
}

// The launch stack of each runtime call: cpu ops of the call's thread that enclose its start,
// outermost first. Sweeps each thread's ops (by start, longest first) with an open-op stack.
std::unordered_map<size_t, std::vector<size_t>> launch_stacks(
    const std::map<std::pair<int64_t, int64_t>, std::vector<HostEvent>>& ops,
    const std::map<std::pair<int64_t, int64_t>, std::vector<HostEvent>>& calls) {
  std::unordered_map<size_t, std::vector<size_t>> out;
  for (const auto& [thread, cs] : calls) {
    auto it = ops.find(thread);
    if (it == ops.end()) continue;
    const std::vector<HostEvent>& os = it->second;
    std::vector<const HostEvent*> open;
    size_t next = 0;
    for (const HostEvent& c : cs) {
      while (next < os.size() && os[next].ts <= c.ts) {
        while (!open.empty() && open.back()->ts + open.back()->dur < os[next].ts) open.pop_back();
        open.push_back(&os[next]);
        ++next;
      }
      while (!open.empty() && open.back()->ts + open.back()->dur < c.ts) open.pop_back();
      std::vector<size_t>& stack = out[c.index];
      for (const HostEvent* o : open)
        if (o->ts <= c.ts && c.ts <= o->ts + o->dur) stack.push_back(o->index);
    }
  }
  return out;
}

// A GEMM's shape from a stack op's name and dims; false when it is not a GEMM op with dims.
bool gemm_shape(const std::string& op, const std::vector<std::vector<int64_t>>& d, KernelShape& s) {
  auto set = [&](int64_t b, int64_t m, int64_t k, int64_t n) {
    constexpr int64_t kMax = int64_t{1} << 40;  // beyond any real matrix: a broken trace
    if (m <= 0 || n <= 0 || k <= 0 || b <= 0 || m > kMax || n > kMax || k > kMax || b > kMax)
      return false;
    s.batch = b, s.m = m, s.k = k, s.n = n;
    return true;
  };
  if (op == "aten::mm" && d.size() >= 2 && d[0].size() == 2 && d[1].size() == 2)
    return set(1, d[0][0], d[0][1], d[1][1]);
  if (op == "aten::addmm" && d.size() >= 3 && d[1].size() == 2 && d[2].size() == 2)
    return set(1, d[1][0], d[1][1], d[2][1]);
  if (op == "aten::bmm" && d.size() >= 2 && d[0].size() == 3 && d[1].size() == 3)
    return set(d[0][0], d[0][1], d[0][2], d[1][2]);
  if (op == "aten::baddbmm" && d.size() >= 3 && d[1].size() == 3 && d[2].size() == 3)
    return set(d[1][0], d[1][1], d[1][2], d[2][2]);
  if ((op == "aten::linear" || op == "aten::_addmm_activation") && d.size() >= 2 &&
      d[0].size() >= 1 && d[1].size() == 2) {
    const double m = product({d[0].begin(), d[0].end() - 1});
    return m <= 1e12 && set(1, static_cast<int64_t>(m), d[0].back(), d[1][0]);
  }
  if (op == "aten::matmul" && d.size() >= 2 && d[0].size() >= 2 && d[1].size() == 2) {
    const double m = product({d[0].begin(), d[0].end() - 1});
    return m <= 1e12 && set(1, static_cast<int64_t>(m), d[0].back(), d[1][1]);
  }
  return false;
}

bool is_attention_op(const std::string& op) {
  return has(op, "scaled_dot_product") || has(op, "flash_attention") ||
         has(op, "efficient_attention") || has(op, "cudnn_attention");
}

// The phase a launch stack says: backward inside autograd's engine, optimizer inside an
// optimizer step, else forward; "" without a stack.
std::string phase_of(const std::vector<std::string>& names) {
  if (names.empty()) return "";
  for (const std::string& n : names)
    if (n.rfind("Optimizer.step", 0) == 0 || has(n, "optimizer_step")) return "optimizer";
  for (const std::string& n : names)
    if (n.rfind("autograd::engine::evaluate_function", 0) == 0 || has(n, "Backward")) return "bwd";
  return "fwd";
}

// Fills a collective's kind, size, dtype and group from the args of `e` (the kernel itself or
// record_param_comms, newer Kineto); false when `e` has no message size.
bool comm_from_args(const Json& e, std::string& kind, double& bytes, KernelShape& s) {
  const std::string name = arg_string(e, "Collective name");
  if (!name.empty()) {
    const std::string k = collective_kind(name);
    if (!k.empty()) kind = k;
  }
  const double in = arg_number(e, "In msg nelems"), out = arg_number(e, "Out msg nelems");
  const double group = arg_number(e, "Group size");
  if (group >= 1 && group <= (1 << 24)) s.group_size = static_cast<int>(group);
  std::string g = arg_string(e, "Process Group Description");
  if (g.empty() || g == "undefined") g = arg_string(e, "Process Group Name");
  if (!g.empty()) s.group = g;
  const DtypeInfo dt = dtype_info(arg_string(e, "dtype"));
  if (!(in >= 0 && in <= 1e30) || dt.bytes <= 0) return false;
  double elements = in;
  if (kind == "all-gather")
    elements = out > 0 && out <= 1e30 ? out : in * std::max(1, s.group_size);
  else if (kind == "recv" && out > 0 && out <= 1e30)
    elements = out;
  s.elements = elements;
  s.dtype = dt.name;
  bytes = elements * dt.bytes;
  return true;
}

// Sizes a collective from the first input of an older record_param_comms (its input tensor):
// the payload for every kind whose payload is its input (not all-gather).
bool comm_from_old_rpc(const Json& e, const std::string& kind, double& bytes, KernelShape& s) {
  if (kind == "all-gather") return false;
  const auto dims = input_dims(e);
  const auto types = input_types(e);
  if (dims.empty() || dims[0].empty() || types.empty()) return false;
  const DtypeInfo dt = dtype_info(types[0]);
  if (dt.bytes <= 0) return false;
  s.elements = product(dims[0]);
  s.dtype = dt.name;
  bytes = s.elements * dt.bytes;
  return true;
}

// Sizes a collective from its c10d op ("c10d::allreduce_", "c10d::_allgather_base_", ...):
// its kind from the name, the payload from the tensor the nccl-tests convention names.
bool comm_from_c10d(const Json& e, std::string& kind, double& bytes, KernelShape& s) {
  const std::string name = e["name"].get<std::string>();
  const std::string k = collective_kind(name.substr(6));
  if (!k.empty()) kind = k;
  const auto dims = input_dims(e);
  const auto types = input_types(e);
  // The payload's position: (output, input) for the _base_ forms of all-to-all and
  // reduce-scatter, the output (first) for all-gather, else the first tensor.
  size_t pos = 0;
  if ((kind == "all-to-all" || kind == "reduce-scatter") && has(name, "base")) pos = 1;
  if (dims.size() <= pos || dims[pos].empty() || types.size() <= pos) return false;
  const DtypeInfo dt = dtype_info(types[pos]);
  if (dt.bytes <= 0) return false;
  s.elements = product(dims[pos]);
  s.dtype = dt.name;
  bytes = s.elements * dt.bytes;
  return true;
}

// Whether a memory-bound kernel reads its op's first input once and writes as much: norms,
// activations and pointwise kernels. Gathers, scatters, concatenations, reductions, scans and
// sorts move other amounts (an index_select reads a few rows of a large table), so their bytes
// stay unknown.
bool streams_its_input(const std::string& kind, const std::string& lname) {
  if (kind == "norm" || kind == "activation") return true;
  return kind == "elementwise" && has(lname, "elementwise_kernel") && !has(lname, "index") &&
         !has(lname, "scatter") && !has(lname, "gather");
}

struct Classified {
  std::string kind;
  double bytes = 0, flops = 0;
  std::string phase, group;
  KernelShape shape;
};

// Classifies one kernel given its launch stack (traceEvents indices, outermost first).
Classified classify(const Json& ev, const std::string& name, const Json& events,
                    const std::vector<size_t>* stack) {
  Classified c;
  c.kind = classify_kernel(name);
  std::vector<std::string> names;
  if (stack)
    for (size_t i : *stack) names.push_back(events[i]["name"].get<std::string>());
  c.phase = phase_of(names);
  const bool comm = is_communication_kind(c.kind);
  // Collectives: the kernel's args, then record_param_comms, then c10d ops (innermost first).
  if (comm) {
    // The kind the PyTorch op says (a SendRecv kernel runs all-to-alls too), then the sizes.
    if (stack)
      for (size_t i : *stack) {
        const std::string& n = events[i]["name"].get_ref<const std::string&>();
        if (n.rfind("c10d::", 0) == 0 && !collective_kind(n.substr(6)).empty())
          c.kind = collective_kind(n.substr(6));
      }
    bool sized = comm_from_args(ev, c.kind, c.bytes, c.shape);
    if (sized) c.shape.size_from = "kernel";
    if (stack)
      for (auto it = stack->rbegin(); it != stack->rend() && !sized; ++it) {
        const Json& op = events[*it];
        const std::string& n = op["name"].get_ref<const std::string&>();
        if (n == "record_param_comms") {
          sized = comm_from_args(op, c.kind, c.bytes, c.shape) ||
                  comm_from_old_rpc(op, c.kind, c.bytes, c.shape);
          if (sized) c.shape.size_from = "record_param_comms";
        } else if (n.rfind("c10d::", 0) == 0) {
          sized = comm_from_c10d(op, c.kind, c.bytes, c.shape);
          if (sized) c.shape.size_from = "c10d";
        }
      }
    c.group = c.shape.group;
    return c;
  }
  if (!stack || c.kind.empty()) return c;
  // Compute: the innermost op that says a shape. A GEMM's split-k reduction or epilogue kernel
  // is part of the GEMM: it takes no shape (the GEMM's main kernel does).
  const std::string lname = lower(name);
  const bool gemm_part = has(lname, "splitkreduce") || has(lname, "epilogue");
  for (auto it = stack->rbegin(); it != stack->rend(); ++it) {
    const Json& op = events[*it];
    const std::string& n = op["name"].get_ref<const std::string&>();
    const auto dims = input_dims(op);
    if (dims.empty()) continue;
    const auto types = input_types(op);
    const DtypeInfo dt = dtype_info(types.empty() ? "" : types[0]);
    if (c.kind == "linear" && !gemm_part && gemm_shape(n, dims, c.shape)) {
      for (const std::string& t : types)
        if (c.shape.dtype.empty()) c.shape.dtype = dtype_info(t).name;
      // fp32 GEMMs on tensor cores compute in tf32 (cuBLAS's and CUTLASS's names say so).
      if (c.shape.dtype == "fp32" && (has(lname, "tf32") || has(lname, "tensorop_s")))
        c.shape.dtype = "tf32";
      c.flops = 2.0 * c.shape.batch * c.shape.m * c.shape.n * c.shape.k;
      return c;
    }
    if (c.kind == "attention" && is_attention_op(n) && dims.size() >= 2 && dims[0].size() == 4 &&
        dims[1].size() == 4) {
      KernelShape& s = c.shape;
      s.attn_batch = dims[0][0], s.heads = dims[0][1], s.seq_q = dims[0][2],
      s.head_dim = dims[0][3];
      s.kv_heads = dims[1][1], s.seq_kv = dims[1][2];
      s.dtype = dt.name;
      const bool backward =
          has(lower(name), "bwd") || has(lower(name), "backward") || has(n, "backward");
      c.flops =
          4.0 * s.attn_batch * s.heads * s.seq_q * s.seq_kv * s.head_dim * (backward ? 2.5 : 1.0);
      return c;
    }
    if (c.kind != "linear" && c.kind != "attention" && !dims[0].empty()) {
      c.shape.elements = product(dims[0]);
      c.shape.dtype = dt.name;
      if (dt.bytes > 0 && streams_its_input(c.kind, lname))
        c.bytes = 2 * c.shape.elements * dt.bytes;
      return c;
    }
  }
  return c;
}

}  // namespace

bool looks_like_kineto(const Json& j) {
  if (!j.is_object()) return false;
  auto other = j.find("otherData");
  if (other != j.end() && other->is_object() && other->value("generator", "") == "parasol")
    return false;
  if (j.contains("schemaVersion") || j.contains("distributedInfo") ||
      j.contains("deviceProperties"))
    return true;
  auto ev = j.find("traceEvents");
  if (ev == j.end() || !ev->is_array()) return false;
  for (const Json& e : *ev)
    if (e.is_object() && e.contains("cat") && e["cat"].is_string()) {
      const std::string c = e["cat"].get<std::string>();
      if (c == "kernel" || c == "gpu_memcpy" || c == "gpu_memset" || c == "cuda_runtime")
        return true;
    }
  return false;
}

ImportedTrace import_kineto(const Json& j, const std::string& what, int default_rank) {
  const Json* events = nullptr;
  int rank = default_rank;
  if (j.is_array()) {
    events = &j;
  } else if (j.is_object()) {
    auto it = j.find("traceEvents");
    if (it == j.end()) throw Error(what + ".traceEvents", "missing");
    if (!it->is_array()) throw Error(what + ".traceEvents", "must be an array");
    events = &*it;
    auto di = j.find("distributedInfo");
    if (di != j.end() && !di->is_null()) {
      JsonReader r(*di, what + ".distributedInfo");
      if (r.has("rank")) rank = static_cast<int>(r.integer("rank", 0, 1 << 24));
    }
  } else {
    throw Error(what, "must be a JSON object with traceEvents, or an array of events");
  }
  ImportedTrace imp;
  imp.trace.source = "measured";
  std::map<std::pair<int64_t, int64_t>, std::vector<HostEvent>> ops, calls;
  std::unordered_map<int64_t, HostEvent> call_of;  // correlation -> runtime call
  std::vector<Activity> acts;
  std::set<std::string> step_names;
  for (size_t i = 0; i < events->size(); ++i) {
    const Json& e = (*events)[i];
    if (!e.is_object())
      throw Error(what + ".traceEvents[" + std::to_string(i) + "]", "must be an object");
    auto ph = e.find("ph");
    if (ph == e.end() || !ph->is_string() || ph->get<std::string>() != "X") continue;
    auto cat_it = e.find("cat");
    if (cat_it == e.end() || !cat_it->is_string()) continue;
    const std::string cat = cat_it->get<std::string>();
    if (cat == "user_annotation" && e.contains("name") && e["name"].is_string() &&
        e["name"].get<std::string>().rfind("ProfilerStep#", 0) == 0)
      step_names.insert(e["name"].get<std::string>());
    const bool device = cat == "kernel" || cat == "gpu_memcpy" || cat == "gpu_memset";
    const bool host_op = cat == "cpu_op";
    const bool call = cat == "cuda_runtime" || cat == "cuda_driver";
    if (!device && !host_op && !call) continue;
    auto name = e.find("name");
    if (name == e.end()) throw Error(at(what, i, "name"), "missing");
    if (!name->is_string()) throw Error(at(what, i, "name"), "must be a string");
    const double ts = number_field(e, what, i, "ts", -kMaxMicroseconds);
    const double dur = number_field(e, what, i, "dur", 0);
    const int64_t pid = int_field(e, what, i, "pid");
    const int64_t tid = int_field(e, what, i, "tid");
    if (host_op) {
      ops[{pid, tid}].push_back({ts, dur, i});
    } else if (call) {
      calls[{pid, tid}].push_back({ts, dur, i});
      const double corr = arg_number(e, "correlation");
      if (std::fabs(corr) < 9e18) call_of[static_cast<int64_t>(corr)] = {ts, dur, i};
    } else {
      acts.push_back({i, cat, tid});
    }
  }
  auto by_start = [](const HostEvent& a, const HostEvent& b) {
    return a.ts != b.ts ? a.ts < b.ts : a.dur > b.dur;
  };
  for (auto& [t, v] : ops) std::sort(v.begin(), v.end(), by_start);
  for (auto& [t, v] : calls) std::sort(v.begin(), v.end(), by_start);
  const auto stacks = launch_stacks(ops, calls);

  std::vector<DeviceSpan> spans;
  for (const Activity& a : acts) {
    const Json& e = (*events)[a.index];
    const std::string name = e["name"].get<std::string>();
    TraceEvent t;
    t.rank = rank;
    const int64_t tid = a.tid;
    if (tid < 0 || tid > std::numeric_limits<int>::max())
      throw Error(at(what, a.index, "tid"), "must be a stream number >= 0");
    t.stream = static_cast<int>(tid);
    t.name = name;
    t.start_s = e["ts"].get<double>() * 1e-6;
    t.dur_s = e["dur"].get<double>() * 1e-6;
    KernelShape shape;
    const double corr = arg_number(e, "correlation");
    const HostEvent* launch = nullptr;
    if (std::fabs(corr) < 9e18) {
      auto it = call_of.find(static_cast<int64_t>(corr));
      if (it != call_of.end()) launch = &it->second;
    }
    if (a.cat == "kernel") {
      ++imp.kernels;
      const std::vector<size_t>* stack = nullptr;
      if (launch) {
        auto s = stacks.find(launch->index);
        if (s != stacks.end()) stack = &s->second;
      }
      Classified c = classify(e, name, *events, stack);
      t.kind = c.kind.empty() ? "unclassified" : c.kind;
      t.bytes = c.bytes;
      t.flops = c.flops;
      t.phase = c.phase;
      t.group = c.group;
      shape = c.shape;
    } else {
      const std::string s = lower(name);
      if (a.cat == "gpu_memset")
        t.kind = "memset";
      else if (has(s, "htod"))
        t.kind = "prefetch";
      else if (has(s, "dtoh"))
        t.kind = "offload";
      else
        t.kind = "memcpy";
      const double b = arg_number(e, "bytes");
      if (b >= 0 && b <= 1e30) t.bytes = b;
    }
    spans.push_back({e["ts"].get<double>(), e["ts"].get<double>() + e["dur"].get<double>(),
                     launch ? launch->ts + launch->dur : -1});
    imp.trace.events.push_back(std::move(t));
    imp.shapes.push_back(std::move(shape));
  }
  finish_rank(imp, rank, spans);
  imp.steps = std::max<int>(1, step_names.size());
  return imp;
}

ImportedTrace import_kineto_files(const std::vector<std::string>& paths) {
  if (paths.empty()) throw Error("traces", "no trace file given");
  std::vector<ImportedTrace> parts;
  for (size_t f = 0; f < paths.size(); ++f)
    parts.push_back(import_kineto(parse_json(read_text_file(paths[f]), paths[f]), paths[f],
                                  static_cast<int>(f)));
  return merge_imported(std::move(parts), paths);
}

}  // namespace parasol::traces
