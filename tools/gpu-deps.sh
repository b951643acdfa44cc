#!/usr/bin/env bash
# tools/gpu-deps.sh: carries parasol's Debian build dependencies to a GPU machine that has the CUDA
# toolkit but no network and none of scripts/packages.sh's packages (a lent cloud GPU, a locked
# cluster node), so that tools/gpu-check.sh can build there with CMake.
#
#   tools/gpu-deps.sh download [DIR]   on a Debian 12 machine with apt (default DIR: .gpudeps):
#       fetches the .deb files of the packages below (the headers and libraries parasol builds and
#       links against, and the libraries they load; no compiler, no base system) with
#       `apt-get download`, and records in DIR/links.txt the alternatives links (mpicxx, mpirun,
#       libopenblas.so, ...) this machine resolves, which dpkg would create from maintainer scripts.
#   tools/gpu-deps.sh unpack [DIR [ROOT]]   on the GPU machine, as root: extracts each .deb whose
#       package is not installed there into ROOT (default /), creates the recorded links that are
#       missing, runs ldconfig, and lists the packages it extracted in
#       ROOT/var/lib/parasol/gpu-deps.list (gpu-check's preflight counts them as installed). Extracting does not run maintainer scripts: it is for a machine
#       that is thrown away after the check, never for a machine someone keeps.
# Both are idempotent. Exit 2 for a usage error or a missing tool.
set -euo pipefail

# The packages, resolved on Debian 12 from scripts/packages.sh (apt-cache depends --recurse) less
# the compiler, the base system and alternatives nobody selects. Boost.Graph is header-only:
# libboost1.74-dev carries its headers and Boost's CMake configuration.
gpu_dep_packages=(
  libboost1.74-dev nlohmann-json3-dev libcli11-dev libgtest-dev libbenchmark-dev
  libbenchmark1debian libxxhash-dev libxxhash0 make zlib1g-dev libsqlite3-dev
  libopenmpi-dev libopenmpi3 openmpi-bin openmpi-common libhwloc15 libpmix2 libevent-2.1-7
  libevent-core-2.1-7 libevent-extra-2.1-7 libevent-pthreads-2.1-7 libfabric1 libucx0 libibverbs1
  ibverbs-providers librdmacm1 libpsm2-2 libpsm-infinipath1 libnl-3-200 libnl-route-3-200
  libnuma1 libmunge2 libltdl7 libpciaccess0
  libopenblas-dev libopenblas-pthread-dev libopenblas0 libopenblas0-pthread libgfortran5
  protobuf-compiler libprotoc32 libprotobuf-dev libprotobuf32 libprotobuf-lite32
)
# The alternatives whose links the build and mpirun use.
gpu_dep_alternatives=(mpi mpi-x86_64-linux-gnu mpirun libopenblas.so-x86_64-linux-gnu
  libopenblas.so.0-x86_64-linux-gnu libblas.so.3-x86_64-linux-gnu liblapack.so.3-x86_64-linux-gnu)

usage() { sed -n '2,19p' "$0" >&2; exit 2; }
verb="${1:-}"; dir="${2:-.gpudeps}"; root="${3:-/}"; root="${root%/}"
[[ "$verb" == download || "$verb" == unpack ]] || usage

