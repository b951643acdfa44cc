// Kineto trace import: device activities classified by kernel name and launch stack, sized from
// the CPU ops' and NCCL's args (see kineto_import.h).
#include "traces/kineto_import.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <deque>
#include <istream>
#include <limits>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"
#include "traces/kernel_kinds.h"
#include "traces/summary.h"
#include "traces/text_file.h"
#include "traces/trace.h"

namespace parasol::traces {

namespace {

// Bytes of one element of a PyTorch or NCCL dtype name and parasol's name of it ("" when parasol
// has none); 0 bytes when unknown.
struct DtypeInfo {
  double bytes = 0;
  std::string name;
};
DtypeInfo dtype_info(const std::string& t) {
  const std::string s = squash_name(t);
  if (s == "float" || s == "float32" || s == "fp32") return {4, "fp32"};
  if (s == "c10bfloat16" || s == "bfloat16" || s == "bf16") return {2, "bf16"};
  if (s == "c10half" || s == "half" || s == "float16" || s == "fp16") return {2, "fp16"};
  if (name_has(s, "float8")) return {1, "fp8"};
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

// The args of an event that the import reads, kept as {"args": {...}} (so that arg() reads them)
// when the rest of the event is dropped: a collective's sizes and group (on an NCCL kernel, a
// record_param_comms or a c10d op), an attention op's "Concrete Inputs".
constexpr const char* kCommArgs[] = {"Collective name",     "In msg nelems",
                                     "Out msg nelems",      "Group size",
                                     "Process Group Ranks", "Process Group Description",
                                     "Process Group Name",  "Global rank start",
                                     "Global rank stride",  "dtype"};
Json kept_args(const Json& e, bool comm, bool attention) {
  Json kept;
  auto a = e.find("args");
  if (a == e.end() || !a->is_object()) return kept;
  auto keep = [&](const char* key) {
    auto it = a->find(key);
    if (it != a->end() && !it->is_null()) kept["args"][key] = *it;
  };
  if (comm)
    for (const char* k : kCommArgs) keep(k);
  if (attention) keep("Concrete Inputs");
  return kept;
}

// A device activity before classification: what the import reads of it.
struct Activity {
  size_t index = 0;  // into traceEvents
  enum Cat : char { kKernel, kMemcpy, kMemset } cat = kKernel;
  int64_t tid = 0;  // its stream
  std::string name;
  double ts = 0, dur = 0;  // microseconds
  double correlation = 0;  // NaN when absent
  double bytes = 0;        // the "bytes" arg; NaN when absent
  Json kept;               // kept_args (a collective's)
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
  if (!d) d = arg(e, "Input dims");  // PyTorch 1.8-1.9
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

// What the import keeps of a CPU op (the rest of its event is dropped as it is read).
// Its name, dims and types are interned (a trace repeats a few of each many times).
using Dims = std::vector<std::vector<int64_t>>;
using Types = std::vector<std::string>;
struct HostOp {
  const std::string* name_;
  const Dims* dims_;    // input_dims
  const Types* types_;  // input_types
  Json kept;            // kept_args: a collective op's, an attention op's
  const std::string& name() const { return *name_; }
  const Dims& dims() const { return *dims_; }
  const Types& types() const { return *types_; }
};

// One copy of each distinct value, at a stable address.
template <typename T>
class Interned {
 public:
  const T* operator()(T v) { return &*values_.insert(std::move(v)).first; }

 private:
  std::set<T> values_;
};

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
// Only the calls in `wanted` (their index) get a stack.
std::unordered_map<size_t, std::vector<size_t>> launch_stacks(
    const std::map<std::pair<int64_t, int64_t>, std::vector<HostEvent>>& ops,
    const std::map<std::pair<int64_t, int64_t>, std::vector<HostEvent>>& calls,
    const std::unordered_set<size_t>& wanted) {
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
      if (!wanted.count(c.index)) continue;
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

// Where an attention op of PyTorch holds what parasol reads (aten's native_functions.yaml schemas):
// the query's position among its inputs (a backward's first input is grad_out), the layout of
// q, k, v ("bshd": the innermost kernels' ops, which take them after SDPA's transpose(1, 2); else
// SDPA's [batch, heads, seq, head_dim]), and the position of its bool is_causal, or of its int
// custom_mask_type (the efficient kernels': 0 none, 1 causal from the top left, 2 from the bottom
// right), in the record's "Concrete Inputs".
struct AttentionSchema {
  const char* op;
  int query = 0;
  bool bshd = false;
  int is_causal = -1, mask_type = -1;
  bool backward = false;
};
constexpr AttentionSchema kAttentionSchemas[] = {
    // scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    {"aten::scaled_dot_product_attention", 0, false, 5, -1, false},
    // _scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal, return_debug_mask)
    {"aten::_scaled_dot_product_flash_attention", 0, false, 4, -1, false},
    {"aten::_scaled_dot_product_flash_attention_for_cpu", 0, false, 4, -1, false},
    // ..._backward(grad_out, q, k, v, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k,
    //              dropout_p, is_causal, ...)
    {"aten::_scaled_dot_product_flash_attention_backward", 1, false, 11, -1, true},
    // ..._for_cpu_backward(grad_out, q, k, v, out, logsumexp, dropout_p, is_causal, ...)
    {"aten::_scaled_dot_product_flash_attention_for_cpu_backward", 1, false, 7, -1, true},
    // _scaled_dot_product_efficient_attention(q, k, v, attn_bias, compute_log_sumexp, dropout_p,
    //                                         is_causal)
    {"aten::_scaled_dot_product_efficient_attention", 0, false, 6, -1, false},
    // ..._backward(grad_out_, q, k, v, attn_bias, out, logsumexp, philox_seed, philox_offset,
    //              dropout_p, grad_input_mask, is_causal)
    {"aten::_scaled_dot_product_efficient_attention_backward", 1, false, 11, -1, true},
    // _scaled_dot_product_cudnn_attention(q, k, v, attn_bias, compute_log_sumexp, dropout_p,
    //                                     is_causal, return_debug_mask)
    {"aten::_scaled_dot_product_cudnn_attention", 0, false, 6, -1, false},
    // ..._backward(grad_out, q, k, v, out, logsumexp, philox_seed, philox_offset, attn_bias,
    //              cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal)
    {"aten::_scaled_dot_product_cudnn_attention_backward", 1, false, 14, -1, true},
    // _flash_attention_forward(q, k, v, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal)
    {"aten::_flash_attention_forward", 0, true, 8, -1, false},
    // _flash_attention_backward(grad_out, q, k, v, out, logsumexp, cum_seq_q, cum_seq_k, max_q,
    //                           max_k, dropout_p, is_causal, ...)
    {"aten::_flash_attention_backward", 1, true, 11, -1, true},
    // _efficient_attention_forward(q, k, v, bias, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
    //                              max_seqlen_k, dropout_p, custom_mask_type, ...)
    {"aten::_efficient_attention_forward", 0, true, -1, 9, false},
    // _efficient_attention_backward(grad_out_, q, k, v, bias, out, cu_seqlens_q, cu_seqlens_k,
    //   max_seqlen_q, max_seqlen_k, logsumexp, dropout_p, philox_seed, philox_offset,
    //   custom_mask_type, ...)
    {"aten::_efficient_attention_backward", 1, true, -1, 14, true},
};

const AttentionSchema* attention_schema(const std::string& op) {
  for (const AttentionSchema& a : kAttentionSchemas)
    if (op == a.op) return &a;
  return nullptr;
}

// Whether a cpu op's "Concrete Inputs" (the values of its scalar arguments, as strings, with
// record_shapes) say the attention is causal: 1 yes, 0 no, -1 not said.
int causal_of(const Json& e, const AttentionSchema& a) {
  const Json* c = arg(e, "Concrete Inputs");
  if (!c || !c->is_array()) return -1;
  const int pos = a.is_causal >= 0 ? a.is_causal : a.mask_type;
  if (pos < 0 || static_cast<size_t>(pos) >= c->size() || !(*c)[pos].is_string()) return -1;
  const std::string v = lower_case((*c)[pos].get<std::string>());
  if (a.is_causal >= 0) return v == "true" ? 1 : v == "false" ? 0 : -1;
  return v == "0" ? 0 : (v == "1" || v == "2") ? 1 : -1;
}

// The phase a launch stack says: backward inside autograd's engine, optimizer inside an
// optimizer step, else forward; "" without a stack.
std::string phase_of(const std::vector<std::string>& names) {
  if (names.empty()) return "";
  for (const std::string& n : names)
    if (n.rfind("Optimizer.step", 0) == 0 || name_has(n, "optimizer_step")) return "optimizer";
  for (const std::string& n : names)
    if (n.rfind("autograd::engine::evaluate_function", 0) == 0 || name_has(n, "Backward"))
      return "bwd";
  return "fwd";
}

// The global ranks of a collective's communicator as its args state them: "Process Group Ranks"
// (a list, or the string "[0, 8, 16]" as PyTorch writes it), else "Global rank start" and
// "Global rank stride" with "Group size"; empty when not stated or malformed.
std::vector<int> group_ranks_of(const Json& e) {
  std::vector<int> out;
  constexpr int64_t kMaxRank = 1 << 24;
  if (const Json* r = arg(e, "Process Group Ranks")) {
    Json list;
    if (r->is_array()) {
      list = *r;
    } else if (r->is_string()) {
      list = Json::parse(r->get<std::string>(), nullptr, false);
    }
    if (list.is_array()) {
      for (const Json& x : list) {
        if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > kMaxRank)
          return {};
        out.push_back(static_cast<int>(x.get<int64_t>()));
      }
      if (!out.empty()) return out;
    }
  }
  const double start = arg_number(e, "Global rank start");
  const double stride = arg_number(e, "Global rank stride");
  const double size = arg_number(e, "Group size");
  if (start >= 0 && stride >= 1 && size >= 1 && start + stride * (size - 1) <= kMaxRank)
    for (int i = 0; i < static_cast<int>(size); ++i)
      out.push_back(static_cast<int>(start + stride * i));
  return out;
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
  if (std::vector<int> ranks = group_ranks_of(e); !ranks.empty()) s.group_ranks = std::move(ranks);
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
bool comm_from_old_rpc(const HostOp& e, const std::string& kind, double& bytes, KernelShape& s) {
  if (kind == "all-gather") return false;
  const auto& dims = e.dims();
  const auto& types = e.types();
  if (dims.empty() || dims[0].empty() || types.empty()) return false;
  const DtypeInfo dt = dtype_info(types[0]);
  if (dt.bytes <= 0) return false;
  s.elements = product(dims[0]);
  s.dtype = dt.name;
  bytes = s.elements * dt.bytes;
  return true;
}

// The length of a collective op's namespace: PyTorch's c10d ops ("c10d::allreduce_"), its
// functional collectives ("_c10d_functional::all_reduce", as torch.compile and DTensor issue
// them) and its symmetric-memory ops ("symm_mem::multimem_all_reduce_"); 0 for other ops.
size_t collective_op_prefix(const std::string& name) {
  for (const char* ns : {"c10d::", "_c10d_functional::", "symm_mem::"})
    if (name.rfind(ns, 0) == 0) return std::char_traits<char>::length(ns);
  return 0;
}

// Sizes a collective from its collective op (collective_op_prefix: "c10d::allreduce_",
// "c10d::_allgather_base_", "symm_mem::multimem_all_reduce_", ...): its kind from the name, the
// payload from the tensor the nccl-tests convention names. The functional and symmetric-memory
// all-gathers take their input first (the output is group-size times it): not sized here.
bool comm_from_c10d(const HostOp& e, std::string& kind, double& bytes, KernelShape& s) {
  const std::string& name = e.name();
  const size_t prefix = collective_op_prefix(name);
  const std::string k = collective_kind(name.substr(prefix));
  if (!k.empty()) kind = k;
  const auto& dims = e.dims();
  const auto& types = e.types();
  // The payload's position: (output, input) for the _base_ forms of all-to-all and
  // reduce-scatter, the output (first) for all-gather, else the first tensor.
  size_t pos = 0;
  if ((kind == "all-to-all" || kind == "reduce-scatter") && name_has(name, "base")) pos = 1;
  if (kind == "all-gather" && name.rfind("c10d::", 0) != 0) return false;
  if (dims.size() <= pos || dims[pos].empty() || types.size() <= pos) return false;
  const DtypeInfo dt = dtype_info(types[pos]);
  if (dt.bytes <= 0) return false;
  s.elements = product(dims[pos]);
  s.dtype = dt.name;
  bytes = s.elements * dt.bytes;
  return true;
}

// Whether a memory-bound kernel streams its op's tensors (reads each input once, writes its
// output once): norms, activations and pointwise kernels. Gathers, scatters, concatenations,
// reductions, scans and sorts move other amounts (an index_select reads a few rows of a large
// table), so their bytes stay unknown.
bool streams_its_tensors(const std::string& kind, const std::string& lname) {
  if (kind == "norm" || kind == "activation") return true;
  return kind == "elementwise" && name_has(lname, "elementwise_kernel") &&
         !name_has(lname, "index") && !name_has(lname, "scatter") && !name_has(lname, "gather");
}

// Bytes a memory-bound op moves: every tensor input read once (a binary op's two operands, a
// backward's gradient and saved input, a norm's weight) and its output written once, shaped as
// its largest input (pointwise outputs broadcast to it; a norm's output is its input's shape) in
// that input's dtype. Kineto records no output dims. An in-place op ("aten::add_") writes its
// first input, which it also reads; aten::copy_, fill_ and zero_ only write it. Inputs of unknown
// dtype count nothing.
double streamed_bytes(const std::string& op, const std::vector<std::vector<int64_t>>& dims,
                      const std::vector<std::string>& types) {
  const bool write_only = op == "aten::copy_" || op == "aten::fill_" || op == "aten::zero_";
  double bytes = 0, out = 0;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i].empty()) continue;  // a scalar, None or a tensor list
    const double b = product(dims[i]) * dtype_info(i < types.size() ? types[i] : "").bytes;
    if (!(write_only && i == 0)) bytes += b;
    out = std::max(out, b);
  }
  return std::min(bytes + out, 1e30);
}

// Ops that convert their one input to another dtype, which Kineto does not record (it records
// no output): the bytes of an element of their output by the op's definition, else 0. fbgemm_gpu's
// src/quantize_ops/quantize_hfp8.cu: _float_to_hfp8_gpu (fbgemm::FloatToHFP8Quantized) writes
// at::kByte from float, _hfp8_to_float_gpu (fbgemm::HFP8QuantizedToFloat) at::kFloat from bytes;
// each is one gpu_kernel over its input (read once, output written once).
double converted_element_bytes(const std::string& op) {
  if (op == "fbgemm::FloatToHFP8Quantized") return 1;
  if (op == "fbgemm::HFP8QuantizedToFloat") return 4;
  return 0;
}

// Whether an op converts between dtypes (fbgemm's quantize and dequantize ops: "...Quantized...")
// without converted_element_bytes knowing its output's: its bytes stay unknown (streamed_bytes
// would write the output in the input's dtype: 8 bytes an element for float -> 8-bit, where the
// kernel moves 5).
bool converts_dtype(const std::string& op) {
  return converted_element_bytes(op) > 0 || name_has(op, "Quantized") || name_has(op, "quantize");
}

struct Classified {
  std::string kind;
  double bytes = 0, flops = 0;
  std::string phase, group;
  KernelShape shape;
};

// Classifies one kernel given its launch stack (indices into `ops`, outermost first).
Classified classify(const Activity& ev, const std::deque<HostOp>& ops,
                    const std::vector<size_t>* stack, const std::string& kind = "") {
  const std::string& name = ev.name;
  Classified c;
  c.kind = kind.empty() ? classify_kernel(name) : kind;
  std::vector<std::string> names;
  if (stack)
    for (size_t i : *stack) names.push_back(ops[i].name());
  c.phase = phase_of(names);
  // A GEMM launched by PyTorch's grouped matmul (MoE experts: torch._grouped_mm) is an expert
  // GEMM, whatever its kernel is called.
  // So is one launched by vLLM's fused MoE layer (vllm::moe_forward: TensorRT-LLM's trtllm-gen
  // bmm_* kernels on B200) or a fused_moe op.
  if (c.kind == "linear")
    for (const std::string& n : names)
      if (n == "aten::_grouped_mm" || n == "aten::_scaled_grouped_mm" ||
          name_has(n, "moe_forward") || name_has(n, "fused_moe"))
        c.kind = "expert-linear";
  const bool comm = is_communication_kind(c.kind);
  // Collectives: the kernel's args, then record_param_comms, then c10d ops (innermost first).
  if (comm) {
    // The kind the PyTorch op says (a SendRecv kernel runs all-to-alls too), then the sizes.
    if (stack)
      for (size_t i : *stack) {
        const std::string& n = ops[i].name();
        const size_t prefix = collective_op_prefix(n);
        if (prefix > 0 && !collective_kind(n.substr(prefix)).empty())
          c.kind = collective_kind(n.substr(prefix));
      }
    bool sized = comm_from_args(ev.kept, c.kind, c.bytes, c.shape);
    if (sized) c.shape.size_from = "kernel";
    if (stack)
      for (auto it = stack->rbegin(); it != stack->rend() && !sized; ++it) {
        const HostOp& op = ops[*it];
        const std::string& n = op.name();
        if (n == "record_param_comms") {
          sized = comm_from_args(op.kept, c.kind, c.bytes, c.shape) ||
                  comm_from_old_rpc(op, c.kind, c.bytes, c.shape);
          if (sized) c.shape.size_from = "record_param_comms";
        } else if (collective_op_prefix(n) > 0) {
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
  const std::string lname = lower_case(name);
  const bool gemm_part = name_has(lname, "splitkreduce") || name_has(lname, "epilogue");
  // FlashAttention's backward preprocessing (dot(dO, O)) and dQ conversion kernels are part of
  // the backward whose main kernel does its FLOPs: they take no shape.
  const bool attention_part = c.kind == "attention" && is_attention_helper_kernel(name);
  for (auto it = stack->rbegin(); it != stack->rend(); ++it) {
    const HostOp& op = ops[*it];
    const std::string& n = op.name();
    const auto& dims = op.dims();
    if (dims.empty()) continue;
    const auto& types = op.types();
    const DtypeInfo dt = dtype_info(types.empty() ? "" : types[0]);
    if (c.kind == "linear" && !gemm_part && gemm_shape(n, dims, c.shape)) {
      for (const std::string& t : types)
        if (c.shape.dtype.empty()) c.shape.dtype = dtype_info(t).name;
      // fp32 GEMMs on tensor cores compute in tf32 (cuBLAS's and CUTLASS's names say so).
      if (c.shape.dtype == "fp32" && (name_has(lname, "tf32") || name_has(lname, "tensorop_s")))
        c.shape.dtype = "tf32";
      c.flops = 2.0 * c.shape.batch * c.shape.m * c.shape.n * c.shape.k;
      return c;
    }
    if (c.kind == "attention") {
      // The innermost attention op with q, k, v defines the shape; is_causal is read from it,
      // else from an enclosing attention op that states it.
      const AttentionSchema* a = attention_schema(n);
      const size_t q = a ? static_cast<size_t>(a->query) : 0;
      if (!a || attention_part || dims.size() < q + 2 || dims[q].size() != 4 ||
          dims[q + 1].size() != 4)
        continue;
      const std::vector<int64_t>& qd = dims[q];
      const std::vector<int64_t>& kd = dims[q + 1];
      KernelShape& s = c.shape;
      s.attn_batch = qd[0], s.head_dim = qd[3];
      s.heads = a->bshd ? qd[2] : qd[1];
      s.seq_q = a->bshd ? qd[1] : qd[2];
      s.kv_heads = a->bshd ? kd[2] : kd[1];
      s.seq_kv = a->bshd ? kd[1] : kd[2];
      s.dtype = dtype_info(types.size() > q ? types[q] : "").name;
      s.causal = causal_of(op.kept, *a);
      for (auto outer = it; outer != stack->rend() && s.causal < 0; ++outer) {
        const HostOp& o = ops[*outer];
        if (const AttentionSchema* oa = attention_schema(o.name()))
          s.causal = causal_of(o.kept, *oa);
      }
      s.backward = a->backward || is_backward_kernel(name);
      if (s.backward) c.phase = "bwd";
      c.flops = attention_kernel_flops(s);
      return c;
    }
    if (c.kind != "linear" && c.kind != "attention" && !dims[0].empty()) {
      c.shape.elements = product(dims[0]);
      c.shape.dtype = dt.name;
      if (dt.bytes > 0 && streams_its_tensors(c.kind, lname)) {
        const double out_bytes = converted_element_bytes(n);
        if (out_bytes > 0)
          c.bytes = std::min(c.shape.elements * (dt.bytes + out_bytes), 1e30);
        else if (!converts_dtype(n))
          c.bytes = streamed_bytes(n, dims, types);
      }
      return c;
    }
  }
  return c;
}

// The kind of a CPU op that a CPU job's import takes as an activity of its own: "linear" for a
// GEMM op with its dims (gemm_shape), "attention" for an attention op (attention_schema); "" for
// the rest (views, allocations, copies and element-wise ops are not read from a CPU-only trace).
std::string cpu_compute_kind(const HostOp& op) {
  KernelShape s;
  if (gemm_shape(op.name(), op.dims(), s)) return "linear";
  if (attention_schema(op.name())) return "attention";
  return "";
}

// Kineto's category of an event as current PyTorch writes it: PyTorch 1.8-1.9's "Kernel",
// "Operator", "Runtime", "Memcpy" and "Memset" read as "kernel", "cpu_op", "cuda_runtime",
// "gpu_memcpy" and "gpu_memset" (their tids are strings, "stream 7" or "12345": int_field).
std::string current_category(const std::string& cat) {
  if (cat == "Kernel") return "kernel";
  if (cat == "Operator") return "cpu_op";
  if (cat == "Runtime") return "cuda_runtime";
  if (cat == "Memcpy") return "gpu_memcpy";
  if (cat == "Memset") return "gpu_memset";
  return cat;
}

// Whether a category is one of the host's that the import does not read (annotations, Python
// frames, flows, instants, overhead, Kineto's own spans): not a device's.
bool is_host_category(const std::string& c) {
  return c == "user_annotation" || c == "gpu_user_annotation" || c == "python_function" ||
         c == "Trace" || c == "fwdbwd" || c == "ac2g" || c == "cpu_instant_event" ||
         c == "overhead" || c == "Python" || c == "python" || c == "Memory" || c == "cuda_sync" ||
         c == "xpu_runtime" || c == "mtia_runtime" || c == "privateuse1_runtime";
}

// Whether an event's category is one that only a PyTorch profiler trace has.
bool has_kineto_category(const Json& e) {
  if (!e.is_object()) return false;
  auto cat = e.find("cat");
  if (cat == e.end() || !cat->is_string()) return false;
  const std::string c = current_category(cat->get<std::string>());
  return c == "kernel" || c == "gpu_memcpy" || c == "gpu_memset" || c == "cuda_runtime" ||
         c == "cpu_op";
}

// What a trace's top-level members other than traceEvents say of its maker: 1 Kineto, 0 not
// Kineto (parasol's own), -1 not said (its events decide).
int kineto_by_header(const Json& top) {
  auto other = top.find("otherData");
  if (other != top.end() && other->is_object() && other->value("generator", "") == "parasol")
    return 0;
  if (top.contains("schemaVersion") || top.contains("distributedInfo") ||
      top.contains("deviceProperties") || top.contains("computeProperties"))
    return 1;
  return -1;
}

// The import of one rank's trace, fed its top-level members and then its events one at a time
// (in file order), each converted to what the import reads of it and dropped: the DOM import
// (import_kineto) and the streaming one (import_kineto_stream) are this one code.
class KinetoImporter {
 public:
  KinetoImporter(std::string what, int default_rank) : what_(std::move(what)), rank_(default_rank) {
    imp_.trace.source = "measured";
  }

  void distributed_info(const Json& di) {
    if (di.is_null()) return;
    JsonReader r(di, what_ + ".distributedInfo");
    if (r.has("rank")) rank_ = static_cast<int>(r.integer("rank", 0, 1 << 24));
    if (r.has("world_size"))
      imp_.world_size = static_cast<int>(r.integer("world_size", 1, 1 << 24));
  }

  void device_properties(const Json& dp) {
    if (!dp.is_array()) return;
    std::vector<std::string>& devices = imp_.devices;
    for (const Json& d : dp)
      if (d.is_object() && d.contains("name") && d["name"].is_string() &&
          std::find(devices.begin(), devices.end(), d["name"].get<std::string>()) == devices.end())
        devices.push_back(d["name"].get<std::string>());
  }

  // traceEvents[i].
  void event(const Json& e, size_t i) {
    if (!e.is_object())
      throw Error(what_ + ".traceEvents[" + std::to_string(i) + "]", "must be an object");
    auto ph = e.find("ph");
    if (ph == e.end() || !ph->is_string() || ph->get_ref<const std::string&>() != "X") return;
    auto cat_it = e.find("cat");
    if (cat_it == e.end() || !cat_it->is_string()) return;
    const std::string cat = current_category(cat_it->get<std::string>());
    // PyTorch 1.8-1.9 wrote the ProfilerStep ranges as ops ("Operator": cpu_op).
    if ((cat == "user_annotation" || cat == "cpu_op") && e.contains("name") &&
        e["name"].is_string() && e["name"].get<std::string>().rfind("ProfilerStep#", 0) == 0) {
      if (step_names_.insert(e["name"].get<std::string>()).second)
        step_ranges_.push_back({number_field(e, what_, i, "ts", -kMaxMicroseconds),
                                number_field(e, what_, i, "ts", -kMaxMicroseconds) +
                                    number_field(e, what_, i, "dur", 0)});
    }
    const bool device = cat == "kernel" || cat == "gpu_memcpy" || cat == "gpu_memset";
    const bool host_op = cat == "cpu_op";
    const bool call = cat == "cuda_runtime" || cat == "cuda_driver";
    if (!device && !host_op && !call) {
      if (!is_host_category(cat) && unread_cats_.size() < 64) ++unread_cats_[cat];
      return;
    }
    auto name = e.find("name");
    if (name == e.end()) throw Error(at(what_, i, "name"), "missing");
    if (!name->is_string()) throw Error(at(what_, i, "name"), "must be a string");
    const double ts = number_field(e, what_, i, "ts", -kMaxMicroseconds);
    const double dur = number_field(e, what_, i, "dur", 0);
    const int64_t pid = int_field(e, what_, i, "pid");
    const int64_t tid = int_field(e, what_, i, "tid");
    if (host_op) {
      const std::string& n = name->get_ref<const std::string&>();
      ops_[{pid, tid}].push_back({ts, dur, host_ops_.size()});
      const bool comm = n == "record_param_comms" || collective_op_prefix(n) > 0;
      host_ops_.push_back({names_(n), dims_(input_dims(e)), types_(input_types(e)),
                           kept_args(e, comm, attention_schema(n) != nullptr)});
    } else if (call) {
      calls_[{pid, tid}].push_back({ts, dur, i});
      const double corr = arg_number(e, "correlation");
      if (std::fabs(corr) < 9e18) call_of_[static_cast<int64_t>(corr)] = {ts, dur, i};
    } else {
      const Activity::Cat c = cat == "kernel"       ? Activity::kKernel
                              : cat == "gpu_memcpy" ? Activity::kMemcpy
                                                    : Activity::kMemset;
      acts_.push_back({i, c, tid, name->get<std::string>(), ts, dur, arg_number(e, "correlation"),
                       arg_number(e, "bytes"),
                       cat == "kernel" ? kept_args(e, true, false) : Json()});
    }
  }

  ImportedTrace finish() {
    auto by_start = [](const HostEvent& a, const HostEvent& b) {
      return a.ts != b.ts ? a.ts < b.ts : a.dur > b.dur;
    };
    for (auto& [t, v] : ops_) std::sort(v.begin(), v.end(), by_start);
    for (auto& [t, v] : calls_) std::sort(v.begin(), v.end(), by_start);
    // A trace without device activities is a CPU job's when the profiler saw no GPU
    // (deviceProperties empty): its GEMM and attention ops are its activities.
    std::vector<std::vector<size_t>> cpu_stacks;  // per activity of a CPU job: its ops
    std::vector<std::string> cpu_kinds;
    std::vector<int64_t> cpu_threads;  // a CPU job's stream s is thread cpu_threads[s]
    if (acts_.empty() && !ops_.empty() && imp_.devices.empty())
      cpu_job_activities(cpu_stacks, cpu_kinds, cpu_threads);
    if (acts_.empty())
      throw Error(
          what_,
          ops_.empty()            ? "has no device activities (kernels, memcpys, memsets) and no "
                                    "CPU ops: not a PyTorch profiler trace of a GPU job"
          : imp_.devices.empty()  ? "is a CPU-only trace without GEMM or attention ops (aten::mm, "
                                    "addmm, bmm, linear, matmul, scaled_dot_product_attention ...) "
                                    "with their input shapes: nothing to set beside a plan (profile "
                                    "with record_shapes=True)"
          : !unread_cats_.empty() ? "has no CUDA or ROCm device activities (kernels, memcpys, "
                                    "memsets) that parasol reads; its device events are " +
                                        unread_device_events()
                                  : "is a CPU-only trace: it has " + std::to_string(ops_.size()) +
                                        " threads of CPU ops but no device activities (kernels, "
                                        "memcpys, memsets); profile with ProfilerActivity.CUDA");
    // The launch stacks of the calls that launched something; then the threads' ops and calls
    // are no longer needed.
    std::unordered_set<size_t> launching;
    for (const Activity& a : acts_)
      if (std::fabs(a.correlation) < 9e18)
        if (auto it = call_of_.find(static_cast<int64_t>(a.correlation)); it != call_of_.end())
          launching.insert(it->second.index);
    const auto stacks = launch_stacks(ops_, calls_, launching);
    ops_.clear();
    calls_.clear();
    ImportedTrace& imp = imp_;
    imp.trace.events.reserve(acts_.size());
    imp.shapes.reserve(acts_.size());
    std::vector<DeviceSpan> spans;
    spans.reserve(acts_.size());
    for (Activity& a : acts_) {
      TraceEvent t;
      t.rank = rank_;
      const int64_t tid = a.tid;
      if (tid < 0 || tid > std::numeric_limits<int>::max())
        throw Error(at(what_, a.index, "tid"), "must be a stream number >= 0");
      t.stream = static_cast<int>(tid);
      t.start_s = a.ts * 1e-6;
      t.dur_s = a.dur * 1e-6;
      KernelShape shape;
      const double corr = a.correlation;
      const HostEvent* launch = nullptr;
      if (std::fabs(corr) < 9e18) {
        auto it = call_of_.find(static_cast<int64_t>(corr));
        if (it != call_of_.end()) launch = &it->second;
      }
      if (a.cat == Activity::kKernel) {
        ++imp.kernels;
        const std::vector<size_t>* stack = nullptr;
        if (launch) {
          auto s = stacks.find(launch->index);
          if (s != stacks.end()) stack = &s->second;
        }
        const size_t n = imp.trace.events.size();
        if (!cpu_stacks.empty()) stack = &cpu_stacks[n];
        Classified c = classify(a, host_ops_, stack, cpu_kinds.empty() ? "" : cpu_kinds[n]);
        t.kind = c.kind.empty() ? "unclassified" : c.kind;
        t.bytes = c.bytes;
        t.flops = c.flops;
        t.phase = c.phase;
        t.group = c.group;
        shape = c.shape;
      } else {
        // Copies are "memcpy" whichever way they go: label_copies_by_plan makes them the plan's
        // offloads and prefetches when the plan has any.
        t.kind = a.cat == Activity::kMemset ? "memset" : "memcpy";
        if (a.bytes >= 0 && a.bytes <= 1e30) t.bytes = a.bytes;
      }
      t.name = std::move(a.name);  // classified: the activity's name is not read again
      spans.push_back({a.ts, a.ts + a.dur, launch ? launch->ts + launch->dur : -1});
      imp.trace.events.push_back(std::move(t));
      imp.shapes.push_back(std::move(shape));
    }
    finish_rank(imp, rank_, spans);
    for (TraceStream& st : imp.trace.streams)
      if (st.stream >= 0 && static_cast<size_t>(st.stream) < cpu_threads.size())
        st.name = "compute (cpu thread " + std::to_string(cpu_threads[st.stream]) + ")";
    imp.steps = std::max<int>(1, step_names_.size());
    if (!step_ranges_.empty()) imp.step_s[rank_] = profiler_step_seconds(step_ranges_, spans);
    return std::move(imp_);
  }

 private:
  // A CPU job's activities: on each thread (its stream, numbered in thread order), each GEMM or
  // attention op (cpu_compute_kind) that encloses no other one, as an activity named by the op,
  // with the ops that enclose it, itself last (`stacks`), and its kind. REQUIRES: ops_ sorted by
  // start, longest first.
  void cpu_job_activities(std::vector<std::vector<size_t>>& stacks, std::vector<std::string>& kinds,
                          std::vector<int64_t>& threads) {
    struct Found {
      const HostEvent* op;
      std::vector<size_t> stack;
      std::string kind;
      bool innermost = true;
    };
    for (const auto& [thread, os] : ops_) {
      std::vector<Found> found;
      std::vector<std::pair<const HostEvent*, long>> open;  // op, its entry in found (or -1)
      for (const HostEvent& o : os) {
        while (!open.empty() && open.back().first->ts + open.back().first->dur <= o.ts)
          open.pop_back();
        const std::string kind = cpu_compute_kind(host_ops_[o.index]);
        long entry = -1;
        if (!kind.empty()) {
          Found f{&o, {}, kind};
          for (const auto& [e, k] : open) {
            f.stack.push_back(e->index);
            if (k >= 0) found[static_cast<size_t>(k)].innermost = false;
          }
          f.stack.push_back(o.index);
          entry = static_cast<long>(found.size());
          found.push_back(std::move(f));
        }
        open.push_back({&o, entry});
      }
      const int64_t stream = static_cast<int64_t>(threads.size());
      bool any = false;
      for (Found& f : found) {
        if (!f.innermost) continue;
        any = true;
        acts_.push_back({0, Activity::kKernel, stream, host_ops_[f.op->index].name(), f.op->ts,
                         f.op->dur, std::nan(""), std::nan(""), Json()});
        stacks.push_back(std::move(f.stack));
        kinds.push_back(std::move(f.kind));
      }
      if (any) threads.push_back(thread.second);
    }
  }

  std::string what_;
  int rank_;
  ImportedTrace imp_;
  std::map<std::pair<int64_t, int64_t>, std::vector<HostEvent>> ops_, calls_;  // by (pid, tid)
  std::deque<HostOp> host_ops_;  // ops_'s HostEvent::index
  Interned<std::string> names_;  // of host_ops_
  Interned<Dims> dims_;
  Interned<Types> types_;
  std::unordered_map<int64_t, HostEvent> call_of_;  // correlation -> runtime call
  std::deque<Activity> acts_;
  std::set<std::string> step_names_;
  std::vector<std::pair<double, double>> step_ranges_;  // (start, end) us, one per ProfilerStep#N
  std::map<std::string, size_t> unread_cats_;  // events of categories not read (is_host_category)

  // The events of categories the import does not read, each with what it is: CUPTI's range
  // profiler (cat "cuda_profiler_range": each kernel replayed to read hardware counters, so its
  // time is not the step's), another accelerator's (MTIA's "mtia_ccp_events", ...).
  std::string unread_device_events() const {
    std::string out;
    for (const auto& [cat, n] : unread_cats_) {
      if (!out.empty()) out += ", ";
      out += "\"" + cat + "\" (" + std::to_string(n) + ")";
      if (cat == "cuda_profiler_range")
        out +=
            ": kernels replayed by CUPTI's range profiler to read hardware counters, their times "
            "not a step's (profile without experimental_config's profiler_metrics)";
      else if (cat.rfind("mtia", 0) == 0)
        out += ": an MTIA accelerator's, which parasol does not model";
    }
    return out;
  }
};

// Builds one JSON value from SAX events (nlohmann's own DOM parser does the same for the whole
// document): the streaming import builds each event, and each top-level member other than
// traceEvents, with it.
class ValueBuilder {
 public:
  bool active() const { return active_; }
  bool done() const { return active_ && stack_.empty() && has_value_; }
  void begin() {
    active_ = true;
    has_value_ = false;
    root_ = Json();
  }
  Json take() {
    active_ = false;
    return std::move(root_);
  }
  template <typename V>
  void value(V&& v) {
    put(Json(std::forward<V>(v)));
  }
  void start(Json container) { stack_.push_back(put(std::move(container))); }
  void key(std::string& k) { key_ = std::move(k); }
  void end() { stack_.pop_back(); }

 private:
  Json* put(Json v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      has_value_ = true;
      return &root_;
    }
    Json& parent = *stack_.back();
    if (parent.is_array()) {
      parent.push_back(std::move(v));
      return &parent.back();
    }
    Json& slot = parent[key_];
    slot = std::move(v);
    return &slot;
  }
  bool active_ = false, has_value_ = false;
  Json root_;
  std::vector<Json*> stack_;
  std::string key_;
};

// nlohmann's SAX interface over a trace: the traceEvents array (or a top-level array of events)
// is fed to the importer an event at a time; every other top-level member is kept whole (they are
// small: schemaVersion, deviceProperties, distributedInfo, otherData ...).
class KinetoSax {
 public:
  KinetoSax(KinetoImporter& imp, std::string what, bool feed_top_array)
      : imp_(imp), what_(std::move(what)), feed_top_array_(feed_top_array) {}

  bool null() { return scalar(nullptr); }
  bool boolean(bool v) { return scalar(v); }
  bool number_integer(Json::number_integer_t v) { return scalar(v); }
  bool number_unsigned(Json::number_unsigned_t v) { return scalar(v); }
  bool number_float(Json::number_float_t v, const std::string&) { return scalar(v); }
  bool string(std::string& v) { return scalar(std::move(v)); }
  bool binary(Json::binary_t& v) { return scalar(std::move(v)); }
  bool start_object(std::size_t) {
    if (!b_.active() && depth_ == 0) {
      top_ = Top::kObject;
      depth_ = 1;
      return true;
    }
    begin_value();
    b_.start(Json::object());
    return true;
  }
  bool key(std::string& k) {
    if (b_.active()) {
      b_.key(k);
    } else {
      key_ = std::move(k);
    }
    return true;
  }
  bool end_object() {
    if (!b_.active()) {  // the top-level object
      depth_ = 0;
      return true;
    }
    b_.end();
    finish_value();
    return true;
  }
  bool start_array(std::size_t) {
    if (!b_.active() &&
        ((depth_ == 0) || (top_ == Top::kObject && depth_ == 1 && key_ == "traceEvents"))) {
      if (depth_ == 0) top_ = Top::kArray;
      in_events_ = true;
      saw_events_ = true;
      ++depth_;
      return true;
    }
    begin_value();
    b_.start(Json::array());
    return true;
  }
  bool end_array() {
    if (!b_.active()) {  // the events array
      in_events_ = false;
      --depth_;
      return true;
    }
    b_.end();
    finish_value();
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& ex) {
    // As parse_json words it.
    std::string msg = ex.what();
    auto pos = msg.find("parse error");
    if (pos == std::string::npos) pos = msg.find("number overflow");
    throw Error(what_,
                "malformed JSON (" + (pos == std::string::npos ? msg : msg.substr(pos)) + ")");
  }

  enum class Top { kNone, kObject, kArray, kScalar };
  Top top() const { return top_; }
  const Json& header() const { return header_; }  // top-level members but traceEvents
  bool saw_events() const { return saw_events_; }
  bool kineto_category() const { return kineto_category_; }
  Json scalar_top;  // the document, when it is a scalar

 private:
  template <typename V>
  bool scalar(V&& v) {
    if (!b_.active() && depth_ == 0) {
      top_ = Top::kScalar;
      scalar_top = Json(std::forward<V>(v));
      return true;
    }
    begin_value();
    b_.value(std::forward<V>(v));
    finish_value();
    return true;
  }
  void begin_value() {
    if (!b_.active()) b_.begin();
  }
  void finish_value() {
    if (!b_.done()) return;
    Json v = b_.take();
    if (in_events_) {
      // A top-level array of events is no Kineto trace for a caller that requires one: its
      // events are not read (import_framework_traces refuses it before reading them).
      if (top_ == Top::kArray && !feed_top_array_) return;
      kineto_category_ = kineto_category_ || has_kineto_category(v);
      imp_.event(v, index_++);
      return;
    }
    // A top-level member: distributedInfo and deviceProperties are read as they come (before the
    // events in Kineto's files), as the DOM import reads them before its events.
    if (key_ == "distributedInfo") imp_.distributed_info(v);
    if (key_ == "deviceProperties" || key_ == "computeProperties") imp_.device_properties(v);
    header_[key_] = std::move(v);
  }

  KinetoImporter& imp_;
  std::string what_;
  ValueBuilder b_;
  Top top_ = Top::kNone;
  int depth_ = 0;  // 1 inside the top-level object or events array, 2 in its events array
  bool feed_top_array_;
  bool in_events_ = false, saw_events_ = false, kineto_category_ = false;
  std::string key_;  // the current top-level member's
  size_t index_ = 0;
  Json header_ = Json::object();
};

}  // namespace

bool looks_like_kineto(const Json& j) {
  if (!j.is_object()) return false;
  const int by_header = kineto_by_header(j);
  if (by_header >= 0) return by_header == 1;
  auto ev = j.find("traceEvents");
  if (ev == j.end() || !ev->is_array()) return false;
  for (const Json& e : *ev)
    if (has_kineto_category(e)) return true;
  return false;
}

ImportedTrace import_kineto(const Json& j, const std::string& what, int default_rank) {
  KinetoImporter k(what, default_rank);
  const Json* events = trace_events(j, what);
  if (!events) throw Error(what, "must be a JSON object with traceEvents, or an array of events");
  if (j.is_object()) {
    if (auto di = j.find("distributedInfo"); di != j.end()) k.distributed_info(*di);
    for (const char* key : {"deviceProperties", "computeProperties"})
      if (auto dp = j.find(key); dp != j.end()) k.device_properties(*dp);
  }
  for (size_t i = 0; i < events->size(); ++i) k.event((*events)[i], i);
  return k.finish();
}

ImportedTrace import_kineto_stream(std::istream& in, const std::string& what, int default_rank,
                                   bool require_kineto, bool* written_by_parasol) {
  KinetoImporter k(what, default_rank);
  KinetoSax sax(k, what, !require_kineto);
  Json::sax_parse(in, &sax, nlohmann::json::input_format_t::json, true);
  using Top = KinetoSax::Top;
  const Json& header = sax.header();
  if (written_by_parasol) *written_by_parasol = false;
  if (require_kineto) {
    const int by_header = sax.top() == Top::kObject ? kineto_by_header(header) : 0;
    if (written_by_parasol && sax.top() == Top::kObject && by_header == 0) {
      *written_by_parasol = true;
      return ImportedTrace{};
    }
    const bool kineto = by_header >= 0 ? by_header == 1 : sax.saw_events() && sax.kineto_category();
    if (!kineto)
      throw Error(what,
                  "not a PyTorch profiler trace (no schemaVersion, distributedInfo or device "
                  "activity) nor one parasol wrote (otherData.generator \"parasol\")");
  }
  if (sax.top() == Top::kObject && !sax.saw_events()) {
    if (header.contains("traceEvents")) throw Error(what + ".traceEvents", "must be an array");
    throw Error(what + ".traceEvents", "missing");
  }
  if (sax.top() != Top::kObject && sax.top() != Top::kArray)
    throw Error(what, "must be a JSON object with traceEvents, or an array of events");
  return k.finish();
}

ImportedTrace import_kineto_file(const std::string& path, int default_rank, bool require_kineto,
                                 bool* written_by_parasol) {
  TextFileBuf buf(path);
  std::istream in(&buf);
  return import_kineto_stream(in, path, default_rank, require_kineto, written_by_parasol);
}

ImportedTrace import_kineto_files(const std::vector<std::string>& paths) {
  if (paths.empty()) throw Error("traces", "no trace file given");
  std::vector<ImportedTrace> parts;
  for (size_t f = 0; f < paths.size(); ++f)
    parts.push_back(import_kineto_file(paths[f], static_cast<int>(f), false));
  return merge_imported(std::move(parts), paths);
}

}  // namespace parasol::traces
