#!/usr/bin/env bash
# tools/gpu-check.sh: checks parasol's GPU path on a machine with an NVIDIA GPU and the CUDA
# toolkit (issue 6). It
#   (a) configures (-DPARASOL_CUDA=ON, Release) and builds the GPU tests and benchmark into build-gpu/
#       (-j$(nproc)); on a machine without Debian packages or network, tools/gpu-deps.sh carries them,
#   (b) runs the GPU tests (`ctest -L gpu --output-on-failure`); a GPU test that reports
#       "skipped" here is a failure (it did not find the GPU). Among them: the typed bf16 attention
#       (cuDNN's SDPA on the bf16 buffers in place, and parasol's kernel on widened copies, ring
#       steps included) against the CPU backend's (cuda_kernels_test's CudaLowpAttention), MoE's
#       dispatch and combine on bf16 rows against the CPU's (CudaLowp.MoeDispatchAndCombineOnBf16*),
#       the device-routed MoE entries (CudaLowp.DeviceRoutedExpertEntriesEqualTheCpus), a bf16
#       plan that widens no attention operand and falls back for no attention call, and the bf16
#       GELU-epilogue GPT and device-routed MoE plans against the CPU's with no host read of the
#       MoE counts (cuda_trainer_test's CudaTrainer.Bf16GeluEpilogueAndDeviceRoutedMoe*),
#   (c) runs the GPU benchmark build-gpu/tests/bench/gpu_train_bench when it was built (Google
#       Benchmark JSON; its counters tokens_per_s, TFLOPs and MFU are read), with a note when it
#       was not,
#   (c2) runs build-gpu/tests/bench/gpu_kernels_bench: the bf16-storage kernels alone, each in
#       GB/s or TFLOP/s against the device's HBM bandwidth or dense bf16 peak,
#   (c3) closes the loop on this GPU: `parasol run --backend cuda --trace` of gpt2-124m (bf16,
#       tiled loss, flash attention, one GPU), its prediction with the device's profile
#       (`parasol simulate`), `parasol calibrate` of a profile on the measured trace and the
#       prediction again with it, each against the measured step (`parasol compare`): the
#       calibrated re-prediction is held to 10 % (the issue's bar; a failure above),
#   (c4) the capture path: `parasol run --backend cuda` of a tiny bf16 plan with whole-step CUDA
#       graphs (cuda_graphs full_iteration: one warm-up, one capture, then replays, no host read
#       in a replayed step) against the same plan run op by op (each loss within 1 %), and the
#       two median step times,
#   (d) prints one summary table: each step, each GPU test, each benchmark's tokens/s, TFLOP/s
#       and MFU against issue 49's bars (the 1B Llama >= 35 %, GPT-2 124M >= 25 %; README.md,
#       "GPU check", documents the format), then where one traced step's time
#       goes by op kind (the benchmark's "op-time" lines), then the kernel rates, then the loop's
#       measured, predicted and calibrated step times.
# Everything runs under one deadline (default 480 s: the 8 minutes the issue allows), enforced
# with `timeout`; nothing needs the network. Logs and the benchmark JSON go to build-gpu/gpu-check/.
# Before building, a preflight names everything the machine lacks: nvcc, the driver (or a driver
# too old for the toolkit's CUDA major version, or a driver/library mismatch), cuBLASLt, NCCL
# (CUDA 13 toolkits do not ship it), and the Debian packages of scripts/packages.sh (GoogleTest,
# Google Benchmark, Open MPI, ...). A failed build never benchmarks a binary of an earlier build.
# Exit status: 0 when everything passed; 1 when the build, a test or the benchmark failed or the
# deadline was reached; 2 for a usage error or a machine the preflight found not ready.
#
# Usage: tools/gpu-check.sh [--build-dir DIR] [--jobs N] [--deadline S] [--no-bench]
#          [-- BENCH_ARGS...]   (extra arguments for gpu_train_bench)
set -uo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
build="$root/build-gpu"
jobs="$(nproc 2>/dev/null || echo 2)"
deadline=480
bench=1
bench_args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) build="$(realpath -m "$2")"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --deadline) deadline="$2"; shift 2 ;;
    --no-bench) bench=0; shift ;;
    --) shift; bench_args=("$@"); break ;;
    -h|--help) sed -n '2,40p' "$0"; exit 0 ;;
    *) echo "gpu-check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$jobs" =~ ^[0-9]+$ && "$deadline" =~ ^[0-9]+$ ]] || { echo "gpu-check: --jobs and --deadline take integers" >&2; exit 2; }

