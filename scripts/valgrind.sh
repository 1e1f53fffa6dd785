#!/usr/bin/env bash
# Runs the crate's test binaries under valgrind's memcheck, with MKL's fast
# memory manager off (MKL_DISABLE_FAST_MM=1) so that every MKL block is a
# plain heap block valgrind can see, and the tests at small scale
# (MKL_ALLOC_TEST_SCALE=small, PROPTEST_CASES=32 unless set).
#
# Usage: scripts/valgrind.sh [test-target ...]
#   With no argument: every test binary `cargo test` builds (the library's
#   unit tests and each tests/*.rs), except the stress suite (stress*) and
#   loom tests. Doctests are not binaries and are not run.
#   With arguments: only those test targets (e.g. `global_std alloc_model`).
#
# Environment: VALGRIND_TIMEOUT (seconds per binary, default 600; a binary
# that runs longer fails as TIMEOUT), VALGRIND_SKIP (extra regex of target
# names to skip).
#
# Pass: 0 errors and 0 definitely-lost bytes in every binary, and every
# test passes.
#
# Forked children: a child inherits the parent's memory but not its other
# threads, so whatever those threads hold is "definitely lost" in the child
# by construction; a leak verdict there means nothing. Children therefore
# stay out of the log (--child-silent-after-fork) and leaks are no errors
# (--errors-for-leak-kinds=none): a child still exits 1 on a real memory
# error (invalid access, uninitialised use), which fails the test that
# checks its status, and the parent's leaks are judged from its own LEAK
# SUMMARY (the log's last, since the parent reaps its children first). Logs: $CARGO_TARGET_DIR/valgrind/ (default target/valgrind/).
set -euo pipefail
cd "$(dirname "$0")/.."

command -v valgrind >/dev/null || { echo "valgrind.sh: valgrind is not installed" >&2; exit 2; }

target_dir="${CARGO_TARGET_DIR:-target}"
log_dir="$target_dir/valgrind"
mkdir -p "$log_dir"
skip_re='^(stress.*|loom.*)$'
extra_skip="${VALGRIND_SKIP:-}"
timeout_s="${VALGRIND_TIMEOUT:-600}"
t_start=$(date +%s)

cargo_args=(test --no-run --message-format=json)
if [ "$#" -gt 0 ]; then
  for t in "$@"; do cargo_args+=(--test "$t"); done
fi

echo "== building test binaries: cargo ${cargo_args[*]}"
# name<TAB>executable for every test-profile artifact (lib unit tests and tests/*.rs).
mapfile -t bins < <(cargo "${cargo_args[@]}" | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    if not m["profile"]["test"]:
        continue  # examples and the like: built, never run by cargo test
    kinds = m["target"]["kind"]
    if not ({"lib", "test", "bin"} & set(kinds)):
        continue
    print(m["target"]["name"] + "\t" + m["executable"])
')

if [ "${#bins[@]}" -eq 0 ]; then
  echo "valgrind.sh: no test binaries found" >&2
  exit 2
fi

# The bad-layout tests ask MKL for sizes near isize::MAX on purpose; MKL
# passes them on to malloc, which valgrind reports as a "fishy" (negative
# looking) argument. Those reports, and only those, are suppressed when
# they come through MKL's allocation entry points. The second suppression
# is mimalloc's (a dev-dependency: the split over mimalloc is tested): at
# start-up it reads /sys/kernel/mm/transparent_hugepage/enabled into a
# 32-byte stack buffer and searches all 32 bytes, past the ~23 that read()
# filled (libmimalloc-sys 0.1.49, v3 src/prim/unix/prim.c,
# unix_detect_thp); it stays within the buffer and decides nothing of ours.
supp="$log_dir/suppressions.supp"
cat >"$supp" <<'SUPP'
{
   mkl-huge-request-malloc
   Memcheck:FishyValue
   malloc(size)
   fun:malloc
   fun:mm_internal_*
}
{
   mimalloc-detect-thp-reads-its-buffer-past-what-read-returned
   Memcheck:Cond
   fun:_mi_strnlen
   fun:_mi_strnstr
   fun:unix_detect_thp
}
SUPP

export MKL_DISABLE_FAST_MM=1
# Medium blocks on (the default), unless MKL_ALLOC_MEDIUM is set: the crate
# tells memcheck about them (src/backing/valgrind.rs), each a heap block
# while live and inaccessible once freed, as is the region where no block
# is, so that memcheck checks MKL's 4 KiB-1 MiB blocks on the crate's own
# memory, and its leak search at exit skips the region's gigabytes.
export MKL_ALLOC_MEDIUM="${MKL_ALLOC_MEDIUM:-on}"
# A forked child under memcheck beside other work (CI runs valgrind beside
# the Python steps) has taken more than the tests' 20 s.
export MKL_ALLOC_FORK_DEADLINE_MS=90000
export MKL_ALLOC_TEST_SCALE=small
export PROPTEST_CASES="${PROPTEST_CASES:-32}"
export RUST_BACKTRACE=0

failed=0
rows=()
for entry in "${bins[@]}"; do
  name="${entry%%$'\t'*}"
  exe="${entry#*$'\t'}"
  if [[ "$name" =~ $skip_re ]] || { [ -n "$extra_skip" ] && [[ "$name" =~ $extra_skip ]]; }; then
    rows+=("$(printf '%-28s %-8s %8s %14s %8s' "$name" skipped - - -)")
    continue
  fi
  vg_log="$log_dir/$name.valgrind.log"
  out_log="$log_dir/$name.out.log"
  t0=$(date +%s)
  set +e
  timeout --kill-after=10 "$timeout_s" \
    valgrind --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=none \
    --child-silent-after-fork=yes \
    --suppressions="$supp" \
    --log-file="$vg_log" "$exe" >"$out_log" 2>&1
  rc=$?
  set -e
  secs=$(( $(date +%s) - t0 ))
  errors=$(sed -n 's/.*ERROR SUMMARY: \([0-9,]*\) errors.*/\1/p' "$vg_log" | tail -1 | tr -d ,)
  lost=$(sed -n 's/.*definitely lost: \([0-9,]*\) bytes.*/\1/p' "$vg_log" | tail -1 | tr -d ,)
  errors="${errors:-?}"
  lost="${lost:-0}"
  if [ "$rc" -eq 0 ] && [ "$errors" = "0" ] && [ "$lost" = "0" ]; then
    status=ok
  else
    status=FAILED
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then status=TIMEOUT; fi
    failed=$((failed + 1))
    echo "-- $name: exit $rc, $errors errors, $lost bytes definitely lost; see $vg_log and $out_log" >&2
    tail -n 30 "$vg_log" >&2 || true
  fi
  rows+=("$(printf '%-28s %-8s %8s %14s %7ss' "$name" "$status" "$errors" "$lost" "$secs")")
done

total=$(( $(date +%s) - t_start ))
echo
echo "== valgrind summary (MKL_DISABLE_FAST_MM=1, MKL_ALLOC_TEST_SCALE=small, PROPTEST_CASES=$PROPTEST_CASES)"
printf '%-28s %-8s %8s %14s %8s\n' binary status errors "def. lost (B)" time
for r in "${rows[@]}"; do echo "$r"; done
echo "total wall time: ${total}s; failed binaries: $failed; logs in $log_dir"
[ "$failed" -eq 0 ]
