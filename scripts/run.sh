#!/usr/bin/env bash
# The README's main command: installs what is missing, builds parasol and runs the plan
# search on its embedded defaults (gpt3-175b on 1,024 GPUs of dgx-a100-80g, global batch 1,536).
# Arguments replace the default command line, e.g. scripts/run.sh show model llama3-8b.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh >/dev/null
if (($#)); then exec build/tools/parasol "$@"; else exec build/tools/parasol search; fi