start=$SECONDS
logs="$build/gpu-check"
rows=()       # "name|status|detail" lines of the summary table
failed=0
built=0       # 1 once this run's build succeeded

left() { echo $((deadline - (SECONDS - start))); }
row() { rows+=("$1|$2|$3"); }
# run_step NAME LOG CMD...: runs CMD under the time left, logging to LOG; records a row.
run_step() {
  local name="$1" log="$2"; shift 2
  local budget; budget="$(left)"
  if (( budget <= 0 )); then row "$name" "TIMEOUT" "deadline of ${deadline} s reached before it"; failed=1; return 1; fi
  local t0=$SECONDS rc=0
  timeout --kill-after=10 "$budget" "$@" >"$log" 2>&1 || rc=$?
  local dt=$((SECONDS - t0))
  if (( rc == 124 || rc == 137 )); then
    row "$name" "TIMEOUT" "${dt} s, deadline ${deadline} s (log: ${log#"$root"/})"; failed=1; return 1
  elif (( rc != 0 )); then
    row "$name" "FAILED" "${dt} s, exit ${rc} (log: ${log#"$root"/})"; failed=1; return 1
  fi
  row "$name" "ok" "${dt} s"
  return 0
}

# ---- Preflight: what the build and the run need, each missing piece named, before building -----
# Exit 2 (nothing built) when something is missing: the machine is not ready, not the code.
problems=()
warnings=()
nvcc="${CUDACXX:-}"
[[ -z "$nvcc" && -x /usr/local/cuda/bin/nvcc ]] && nvcc=/usr/local/cuda/bin/nvcc
[[ -z "$nvcc" ]] && nvcc="$(command -v nvcc || true)"
cuda=""
if [[ -z "$nvcc" ]]; then
  problems+=("no nvcc: the CUDA toolkit is neither in /usr/local/cuda nor on PATH (set CUDACXX)")
else
  cuda="$("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p' | head -n1)"
fi
gpu=""
if ! command -v nvidia-smi >/dev/null; then
  problems+=("no nvidia-smi: the NVIDIA driver is not installed")
else
  smi_rc=0
  smi_out="$(nvidia-smi 2>&1)" || smi_rc=$?
  if (( smi_rc != 0 )); then
    # e.g. "Failed to initialize NVML: Driver/library version mismatch", or a driver not loaded.
    problems+=("nvidia-smi fails (exit ${smi_rc}): $(head -n1 <<<"$smi_out")")
  else
    gpu="$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n1)"
    [[ -z "$gpu" ]] && problems+=("nvidia-smi lists no GPU")
    driver_cuda="$(grep -oE 'CUDA Version: *[0-9]+\.[0-9]+' <<<"$smi_out" | grep -oE '[0-9]+\.[0-9]+$' | head -n1)"
    if [[ -n "$cuda" && -n "$driver_cuda" ]]; then
      t_major="${cuda%%.*}" d_major="${driver_cuda%%.*}"
      t_minor="$(cut -d. -f2 <<<"$cuda")" d_minor="$(cut -d. -f2 <<<"$driver_cuda")"
      if (( t_major > d_major )); then
        problems+=("the driver (${gpu#*, }) supports CUDA up to ${driver_cuda}; the toolkit is CUDA ${cuda}: a new major version needs a newer driver (or use a CUDA ${d_major}.x toolkit)")
      elif (( t_major == d_major && t_minor > d_minor )); then
        warnings+=("toolkit CUDA ${cuda} on a driver for CUDA ${driver_cuda}: runs by CUDA's minor-version compatibility (sm_90 code is compiled ahead of time)")
      fi
    fi
  fi
