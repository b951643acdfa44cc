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
export_seeds torchtitan --to torchtitan --model llama3-8b --tp 2 --sp --zero 3
echo "seeds: $(find "$c" -type f | wc -l) files under tests/fuzz/$c"
