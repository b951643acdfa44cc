#!/usr/bin/env bash
# tools/gpu-deps.sh: usage errors exit 2; `unpack DIR ROOT` extracts a package the machine lacks
# into ROOT, makes the recorded links, lists the package, and a second unpack extracts nothing.
# A package the machine has installed (dpkg) is not extracted. Built .debs, no network.
set -euo pipefail
root_dir="$1"
script="$root_dir/tools/gpu-deps.sh"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# Usage errors.
rc=0; bash "$script" >/dev/null 2>&1 || rc=$?
[[ $rc -eq 2 ]] || fail "no verb: exit $rc, want 2"
rc=0; bash "$script" install >/dev/null 2>&1 || rc=$?
[[ $rc -eq 2 ]] || fail "unknown verb: exit $rc, want 2"
mkdir -p "$work/empty"
rc=0; out="$(bash "$script" unpack "$work/empty" "$work/root" 2>&1)" || rc=$?
[[ $rc -eq 2 && "$out" == *"no .deb files"* ]] || fail "empty dir: exit $rc, '$out'"

# A package of one library file, and one named like a package this machine has installed.
make_deb() {  # make_deb NAME FILE
  local d="$work/pkg-$1"
  mkdir -p "$d/DEBIAN" "$(dirname "$d$2")"
  printf 'Package: %s\nVersion: 1.0\nArchitecture: all\nMaintainer: parasol\nDescription: test\n' "$1" \
    >"$d/DEBIAN/control"
  echo "$1" >"$d$2"
  dpkg-deb --build -Zxz "$d" "$work/debs/${1}_1.0_all.deb" >/dev/null
}
mkdir -p "$work/debs"
make_deb parasol-fake-lib /usr/lib/parasol-fake/libfake.so.1
installed_pkg="$(dpkg-query -W -f='${Package}\n' 'libc6' 2>/dev/null | head -n1)"
[[ -n "$installed_pkg" ]] && make_deb "$installed_pkg" /usr/lib/parasol-fake/from-installed
echo "/usr/lib/libfake.so.1 /usr/lib/parasol-fake/libfake.so.1" >"$work/debs/links.txt"

out="$(bash "$script" unpack "$work/debs" "$work/root")"
[[ -f "$work/root/usr/lib/parasol-fake/libfake.so.1" ]] || fail "the package was not extracted: $out"
[[ "$(readlink "$work/root/usr/lib/libfake.so.1")" == /usr/lib/parasol-fake/libfake.so.1 ]] ||
  fail "the recorded link was not made"
grep -qx parasol-fake-lib "$work/root/var/lib/parasol/gpu-deps.list" || fail "not listed"
if [[ -n "$installed_pkg" ]]; then
  [[ ! -e "$work/root/usr/lib/parasol-fake/from-installed" ]] ||
    fail "a package installed here ($installed_pkg) was extracted"
fi
[[ "$out" == *"extracted 1 packages and made 1 links"* ]] || fail "first unpack said: $out"
out="$(bash "$script" unpack "$work/debs" "$work/root")"
[[ "$out" == *"extracted 0 packages and made 0 links"* ]] || fail "second unpack said: $out"
echo "gpu_deps_test: ok"