fi
if [[ -n "$nvcc" ]]; then
  cuda_root="$(dirname "$(dirname "$(readlink -f "$nvcc")")")"
  libdirs=("$cuda_root/lib64" "$cuda_root/targets/x86_64-linux/lib" /usr/lib/x86_64-linux-gnu /usr/lib64)
  incdirs=("$cuda_root/include" "$cuda_root/targets/x86_64-linux/include" /usr/include)
  # NCCL_ROOT (environment): an NCCL outside the toolkit, e.g. the nvidia/nccl folder of the
  # nvidia-nccl-cu13 wheel; CMakeLists.txt looks there too.
  if [[ -n "${NCCL_ROOT:-}" ]]; then libdirs+=("$NCCL_ROOT/lib"); incdirs+=("$NCCL_ROOT/include"); fi
  has_lib() { local d; for d in "${libdirs[@]}"; do compgen -G "$d/lib$1.so*" >/dev/null && return 0; done; return 1; }
  has_header() { local d; for d in "${incdirs[@]}"; do [[ -f "$d/$1" ]] && return 0; done; return 1; }
  has_lib cublasLt || problems+=("no cuBLASLt (libcublasLt.so) beside the toolkit in ${cuda_root}")
  # cuDNN's fused attention (runtime/cuda/cudnn_attention.h): cuDNN 9 and the cuDNN frontend's
  # headers (the nvidia-cudnn-frontend wheel's include/, CUDNN_FRONTEND_INCLUDE, or the folder
  # tools/gpu-deps.sh carries). Without them the build runs attention on parasol's kernels and the
  # cuDNN kernel tests fail: named here, not refused.
  has_lib cudnn || warnings+=("no cuDNN (libcudnn.so) beside the toolkit in ${cuda_root}: attention runs on parasol's kernels")
  fe_dirs=("${CUDNN_FRONTEND_INCLUDE:-}" "$root/.gpudeps/cudnn_frontend/include")
  if command -v python3 >/dev/null; then
    fe_dirs+=("$(python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" 2>/dev/null)/include")
  fi
  fe_dir=""
  for d in "${fe_dirs[@]}"; do [[ -z "$fe_dir" && -n "$d" && -f "$d/cudnn_frontend.h" ]] && fe_dir="$d"; done
  [[ -n "$fe_dir" ]] || warnings+=("no cuDNN frontend headers (pip install nvidia-cudnn-frontend, CUDNN_FRONTEND_INCLUDE, or tools/gpu-deps.sh's .gpudeps/cudnn_frontend): attention runs on parasol's kernels")
  if ! has_lib nccl || ! has_header nccl.h; then
    problems+=("no NCCL (nccl.h and libnccl.so in ${cuda_root}, the system or \$NCCL_ROOT): CUDA 13 toolkits do not ship it; install libnccl2 and libnccl-dev from NVIDIA's CUDA repository, unpack NCCL into ${cuda_root}, or point NCCL_ROOT at an NCCL (the nvidia-nccl-cu13 wheel's nvidia/nccl folder)")
  fi
fi
# Packages: by dpkg where the machine is Debian and its packages were installed; by the tools the
# build calls where it is not, or where tools/gpu-deps.sh unpacked them (it lists what it did in
# /var/lib/parasol/gpu-deps.list; CMake's configure names any header or library still missing).
if command -v dpkg-query >/dev/null && [[ ! -s /var/lib/parasol/gpu-deps.list ]]; then
  # shellcheck source=../scripts/packages.sh
  source "$root/scripts/packages.sh"
  missing=()
  for p in "${parasol_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  (( ${#missing[@]} )) && problems+=("missing Debian packages: ${missing[*]} (scripts/setup.sh installs them; it needs the network)")
else
  for tool in cmake g++ mpicxx mpirun; do
    command -v "$tool" >/dev/null || problems+=("no ${tool} on PATH")
  done
