#!/usr/bin/env bash
# The installed tree works: `cmake --install` of the build tree into a temporary prefix, then a
# consumer project (tests/install/consumer: find_package(parasol CONFIG REQUIRED)) configured
# and built against it, whose closed-form step time must equal the installed
# `parasol estimate --json`'s for the same plan (and its search's best plan `parasol search`'s);
# and the pkg-config file names the headers and
# libraries that build the same consumer without CMake. Writes only under WORK.
# Usage: install_test.sh BUILD_DIR SOURCE_DIR WORK CXX_COMPILER [sanitized]
# Exit 77 (skipped) for a sanitizer build: its static libraries need a sanitizer-linked consumer.
set -euo pipefail
build=$1 src=$2 work=$3 cxx=$4
if [[ ${5:-} == sanitized ]]; then
  echo "skipped: sanitizer build (the installed static libraries need ASan/UBSan-linked consumers)"
  exit 77
fi
rm -rf "$work"
mkdir -p "$work"
prefix=$work/prefix

cmake --install "$build" --prefix "$prefix" > "$work/install.log"
for f in bin/parasol include/parasol/core/model.h include/parasol/cost_models/estimate.h \
         include/parasol/sim/search.h lib/cmake/parasol/parasolConfig.cmake \
         lib/cmake/parasol/parasolConfigVersion.cmake lib/cmake/parasol/parasolTargets.cmake; do
  [[ -e $prefix/$f ]] || { echo "FAIL: $f not installed"; exit 1; }
done

cmake -S "$src/tests/install/consumer" -B "$work/consumer" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_PREFIX_PATH="$prefix" > "$work/configure.log"
cmake --build "$work/consumer" -j2 > "$work/build.log" || { cat "$work/build.log"; exit 1; }

check() {  # MODEL CLUSTER GPUS TP PP GBS: the consumer's step time equals parasol's
  local got want
  got=$("$work/consumer/consumer" "$@")
  want=$("$prefix/bin/parasol" estimate --json --model "$1" --cluster "$2" --gpus "$3" \
           --tp "$4" --pp "$5" --gbs "$6" |
         /usr/bin/python3 -c 'import json, sys; print(repr(json.load(sys.stdin)["step_time_s"]))')
  if /usr/bin/python3 -c "import sys; sys.exit(0 if float('$got') == float('$want') else 1)"; then
    echo "ok: $* step time $got s"
  else
    echo "FAIL: $*: consumer $got s, parasol estimate $want s"
    exit 1
  fi
}
check llama3-8b dgx-h100 16 2 2 64
check gpt3-175b dgx-a100-80g 1024 8 8 1536

# The search through parasol::parasol_sim: the best plan's step time equals parasol search's.
got=$("$work/consumer/consumer_search" llama3-8b dgx-h100 16 64)
want=$("$prefix/bin/parasol" search --json --model llama3-8b --cluster dgx-h100 --gpus 16 \
         --gbs 64 --top 1 |
       /usr/bin/python3 -c 'import json, sys; print(repr(json.load(sys.stdin)["top"][0]["estimate"]["step_time_s"]))')
/usr/bin/python3 -c "import sys; sys.exit(0 if float('$got') == float('$want') else 1)" ||
  { echo "FAIL: search: consumer $got s, parasol search $want s"; exit 1; }
echo "ok: search best step time $got s"

# pkg-config: the same consumer from the .pc file alone.
if command -v pkg-config > /dev/null; then
  flags=$(PKG_CONFIG_PATH=$(dirname "$(find "$prefix" -name parasol.pc)") \
          pkg-config --cflags --libs parasol)
  # shellcheck disable=SC2086
  "$cxx" -std=c++20 -O1 "$src/tests/install/consumer/main.cc" -o "$work/consumer_pc" $flags
  [[ $("$work/consumer_pc" llama3-8b dgx-h100 16 2 2 64) == \
     $("$work/consumer/consumer" llama3-8b dgx-h100 16 2 2 64) ]] ||
    { echo "FAIL: the pkg-config build differs"; exit 1; }
  echo "ok: pkg-config build"
fi
echo PASS