if [[ "$verb" == download ]]; then
  command -v apt-get >/dev/null || { echo "gpu-deps: download needs apt-get (Debian 12)" >&2; exit 2; }
  mkdir -p "$dir"
  have=(); for f in "$dir"/*.deb; do [[ -e "$f" ]] && have+=("$(basename "$f" | cut -d_ -f1)"); done
  want=()
  for p in "${gpu_dep_packages[@]}"; do
    [[ " ${have[*]} " == *" $p "* ]] || want+=("$p")
  done
  if ((${#want[@]})); then (cd "$dir" && apt-get download -qq "${want[@]}"); fi
  : >"$dir/links.txt"
  for a in "${gpu_dep_alternatives[@]}"; do
    # The master link and its slaves: the lines before the first "Alternative:" block.
    while read -r link; do
      [[ -L "$link" ]] || continue
      # The alternative itself (link -> /etc/alternatives/NAME -> value), not the file a chain of
      # links ends at: mpicxx.openmpi finds its wrapper data by the name it was called with.
      target="$(readlink "$link")"
      [[ "$target" == /etc/alternatives/* ]] && target="$(readlink "$target")"
      [[ -e "$target" ]] && echo "$link $target" >>"$dir/links.txt"
    done < <(update-alternatives --query "$a" 2>/dev/null |
               awk '/^Alternative:/{exit} /^Link:/{print $2} /^ /{print $2}')
  done
  # The cuDNN frontend's C++ headers (header-only; runtime/cuda/cudnn_attention.h), from the
  # nvidia-cudnn-frontend wheel on PyPI: its include/ folder into DIR/cudnn_frontend/include,
  # which tools/gpu-check.sh hands to CMake (cuDNN itself comes with the CUDA toolkit).
  if [[ ! -f "$dir/cudnn_frontend/include/cudnn_frontend.h" ]]; then
    if command -v pip >/dev/null || command -v pip3 >/dev/null; then
      pipc="$(command -v pip || command -v pip3)"
      tmp="$(mktemp -d)"
      if "$pipc" download -q --no-deps --only-binary=:all: -d "$tmp" nvidia-cudnn-frontend; then
        mkdir -p "$dir/cudnn_frontend"
        python3 -c 'import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("include/")])' \
          "$(ls "$tmp"/*.whl | head -n1)" "$dir/cudnn_frontend"
      else
        echo "gpu-deps: pip could not download nvidia-cudnn-frontend: the GPU build will lack cuDNN attention" >&2
      fi
      rm -rf "$tmp"
    else
      echo "gpu-deps: no pip: the cuDNN frontend's headers are not carried" >&2
    fi
  fi
  echo "gpu-deps: $(ls "$dir"/*.deb | wc -l) packages ($(du -sh "$dir" | cut -f1)) and" \
       "$(wc -l <"$dir/links.txt") links in $dir"
  exit 0
fi

# unpack
[[ -n "$root" || "$(id -u)" -eq 0 ]] || { echo "gpu-deps: unpack extracts into / and must run as root" >&2; exit 2; }
compgen -G "$dir/*.deb" >/dev/null || { echo "gpu-deps: no .deb files in $dir (run download first)" >&2; exit 2; }
# Installed under its name or under its 64-bit-time name (Debian 13 and Ubuntu 24.04 renamed
# libopenmpi3 to libopenmpi3t64, libpmix2 to libpmix2t64, ...): extracting Debian 12's library over
# the machine's own of another version mixes two builds of one stack (Open MPI's components of one,
# PMIx of the other crash in mpirun).
installed() { command -v dpkg-query >/dev/null || return 1
  local n; for n in "$1" "$1t64"; do
    dpkg-query -W -f='${Status}' "$n" 2>/dev/null | grep -q "install ok installed" && return 0
  done; return 1; }
extract() {  # extract DEB: into ROOT, with dpkg-deb where the machine has it, else ar and tar
  if command -v dpkg-deb >/dev/null; then dpkg-deb -x "$1" "${root:-/}"; return; fi
  local member; member="$(ar t "$1" | grep '^data\.tar')"
  case "$member" in
    *.xz) ar p "$1" "$member" | tar -xJ -C "${root:-/}" ;;
    *.zst) ar p "$1" "$member" | zstd -dc | tar -x -C "${root:-/}" ;;
    *.gz) ar p "$1" "$member" | tar -xz -C "${root:-/}" ;;
    *) echo "gpu-deps: $1: unknown data member '$member'" >&2; return 1 ;;
  esac
}
mkdir -p "$root/var/lib/parasol"
list="$root/var/lib/parasol/gpu-deps.list"
touch "$list"
n=0
for deb in "$dir"/*.deb; do
  p="$(basename "$deb" | cut -d_ -f1)"
  if installed "$p" || grep -qx "$p" "$list"; then continue; fi
  extract "$deb"
  echo "$p" >>"$list"
  echo "gpu-deps: extracted $p"
  n=$((n + 1))
done
links=0
if [[ -f "$dir/links.txt" ]]; then
  while read -r link target; do
    if [[ ! -e "$root$link" && ! -L "$root$link" && -e "$root$target" ]]; then
      mkdir -p "$(dirname "$root$link")" && ln -sf "$target" "$root$link" && links=$((links + 1))
    fi
  done <"$dir/links.txt"
fi
if [[ -z "$root" ]]; then ldconfig; else ldconfig -r "$root" 2>/dev/null || true; fi
echo "gpu-deps: extracted ${n} packages and made ${links} links (list: ${list})"
