#!/usr/bin/env bash
# What each term of the cost model does to each family of published runs: `parasol accuracy`
# over tests/data/published/ with one term switched off (or one framework switch flipped in
# every published plan), printed as mean |error| and signed bias per family beside the model
# as it is. A term whose removal lowers a family's error is one to look at again.
#
#   tools/term-effects.sh [--bin PATH] [--simulate]    (default bin: build/tools/parasol)
#
# Terms are settings of `accuracy --profile-set` (the device profile, tools/json_settings.h) and
# `--plan-set` (the published plans; a plan the switch makes invalid stays as published).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$root/build/tools/parasol"
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --bin) bin="$2"; shift 2 ;;
    --simulate) extra+=(--simulate); shift ;;
    -h|--help) sed -n '2,10p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "term-effects.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[[ -x "$bin" ]] || { echo "term-effects.sh: no parasol binary at $bin (build it first)" >&2; exit 2; }
suites=("$root"/tests/data/published/*.json)

# name | accuracy flags
terms=(
  "as built|"
  "overlap is free|--profile-set overlap_compute_slowdown=0"
  "boost clock sustained|--profile-set sustained_clock=1"
  "no per-kernel overhead|--profile-set kernel_overhead_us=0"
  "no NCCL latency|--profile-set nccl/base_latency_us*=0 --profile-set nccl/hw_latency_us*=0 --profile-set nccl/net_overhead_us*=0"
  "links at wire speed|--profile-set link_efficiency/nvlink=1 --profile-set link_efficiency/nvswitch=1 --profile-set link_efficiency/infiniband=1 --profile-set link_efficiency/pcie=1"
  "no TP comm overlap|--plan-set tp_comm_overlap=false"
  "no EP comm overlap|--plan-set ep_comm_overlap=false"
  "all-to-all dispatcher|--plan-set moe_dispatcher=alltoall"
  "trained router (no forced balance)|--plan-set moe_force_balance=none"
  "unfused kernels|--plan-set fused_kernels=false"
  "FlashAttention-2 kernel|--plan-set attention_kernel=flash2"
  "no DP overlap|--plan-set overlap_grad_reduce=false --plan-set overlap_param_gather=false"
  "recompute modules as default|--plan-set recompute_modules=[\"core_attn\"]"
  "cuDNN fwd at 0.62 (old)|--profile-set cudnn_forward_efficiency=0.62"
)

run_term() {  # flags... -> "family mean bias" lines
  # shellcheck disable=SC2068
  "$bin" accuracy "${suites[@]}" "${extra[@]}" $@ |
    awk '/runs  mean/ {f=$1; m=$6; b=$8; gsub("%","",m); gsub("%","",b); print f, m, b}'
}

families=$(run_term | awk '{print $1}')
printf "%-26s" "term"
for f in $families; do printf " %20s" "$f"; done
printf "\n%-26s" ""
for f in $families; do printf " %20s" "mean|err| / bias"; done
printf "\n"
for t in "${terms[@]}"; do
  name="${t%%|*}"
  flags="${t#*|}"
  printf "%-26s" "$name"
  # shellcheck disable=SC2086
  run_term $flags | while read -r f m b; do printf " %20s" "$m / $b"; done
  printf "\n"
done
