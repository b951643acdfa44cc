#!/usr/bin/env bash
# Regenerates the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/) from a built
# parasol: valid documents of every reader, so that the fuzzers start from inputs that reach deep
# into each reader. Usage: tests/fuzz/make_seeds.sh build/tools/parasol. The Hugging Face configs
# and the accuracy suites are seeded from tests/data directly (see CMakeLists.txt).
set -euo pipefail
parasol=$(realpath "$1")
cd "$(dirname "$0")"
c=corpus
# Everything but the hand-written seeds (cluster_json/explicit.json, also read by
# tests/core/json_fuzz_test.cc) is regenerated.
find "$c" -type f ! -name explicit.json -delete 2>/dev/null || true
mkdir -p "$c"/{model_json,cluster_json,plan_json,trace_json,profile_json,checkpoint_manifest,token_file,plan_import}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
unwrap() { jq -c ".$1"; }  # `show X --json` wraps the document in {"X": ...}

for m in tiny tiny-moe gpt2-124m llama2-7b qwen3-30b-a3b gpt-oss-20b; do
  "$parasol" show model "$m" --json | unwrap model > "$c/model_json/$m.json"
done
cp ../data/loop/gpt-s.json "$c/model_json/loop-gpt-s.json"

for spec in "dgx-h100 8" "dgx-a100-80g 16"; do
  set -- $spec
  echo "{\"preset\": \"$1\", \"gpus\": $2}" > "$c/cluster_json/preset-$1.json"
done
echo '{"generator": "rail", "name": "r", "gpus": 16, "device": "A100-80G", "gpus_per_server": 8, "nvlink_GBps": 300, "pcie_GBps": 32, "nics_per_server": 4, "nic_GBps": 25, "host_memory_GiB": 1024, "servers_per_leaf": 1, "oversubscription": 2}' > "$c/cluster_json/rail.json"
echo '{"generator": "fat-tree", "gpus": 8, "gpus_per_server": 4, "nic_GBps": 50}' > "$c/cluster_json/fat-tree.json"
echo '{"generator": "torus", "name": "t", "dims": [2, 2, 2], "gpus": 8, "device": "H100-SXM", "link_GBps": 100, "latency_us": 1}' > "$c/cluster_json/torus.json"

plan() { "$parasol" show plan --json --model tiny-moe --cluster dgx-h100 --gpus 8 "$@" | unwrap plan; }
plan --tp 2 --pp 2 > "$c/plan_json/tp2-pp2.json"
plan --tp 2 --ep 2 --sp --zero 1 --recompute full --recompute-layers 1 > "$c/plan_json/moe.json"
plan --pp 2 --vpp 2 --schedule interleaved --gbs 8 --offload optimizer,activations \
  > "$c/plan_json/interleaved.json"
"$parasol" show plan --json --model tiny --cluster dgx-h100 --gpus 8 --zero 3 --cp 2 --recompute selective --tp 1 | unwrap plan > "$c/plan_json/zero3-cp.json"

"$parasol" simulate --model tiny --cluster dgx-h100 --gpus 2 --tp 2 --trace "$c/trace_json/tp2.json" >/dev/null
# Pipeline flows, the dependency flows of tensor- and data-parallel collectives, memory counters.
"$parasol" simulate --model tiny --cluster dgx-h100 --gpus 4 --pp 2 --dp 2 --gbs 4 --trace "$c/trace_json/pp2-dp2.json" >/dev/null
"$parasol" calibrate --probe -o "$c/profile_json/host.json" >/dev/null

(cd "$tmp" && OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  "$parasol" run --model tiny --gbs 2 --steps 2 --checkpoint ckpt >/dev/null)
cp "$tmp"/ckpt/step-*/manifest.json "$c/checkpoint_manifest/manifest.json"
printf 'step-2\n' > "$c/checkpoint_manifest/latest"

