# The sanitizers' run-time options for ./build-san, sourced by scripts/sanitize.sh and
# scripts/fuzz-explore.sh: leaks detected (with scripts/sanitize.supp's suppressions, each with
# its reason), the first error aborts with a stack.
supp=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/sanitize.supp
asan="detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=0"
export ASAN_OPTIONS=$asan
export LSAN_OPTIONS="suppressions=$supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
