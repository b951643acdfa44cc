# Sourced by the report's Chromium tests (render_test.sh, render_large_test.sh): the check that
# Chromium is installed and `browse`, headless Chromium with its own profile. Before sourcing,
# set `test_name` (for messages) and `tmp` (a scratch folder the caller removes).
# Chromium is installed by scripts/setup.sh (scripts/packages.sh: parasol_test_packages); where
# it is missing the test is skipped (exit 77, SKIP_RETURN_CODE in tests/report/CMakeLists.txt)
# with the reason, which scripts/test.sh's last lines list.
if ! command -v chromium > /dev/null; then
  echo "skipped: chromium is not installed (scripts/setup.sh installs it:" \
       "parasol_test_packages in scripts/packages.sh)"
  exit 77
fi

# chromium --headless with its own profile; --no-sandbox as tests may run as root. 60 s at most.
browse() {
  timeout 60 chromium --headless --no-sandbox --disable-gpu --hide-scrollbars \
    --user-data-dir="$tmp/profile-$RANDOM" --window-size=1200,1600 "$@" 2> "$tmp/chromium.log" || {
    echo "$test_name: FAIL: chromium $* failed (exit $?)" >&2
    tail -20 "$tmp/chromium.log" >&2
    exit 1
  }
}