fi
# The notes first (also on a machine refused below: everything it lacks is named at once).
for w in "${warnings[@]}"; do echo "gpu-check: note: $w" >&2; done
if (( ${#problems[@]} )); then
  for p in "${problems[@]}"; do echo "gpu-check: preflight: $p" >&2; done
  echo "gpu-check: the machine is not ready; nothing was built (exit 2)" >&2
  exit 2
fi
mkdir -p "$logs" || exit 2

# ---- (a) configure and build ------------------------------------------------------------------
# Only what the GPU tests and the benchmark need (scripts/build.sh builds the rest); Ninja where
# the machine has no make (a fresh build directory only: CMake keeps a directory's generator).
generator=()
if ! command -v make >/dev/null && command -v ninja >/dev/null && [[ ! -f "$build/CMakeCache.txt" ]]; then
  generator=(-G Ninja)
fi
gpu_targets=(cuda_kernels_test cuda_trainer_test nccl_communicator_test gpu_train_bench
             gpu_kernels_bench parasol)
if run_step configure "$logs/configure.log" \
     cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DPARASOL_CUDA=ON \
       -DCMAKE_CUDA_COMPILER="$nvcc" ${fe_dir:+"-DPARASOL_CUDNN_FRONTEND_INCLUDE=$fe_dir"}; then
  run_step build "$logs/build.log" cmake --build "$build" -j"$jobs" --target "${gpu_targets[@]}" && built=1
fi

# ---- (b) GPU tests ----------------------------------------------------------------------------
ntests=0
if (( failed == 0 )); then
  run_step "ctest -L gpu" "$logs/ctest.log" \
    ctest --test-dir "$build" -L gpu --output-on-failure --no-tests=error
  # One row per test from ctest's progress lines: "1/3 Test #54: name ....   Passed    2.46 sec".
  while IFS= read -r line; do
    name="$(sed -E 's/^ *[0-9]+\/[0-9]+ +Test +#[0-9]+: ([^ ]+) .*/\1/' <<<"$line")"
    status="$(sed -E 's/.*[ *](Passed|Failed|Skipped|Timeout|Not Run|Exception|SEGFAULT|Child aborted)[^0-9]*([0-9.]+ sec)?.*/\1/' <<<"$line")"
    secs="$(grep -oE '[0-9.]+ sec' <<<"$line" | tail -n1)"
    ntests=$((ntests + 1))
    case "$status" in
      Passed) row "  test $name" "passed" "$secs" ;;
      Skipped) row "  test $name" "SKIPPED" "$secs: no GPU found by the test (a failure here)"; failed=1 ;;
      *) row "  test $name" "FAILED" "$status $secs"; failed=1 ;;
    esac
  done < <(grep -E '^ *[0-9]+/[0-9]+ +Test +#[0-9]+: ' "$logs/ctest.log" 2>/dev/null)
  if (( ntests == 0 )); then row "  tests" "FAILED" "no test labelled gpu ran"; failed=1; fi
fi

# ---- (c) benchmark ----------------------------------------------------------------------------
bench_bin="$build/tests/bench/gpu_train_bench"
bench_json="$logs/gpu_train_bench.json"
bench_rows=()
if (( bench == 0 )); then
  row "gpu_train_bench" "skipped" "--no-bench"
elif (( built == 0 )); then
  row "gpu_train_bench" "not run" "the build failed: a binary left from an earlier build is not measured"
elif [[ ! -x "$bench_bin" ]]; then
  row "gpu_train_bench" "absent" "not built (${bench_bin#"$root"/}): no benchmark figures"
else
  rm -f "$bench_json"
  if run_step gpu_train_bench "$logs/gpu_train_bench.log" \
       "$bench_bin" --benchmark_out="$bench_json" --benchmark_out_format=json "${bench_args[@]}"; then
    # One "name|tokens/s|TFLOP/s|MFU|attention fused/fallbacks|fp32 GEMMs" line per benchmark;
    # aliases of the counter names accepted. The last two: the CUDA backend's library paths
    # (cuda_backend.h's library_counts(): attention calls through cuDNN's fused SDPA / through
    # parasol's kernel, GEMM calls cuBLASLt had no bf16 algorithm for).
    parse_py='
import json, sys
d = json.load(open(sys.argv[1]))
def pick(b, *keys):
    for k in keys:
        if k in b: return float(b[k])
    return None
for b in d.get("benchmarks", []):
    if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median": continue
    tok = pick(b, "tokens_per_s", "tokens/s", "tokens_per_second", "tok_s")
    tf = pick(b, "TFLOPs", "TFLOP/s", "tflops", "TFLOPS", "tflop_per_s")
    mfu = pick(b, "MFU", "mfu")
    if mfu is not None and mfu > 1.5: mfu /= 100  # given in percent
    fused, fb = pick(b, "attention_fused"), pick(b, "attention_fallbacks")
    g32 = pick(b, "gemm_fp32_fallbacks")
    f = lambda x, s: "-" if x is None else s.format(x)
    attn = "-" if fused is None or fb is None else "{:.0f}/{:.0f}".format(fused, fb)
    # The MFU bars of issue 49: the 1B Llama >= 35 %, GPT-2 124M (bf16) >= 25 %.
    name = b.get("name", "?")
    bar = 0.35 if "Llama_1b" in name else 0.25 if name.endswith("Gpt2_124m") else None
    met = "-" if bar is None or mfu is None else \
        "{:.0f}% {}".format(100 * bar, "met" if mfu >= bar else "BELOW")
    print("|".join([name, f(tok, "{:.0f}"), f(tf, "{:.1f}"),
                    f(None if mfu is None else 100 * mfu, "{:.1f}%"), attn, f(g32, "{:.0f}"),
                    met]))