# llm.c token file: a 256-int32 header (magic 20240520, version 1, token count) and uint16 tokens.
tokens() {
  { printf '%08x' 20240520 1 "$1" | sed 's/\(..\)\(..\)\(..\)\(..\)/\4\3\2\1/g' | xxd -r -p
    head -c $((253 * 4)) /dev/zero
    for ((i = 0; i < $1; i++)); do printf '%04x' $(((i * 37) % $2)) | sed 's/\(..\)\(..\)/\2\1/' | xxd -r -p; done
  } > "$3"
}
tokens 40 512 "$c/token_file/tokens-40.bin"
tokens 2 7 "$c/token_file/tokens-2.bin"
# Other frameworks' jobs as `--plan` reads them: each export's files but the hostfile (Megatron-LM
# arguments and launch script, DeepSpeed config and launcher, torchtitan job TOML and launcher).
export_seeds() {
  local name=$1
  shift
  "$parasol" export --cluster dgx-h100 --gpus 8 -o "$tmp/$name" "$@" >/dev/null
  for f in "$tmp/$name"/*; do
    [ "$(basename "$f")" = hostfile ] || install -m 644 "$f" "$c/plan_import/$name-$(basename "$f")"
  done
}
export_seeds megatron --to megatron --model tiny --tp 2 --pp 2 --sp --recompute selective
export_seeds deepspeed --to deepspeed --model tiny --zero 3 --offload optimizer --tp 1
export_seeds deepspeed-tp2 --to deepspeed --model tiny --zero 1 --tp 2 --pp 2
export_seeds torchtitan --to torchtitan --model llama3-8b --tp 2 --sp --zero 3 --tp-impl torch
echo "seeds: $(find "$c" -type f | wc -l) files under tests/fuzz/$c"

# Kineto traces: the head of each real trace of tests/data/traces (metadata, then 300 events)
# with every NCCL kernel, its runtime call and the CPU ops around the call; and a small one with
# the args the importer reads (shapes, NCCL sizes, a memcpy).
mkdir -p "$c/kineto_json"
python3 - "$c/kineto_json" <<'PY'
import gzip, json, sys
out = sys.argv[1]
for src, dst in [("../data/traces/hta_sampled_rank-0.json.gz", "hta-sampled-head.json"),
                 ("../data/traces/hta_nccl_step5_rank-0.json.gz", "hta-nccl-head.json")]:
    d = json.load(gzip.open(src))
    ev = d["traceEvents"]
    nccl = [e for e in ev if e.get("cat") == "kernel" and e["name"].startswith("nccl")]
    corr = {e["args"].get("correlation") for e in nccl}
    calls = [e for e in ev if e.get("cat") == "cuda_runtime"
             and e.get("args", {}).get("correlation") in corr]
    encl = [e for e in ev if e.get("cat") == "cpu_op" and any(
        e["tid"] == c["tid"] and e["ts"] <= c["ts"] <= e["ts"] + e["dur"] for c in calls)]
    head = [e for e in ev if e.get("ph") == "M"][:10] + [e for e in ev if e.get("ph") == "X"][:300]
    d["traceEvents"] = head + encl + calls + nccl
    d.pop("deviceProperties", None)
    open(f"{out}/{dst}", "w").write(json.dumps(d))
op = lambda n, ts, dur, dims, types: {"ph": "X", "cat": "cpu_op", "name": n, "pid": 10, "tid": 11,
    "ts": ts, "dur": dur, "args": {"Input Dims": dims, "Input type": types}}
call = lambda ts, c: {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 10,
    "tid": 11, "ts": ts, "dur": 2, "args": {"correlation": c}}
kern = lambda n, ts, c, tid, args={}: {"ph": "X", "cat": "kernel", "name": n, "pid": 0, "tid": tid,
    "ts": ts, "dur": 10, "args": dict(args, correlation=c)}
ev = [op("aten::addmm", 100, 20, [[768], [4096, 1024], [1024, 768]], ["c10::BFloat16"] * 3),
      call(105, 1), kern("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 1000, 1, 7),
      op("aten::_scaled_dot_product_flash_attention", 200, 10,
         [[2, 16, 1024, 64], [2, 4, 1024, 64], [2, 4, 1024, 64]], ["c10::BFloat16"] * 3),
      call(201, 2), kern("void flash_fwd_kernel<Flash_fwd_kernel_traits<64>>", 1020, 2, 7),
      op("c10d::_allgather_base_", 300, 10, [[64, 1024], [8, 1024]], ["float", "float"]),
      call(301, 3), kern("ncclDevKernel_AllGather_RING_LL", 1040, 3, 20),
      call(400, 4), kern("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 1060, 4, 20,
                         {"Collective name": "allreduce", "In msg nelems": 1000,
                          "dtype": "BFloat16", "Group size": 8}),
      {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "pid": 0,
       "tid": 30, "ts": 1080, "dur": 4, "args": {"bytes": 4096}}]
json.dump({"schemaVersion": 1, "distributedInfo": {"rank": 3}, "traceEvents": ev},
          open(f"{out}/small.json", "w"))
PY
