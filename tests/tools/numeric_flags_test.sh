#!/usr/bin/env bash
# Every numeric flag of every command, read from the command's own --help (type INT, UINT,
# FLOAT or a range), given zero, a negative, a huge and a non-finite value (floats also 1e30 and
# inf). Each answer must be a
# clear error naming the flag (exit 2) or an answer (exit 0): never a crash, a hang, exit 1 or an
# error that does not name the flag. Negative, non-finite and out-of-int values are errors;
# --gpus 0 is an error (it used to print an estimate).
# Usage: numeric_flags_test.sh PARASOL_BIN
set -uo pipefail
bin=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0 tried=0
job="--model llama3-8b --cluster dgx-h100 --gpus 8"
declare -A base=(
  [show]="plan $job --tp 2" [validate]="$job" [estimate]="$job" [simulate]="$job"
  [search]="$job --top 2" [report]="-o $tmp/r.html $job" [export]="--to megatron $job"
  [run]="$job" [calibrate]="$job" [accuracy]="" [compare]="")
# Subcommands whose valid values would start long work (training, a probe), or that need input
# files to answer (compare --measured): only the values that must be refused are tried, and the
# plan flags they share with estimate (tried there, read by the same code) not again.
declare -A refuse_only=([run]=1 [calibrate]=1 [compare]=1)

flags_of() {  # the numeric options of a subcommand's --help: "--name TYPE"
  "$bin" "$1" --help 2>/dev/null |
    grep -oE '^ +(-[a-zA-Z], ?)?--[A-Za-z0-9-]+ (INT|UINT|FLOAT|DOUBLE|NUMBER|POSITIVE|NONNEGATIVE)[^ ]*' |
    sed -E 's/^ +(-[a-zA-Z], ?)?//' | awk '{print $1, $2}'
}

named() {  # whether the output names the flag (--shard-degree or plan.shard_degree)
  local flag=${1#--} out=$2
  grep -qiF -- "$flag" <<<"$out" || grep -qiF -- "${flag//-/_}" <<<"$out"
}

# estimate first: the plan flags every command shares (tools/spec.cc add_plan_flags, read by
# plan_from_json) are tried there; run and calibrate, slow to start, try only their own flags.
declare -A seen=()
for sub in estimate show validate simulate search report export accuracy compare run calibrate; do
  while read -r flag type; do
    [[ -z $flag ]] && continue
    [[ -n ${refuse_only[$sub]:-} && -n ${seen[$flag]:-} ]] && continue
    seen[$flag]=1
    values=(0 -1 99999999999 nan)
    [[ $type == FLOAT* ]] && values+=(1e30 inf)
    for v in "${values[@]}"; do
      [[ $v == 0 && -n ${refuse_only[$sub]:-} ]] && continue
      [[ ($v == 1e30 || $v == 99999999999) && $type == FLOAT* && -n ${refuse_only[$sub]:-} ]] &&
        continue
      tried=$((tried + 1))
      # shellcheck disable=SC2086
      out=$(timeout 60 "$bin" "$sub" ${base[$sub]} "$flag" "$v" 2>&1 </dev/null)
      rc=$?
      must_refuse=0
      case $v in -*|nan|inf) must_refuse=1 ;; esac
      [[ $v == 99999999999 && $type == INT* ]] && must_refuse=1  # UINT (seeds) may be large
      [[ $v == 0 && $flag == --gpus ]] && must_refuse=1
      why=""
      if ((rc != 0 && rc != 2)); then why="exit $rc"
      elif ((must_refuse && rc != 2)); then why="accepted (exit $rc), must be refused"
      elif ((rc == 2)) && ! named "$flag" "$out"; then why="error does not name the flag"
      fi
      if [[ -n $why ]]; then
        echo "FAIL $sub $flag $v: $why"; echo "$out" | tail -3 | sed 's/^/     /'; fails=$((fails + 1))
      fi
    done
  done < <(flags_of "$sub")
done
echo "numeric flags: $tried cases, $fails failed"
((tried > 200)) || { echo "FAIL: too few numeric flags found in --help ($tried cases)"; exit 1; }
((fails == 0))
