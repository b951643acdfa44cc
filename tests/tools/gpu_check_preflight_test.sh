#!/usr/bin/env bash
# Tests tools/gpu-check.sh's preflight without a GPU: fake nvcc and nvidia-smi programs on PATH
# stand for the machines it must explain, and the check must exit 2 before building, naming what
# is wrong. Usage: gpu_check_preflight_test.sh SOURCE_DIR
set -uo pipefail
src="$1"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fails=0

# A toolkit without NCCL or cuBLASLt: $tmp/cuda/bin/nvcc reports CUDA 13.0.
mkdir -p "$tmp/cuda/bin" "$tmp/cuda/lib64" "$tmp/cuda/include" "$tmp/bin"
cat >"$tmp/cuda/bin/nvcc" <<'X'
#!/bin/sh
echo "Cuda compilation tools, release 13.0, V13.0.48"
X
chmod +x "$tmp/cuda/bin/nvcc"

# expect NAME RC PATTERN...: runs the check with the fake programs; RC and every PATTERN must match.
expect() {
  local name="$1" want_rc="$2"; shift 2
  local out rc=0
  out="$(PATH="$tmp/bin:$PATH" CUDACXX="$tmp/cuda/bin/nvcc" \
         bash "$src/tools/gpu-check.sh" --build-dir "$tmp/build" 2>&1)" || rc=$?
  if [[ "$rc" != "$want_rc" ]]; then
    echo "FAIL $name: exit $rc, expected $want_rc"; echo "$out"; fails=$((fails + 1)); return
  fi
  local p
  for p in "$@"; do
    if ! grep -qF -- "$p" <<<"$out"; then
      echo "FAIL $name: no '$p' in:"; echo "$out"; fails=$((fails + 1)); return
    fi
  done
  if [[ -e "$tmp/build/CMakeCache.txt" ]]; then
    echo "FAIL $name: it configured a build"; fails=$((fails + 1)); return
  fi
  echo "ok   $name"
}

# 1. A driver for CUDA 12.4 under a CUDA 13.0 toolkit, and no NCCL: both named, nothing built.
cat >"$tmp/bin/nvidia-smi" <<'X'
#!/bin/sh
case "$1" in
  --query-gpu=*) echo "NVIDIA H200, 550.54.15" ;;
  *) echo "| NVIDIA-SMI 550.54.15    Driver Version: 550.54.15    CUDA Version: 12.4 |" ;;
esac
X
chmod +x "$tmp/bin/nvidia-smi"
expect "old driver, new toolkit" 2 "supports CUDA up to 12.4" "toolkit is CUDA 13.0" \
  "no NCCL" "CUDA 13 toolkits do not ship it" "no cuBLASLt" "nothing was built" \
  "no cuDNN (libcudnn.so) beside the toolkit"

# 2. NVML out of step with the kernel module.
cat >"$tmp/bin/nvidia-smi" <<'X'
#!/bin/sh
echo "Failed to initialize NVML: Driver/library version mismatch"
exit 18
X
expect "driver/library mismatch" 2 "nvidia-smi fails (exit 18)" "Driver/library version mismatch"

# 3. No driver at all.
rm "$tmp/bin/nvidia-smi"
if ! command -v nvidia-smi >/dev/null; then
  expect "no driver" 2 "no nvidia-smi: the NVIDIA driver is not installed"
fi

# 4. A driver that lists no GPU, with a matching toolkit: the GPU is what is missing.
cat >"$tmp/bin/nvidia-smi" <<'X'
#!/bin/sh
case "$1" in
  --query-gpu=*) ;;
  *) echo "| NVIDIA-SMI 580.00    Driver Version: 580.00    CUDA Version: 13.0 |" ;;
esac
X
chmod +x "$tmp/bin/nvidia-smi"
out="$(PATH="$tmp/bin:$PATH" CUDACXX="$tmp/cuda/bin/nvcc" bash "$src/tools/gpu-check.sh" \
       --build-dir "$tmp/build" 2>&1)"
if grep -qF "nvidia-smi lists no GPU" <<<"$out" && ! grep -qF "supports CUDA up to" <<<"$out"; then
  echo "ok   no GPU listed"
else
  echo "FAIL no GPU listed:"; echo "$out"; fails=$((fails + 1))
fi

exit $((fails > 0))