'
    parsed=""
    if command -v python3 >/dev/null; then
      parsed="$(python3 -c "$parse_py" "$bench_json" 2>>"$logs/gpu_train_bench.log")" || parsed=""
    elif command -v jq >/dev/null; then
      parsed="$(jq -r '.benchmarks[] | [.name, ((.tokens_per_s // null)|tostring),
                 ((.TFLOPs // .tflops // null)|tostring), ((.MFU // .mfu // null)|tostring),
                 (((.attention_fused // null)|tostring) + "/" + ((.attention_fallbacks // null)|tostring)),
                 ((.gemm_fp32_fallbacks // null)|tostring), "-"] | join("|")' \
                 "$bench_json" 2>>"$logs/gpu_train_bench.log")" || parsed=""
    fi
    if [[ -z "$parsed" ]]; then
      row "  benchmarks" "FAILED" "no benchmark read from ${bench_json#"$root"/} (python3 or jq needed)"
      failed=1
    else
      mapfile -t bench_rows <<<"$parsed"
    fi
  fi
fi

# ---- (c2) kernel rates: gpu_kernels_bench's bf16-storage kernels against the device's peaks
# ("kernel-rate NAME VALUE UNIT PERCENT" lines, printed under the table).
kbench_bin="$build/tests/bench/gpu_kernels_bench"
kbench_log="$logs/gpu_kernels_bench.log"
rm -f "$kbench_log"
if (( bench == 1 && built == 1 )) && [[ -x "$kbench_bin" ]]; then
  run_step gpu_kernels_bench "$kbench_log" "$kbench_bin"
fi

# ---- (c3) the loop: run with a trace, predict, calibrate on the trace, predict again ------------
pbin="$build/tools/parasol"
loop_rows=()
loop_bound=10  # percent: the issue's bar for the calibrated re-prediction
step_field() {  # step_field COMPARE_JSON KEY: a number of compare --json's "step" object
  python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["step"][sys.argv[2]])' "$1" "$2" \
    2>/dev/null
}
if (( bench == 1 && built == 1 )) && [[ -x "$pbin" ]] && command -v python3 >/dev/null; then
  case "$gpu" in
    *H200*) cluster=h200-1 ;;
    *H100*) cluster=dgx-h100 ;;
    *A100*) cluster=dgx-a100-80g ;;
    *) cluster="" ;;
  esac
  if [[ -z "$cluster" ]]; then
    row "loop (run, calibrate)" "skipped" "no cluster preset for ${gpu%%,*}"
  else
    spec=(--model gpt2-124m --cluster "$cluster" --gpus 1 --precision bf16 --mbs 16 --gbs 16
          --flash-attention true --tiled-loss true)
    run_step "loop: simulate" "$logs/loop-simulate.log" \
      "$pbin" simulate "${spec[@]}" --trace "$logs/loop.predicted.json" &&
    run_step "loop: parasol run --trace" "$logs/loop-run.log" \
      mpirun --allow-run-as-root -np 1 "$pbin" run "${spec[@]}" --backend cuda --steps 8 \
        --trace-steps 3 --trace "$logs/loop.measured.json" &&
    run_step "loop: calibrate" "$logs/loop-calibrate.log" \
      "$pbin" calibrate "$logs/loop.measured.json" -o "$logs/loop.profile.json" &&
    run_step "loop: simulate (calibrated)" "$logs/loop-simulate-cal.log" \
      "$pbin" simulate "${spec[@]}" --profile "$logs/loop.profile.json" \
        --trace "$logs/loop.calibrated.json" &&
    "$pbin" compare "$logs/loop.predicted.json" "$logs/loop.measured.json" --json \
      >"$logs/loop-compare.json" 2>>"$logs/loop-calibrate.log" &&
    "$pbin" compare "$logs/loop.calibrated.json" "$logs/loop.measured.json" --json \
      >"$logs/loop-compare-cal.json" 2>>"$logs/loop-calibrate.log"
    m="$(step_field "$logs/loop-compare.json" measured_s)"
    p0="$(step_field "$logs/loop-compare.json" predicted_s)"
    p1="$(step_field "$logs/loop-compare-cal.json" predicted_s)"
    if [[ -n "$m" && -n "$p0" && -n "$p1" ]]; then
      loop_rows+=("$(awk -v m="$m" -v a="$p0" -v b="$p1" 'BEGIN {
        printf "%.2f|%.2f|%+.1f%%|%.2f|%+.1f%%", 1e3 * m, 1e3 * a, 100 * (a - m) / m, 1e3 * b,
          100 * (b - m) / m }')")
      if ! awk -v m="$m" -v b="$p1" -v k="$loop_bound" 'BEGIN { d = (b - m) / m; exit !((d < 0 ? -d : d) * 100 <= k) }'; then
        row "loop: calibrated re-prediction" "FAILED" "beyond ${loop_bound} % of the measured step"
        failed=1
      else
        row "loop: calibrated re-prediction" "ok" "within ${loop_bound} % of the measured step"
      fi
    else
      row "loop: compare" "FAILED" "no step times read (logs: ${logs#"$root"/}/loop-*)"
      failed=1
    fi
  fi
fi

# ---- (c4) the capture path: `parasol run --backend cuda` of a whole-step graph plan (tiny Llama,
# bf16, plan cuda_graphs full_iteration, no NaN check: its host sync would keep the step out of a
# graph) against the same plan run op by op. Held to: one warm-up, one capture, then only replays,
# no device-to-host copy while a replayed step's ops run, and each step's loss within 1 % of the
# eager run's (neither run is bitwise reproducible: the embedding gradient's atomic scatter-add
# in bf16, whose unit roundoff is 0.4 %, varies run to run).
graph_rows=()
if (( bench == 1 && built == 1 )) && [[ -x "$pbin" ]] && command -v python3 >/dev/null; then
  case "$gpu" in
    *H200*) gcluster=h200-1 ;;
    *H100*) gcluster=dgx-h100 ;;
    *A100*) gcluster=dgx-a100-80g ;;
    *) gcluster="" ;;
  esac
  if [[ -z "$gcluster" ]]; then
    row "capture path (graphs)" "skipped" "no cluster preset for ${gpu%%,*}"
  else
    gspec=(--model tiny --cluster "$gcluster" --gpus 1 --precision bf16 --mbs 4 --gbs 8
           --flash-attention true --tiled-loss true --nan-check false --backend cuda --steps 8 --json)
    if run_step "capture path: parasol run (graphs)" "$logs/graph-run.log" \
         mpirun --allow-run-as-root -np 1 "$pbin" run "${gspec[@]}" --cuda-graphs full_iteration &&
       run_step "capture path: parasol run (eager)" "$logs/graph-eager.log" \
         mpirun --allow-run-as-root -np 1 "$pbin" run "${gspec[@]}" --cuda-graphs none; then
      graph_py='
