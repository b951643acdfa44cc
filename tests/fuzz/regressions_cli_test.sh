#!/usr/bin/env bash
# Every input a fuzzer found (tests/fuzz/regressions/<target>/*) given to the command that reads
# that kind of file, as a user would: it must exit 2 with an `error:` line (the field and the
# reason), never 0, 1 (an internal error: parasol's bug), a signal or a hang.
# Usage: regressions_cli_test.sh PARASOL REGRESSIONS_FOLDER
set -uo pipefail
parasol=$1 regressions=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0 checked=0
for dir in "$regressions"/*/; do
  target=$(basename "$dir")
  for f in "$dir"*; do
    [ -f "$f" ] || continue
    case $target in
      accuracy_suite) cmd=("$parasol" accuracy "$f") ;;
      model_json | hf_config) cmd=("$parasol" show model "$f") ;;
      cluster_json) cmd=("$parasol" show cluster "$f") ;;
      plan_json) cmd=("$parasol" validate --model tiny-moe --cluster dgx-h100 --gpus 8 --plan "$f") ;;
      trace_json) cmd=("$parasol" compare "$f" "$f") ;;
      profile_json) cmd=("$parasol" estimate --model tiny --cluster dgx-h100 --gpus 8 --profile "$f") ;;
      checkpoint_manifest)
        # Laid out as the fuzz target lays it: the root's `latest` and a step's manifest.
        rm -rf "$tmp/ckpt" && mkdir -p "$tmp/ckpt/step-1"
        cp "$f" "$tmp/ckpt/latest" && cp "$f" "$tmp/ckpt/step-1/manifest.json"
        cmd=("$parasol" run --model tiny --steps 1 --resume "$tmp/ckpt") ;;
      token_file) cmd=("$parasol" run --model tiny --steps 1 --data "$f") ;;
      kineto_json) cmd=("$parasol" trace import "$f") ;;
      plan_import)
        # Named as the fuzz target names it: a file `plan` (a launcher's config is found beside it).
        rm -rf "$tmp/import" && mkdir -p "$tmp/import" && cp "$f" "$tmp/import/plan"
        cmd=("$parasol" estimate --model tiny --cluster dgx-h100 --gpus 8 --plan "$tmp/import/plan") ;;
      *)
        echo "FAIL: $f: no command reads regressions of target '$target' (add it here)"
        failed=$((failed + 1))
        continue ;;
    esac
    checked=$((checked + 1))
    timeout 120 "${cmd[@]}" >"$tmp/out" 2>"$tmp/err" </dev/null
    rc=$?
    if [ "$rc" -ne 2 ] || ! grep -aq '^error: ' "$tmp/err"; then
      echo "FAIL: $target/$(basename "$f"): exit $rc (want 2 and an 'error:' line): ${cmd[*]}"
      head -c 600 "$tmp/err"
      failed=$((failed + 1))
    else
      echo "ok: $target/$(basename "$f"): $(grep -a -m1 '^error: ' "$tmp/err" | cut -c1-160)"
    fi
  done
done
echo "$checked regression inputs through the command line, $failed failed"
[ "$checked" -gt 0 ] && [ "$failed" -eq 0 ]
