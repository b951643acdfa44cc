#!/usr/bin/env bash
# Installs the Debian packages parasol builds against, only those that are missing.
# Idempotent: a second run calls neither apt-get update nor apt-get install.
set -euo pipefail
source "$(dirname "$0")/packages.sh"
# --build-only (scripts/run.sh): only what the parasol executable builds against, not the test
# command's clang, Chromium and Python packages.
wanted=("${parasol_packages[@]}")
[[ ${1:-} == --build-only ]] || wanted+=("${parasol_test_packages[@]}")
missing=()
for p in "${wanted[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