import json, statistics, sys
def steps(path):
    text = open(path).read()  # the JSON (rank 0 stdout) among the other lines of the log
    at = 0 if text.startswith("{") else text.index("\n{\n") + 1
    return json.JSONDecoder().raw_decode(text[at:])[0]["steps"]
g, e = steps(sys.argv[1]), steps(sys.argv[2])
acts = [s.get("graph", "?") for s in g]
problems = []
if acts.count("capture") != 1: problems.append("captures: %d" % acts.count("capture"))
first = acts.index("capture") + 1 if "capture" in acts else len(acts)
if any(a != "replay" for a in acts[first:]) or first == len(acts):
    problems.append("after the capture: " + ",".join(acts[first:]))
reads = sum(s.get("host_reads", 0) for s in g[first:])
if reads: problems.append("%d host reads in replayed steps" % reads)
worst = max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(g, e))
if worst > 0.01: problems.append("loss off the eager run by %.2f %%" % (100 * worst))
rep = statistics.median(s["seconds"] for s in g[first:]) if first < len(g) else float("nan")
eag = statistics.median(s["seconds"] for s in e[first:])
reason = next((s["graph_reason"] for s in g if "graph_reason" in s), "")
print("%s|%s|%.3f|%.3f|%.3f|%s" % ("FAILED" if problems else "ok", ",".join(acts), 1e3 * rep,
                                   1e3 * eag, 100 * worst, "; ".join(problems) or reason))
