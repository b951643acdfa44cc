#!/usr/bin/env bash
# `pip install .` as a Python user does it (pyproject.toml): a fresh virtual environment, the
# checkout installed into it (scikit-build-core and pybind11 from PyPI), then the README's Python
# session and the installed `parasol` command, whose search must equal the module's.
# Usage: pip_install_test.sh SOURCE_DIR WORK_DIR
# Exits 77 (skipped) when python3 has no venv module or PyPI cannot be reached.
set -uo pipefail
src=$1 work=$2
python=${PARASOL_TEST_PYTHON:-/usr/bin/python3}
rm -rf "$work/venv"
mkdir -p "$work"
if ! "$python" -m venv "$work/venv" >"$work/venv.log" 2>&1; then
  echo "skipped: $python -m venv failed (python3-venv missing?)"; tail -3 "$work/venv.log"; exit 77
fi
venv=$work/venv
# The build folder is the pyproject's (build/pip/<tag> in the checkout): a second run is
# incremental. PIP_* from the environment (an index mirror) are honoured.
# The CUDA parts are left out here (--config-settings cmake.define.PARASOL_CUDA=OFF, for CI time:
# the plain build compiles them); a user's `pip install .` builds them where nvcc, cuBLASLt and
# NCCL are found. It is built unoptimised (cmake.build-type=Debug, also for CI time: about half
# the compile time of the pyproject's Release; the session's searches are small), and without
# debug information (CMAKE_CXX_FLAGS_DEBUG=-O0 in place of -g: nothing here reads it).
# (--config-settings, not -C: Debian 12's venv has pip 23.0.)
if ! "$venv/bin/pip" install --quiet --disable-pip-version-check \
    --config-settings=cmake.define.PARASOL_CUDA=OFF --config-settings=cmake.build-type=Debug \
    --config-settings=cmake.define.CMAKE_CXX_FLAGS_DEBUG=-O0 \
    "$src" >"$work/pip.log" 2>&1; then
  if grep -qiE "Could not find a version|connection|Temporary failure in name resolution|No matching distribution" "$work/pip.log"; then
    echo "skipped: PyPI cannot be reached for scikit-build-core and pybind11"; tail -5 "$work/pip.log"; exit 77
  fi
  echo "FAIL: pip install failed"; tail -40 "$work/pip.log"; exit 1
fi
cd "$work"  # away from the checkout: the installed package, not the source tree, is imported
fails=0
# The README's Python session.
if ! "$venv/bin/python" - >"$work/session.txt" 2>&1 <<'PY'; then
import json, os, parasol
est = parasol.estimate(model="llama3-8b", cluster="dgx-h100", gpus=8, tp=2, mbs=1, gbs=64)
assert est["step_time_s"] > 0, est
res = parasol.search(model="llama3-8b", cluster="dgx-h100", gpus=8, gbs=64, top=3)
assert len(res["top"]) >= 1, res
try:
    parasol.estimate(model="llama3-8b", cluster="dgx-h100", gpus=8, tp=3)
    raise SystemExit("tp=3 was accepted")
except parasol.Error as e:
    assert "tp" in e.field, e.field
print(json.dumps({"module": parasol.__file__, "best": res["top"][0]["estimate"]["step_time_s"]}))
PY
  echo "FAIL: the Python session"; cat "$work/session.txt"; fails=1
fi
if [[ ! -x $venv/bin/parasol ]]; then
  echo "FAIL: pip install did not put the parasol executable in $venv/bin"; fails=1
else
  cli=$("$venv/bin/parasol" search --model llama3-8b --cluster dgx-h100 --gpus 8 --gbs 64 --top 3 --json)
  module_best=$(tail -1 "$work/session.txt" | "$venv/bin/python" -c 'import json,sys; print(json.load(sys.stdin)["best"])')
  cli_best=$("$venv/bin/python" -c 'import json,sys; print(json.load(sys.stdin)["top"][0]["estimate"]["step_time_s"])' <<<"$cli")
  if [[ "$module_best" != "$cli_best" ]]; then
    echo "FAIL: the module's best step time $module_best differs from the command's $cli_best"; fails=1
  fi
  case $(tail -1 "$work/session.txt") in
    *"$venv"*) ;;
    *) echo "FAIL: parasol was not imported from the virtual environment"; tail -1 "$work/session.txt"; fails=1 ;;
  esac
fi
((fails == 0)) && echo "pip install: module and executable installed and working ($venv)"
exit $fails