'
      gout="$(python3 -c "$graph_py" "$logs/graph-run.log" "$logs/graph-eager.log" 2>>"$logs/graph-run.log")"
      if [[ -z "$gout" ]]; then
        row "capture path: steps" "FAILED" "no steps read (logs: ${logs#"$root"/}/graph-*.log)"
        failed=1
      else
        IFS='|' read -r gstatus gacts grep_ms geag_ms gworst gwhy <<<"$gout"
        row "capture path: warm-up, capture, replays" "$gstatus" \
          "${gacts}; loss within ${gworst} % of eager${gwhy:+; $gwhy}"
        [[ "$gstatus" == ok ]] || failed=1
        graph_rows+=("${grep_ms}|${geag_ms}")
      fi
    fi
  fi
fi

# ---- (d) summary ------------------------------------------------------------------------------
echo
echo "== parasol gpu-check: ${gpu} | CUDA ${cuda} | $(( SECONDS - start )) s of ${deadline} s =="
printf '%-44s %-8s %s\n' "step" "status" "detail"
for r in "${rows[@]}"; do
  IFS='|' read -r a b c <<<"$r"
  printf '%-44s %-8s %s\n' "$a" "$b" "$c"
done
if (( ${#bench_rows[@]} > 0 )); then
  echo
  printf '%-44s %12s %9s %7s %16s %9s %12s\n' "benchmark" "tokens/s" "TFLOP/s" "MFU" \
    "attn cuDNN/own" "fp32 GEMM" "MFU bar"
  for r in "${bench_rows[@]}"; do
    IFS='|' read -r a b c d e f g <<<"$r"
    printf '%-44s %12s %9s %7s %16s %9s %12s\n' "$a" "$b" "$c" "$d" "${e:--}" "${f:--}" "${g:--}"
  done
fi
# Where one traced step's time goes (gpu_train_bench's "op-time" lines): the 8 largest op kinds
# per model and the wall time no op covers (launches, syncs, the host).
bench_log="$logs/gpu_train_bench.log"
if (( built )) && [[ -f "$bench_log" ]] && grep -q '^op-time ' "$bench_log"; then
  echo
  printf '%-12s %-24s %10s %7s %9s\n' "model" "op kind (traced step)" "ms" "wall" "TFLOP/s"
  awk '/^op-time / { if ($3 == "(no-op)" || n[$2]++ < 8) print }' "$bench_log" |
    while read -r _ model kind ms share tf; do
      printf '%-12s %-24s %10s %7s %9s\n' "$model" "$kind" "$ms" "$share" "$tf"
    done
fi
# Each bf16-storage kernel alone (gpu_kernels_bench): GB/s or TFLOP/s and the share of the
# device's HBM bandwidth or dense bf16 peak.
if [[ -f "$kbench_log" ]] && grep -q '^kernel-rate ' "$kbench_log"; then
  echo
  printf '%-36s %12s %-8s %8s\n' "kernel (bf16 storage)" "rate" "unit" "of peak"
  grep '^kernel-rate ' "$kbench_log" | while read -r _ name value unit share; do
    printf '%-36s %12s %-8s %8s\n' "$name" "$value" "$unit" "$share"
  done
fi
# The loop (c3): gpt2-124m's measured step, predicted with the device's profile and with the
# profile calibrated on that measured trace.
if (( ${#loop_rows[@]} > 0 )); then
  echo
  printf '%-28s %12s %12s %8s %12s %8s\n' "loop (gpt2-124m bf16)" "measured ms" "predicted" \
    "error" "calibrated" "error"
  for r in "${loop_rows[@]}"; do
    IFS='|' read -r a b c d e <<<"$r"
    printf '%-28s %12s %12s %8s %12s %8s\n' "step" "$a" "$b" "$c" "$d" "$e"
  done
fi
# The capture path (c4): the tiny bf16 plan's median step replayed from its graph and run eagerly.
if (( ${#graph_rows[@]} > 0 )); then
  echo
  printf '%-28s %14s %14s\n' "capture path (tiny bf16)" "replayed ms" "eager ms"
  for r in "${graph_rows[@]}"; do
    IFS='|' read -r a b <<<"$r"
    printf '%-28s %14s %14s\n' "median step" "$a" "$b"
  done
fi
echo
if (( failed )); then
  echo "gpu-check: FAIL (logs in ${logs#"$root"/}/)"
  exit 1
fi
echo "gpu-check: PASS"
exit 0
