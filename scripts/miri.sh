#!/usr/bin/env bash
# The crate's unsafe core under Miri: the library's unit tests and the
# integration tests that make sense under an interpreter, under Stacked
# Borrows and under Tree Borrows, with strict provenance, Miri's data-race
# detector and leak check on (its defaults).
#
# Miri cannot call MKL: under cfg(miri) `ffi` is served by the emulation in
# src/ffi/miri.rs (MKL's contract over std's System allocator) and the
# build script links nothing.
#
# Usage: scripts/miri.sh [stacked|tree ...]   (default: both models)
#
# Needs a nightly toolchain; installs its miri component where missing and
# says why it skips where there is no nightly. Tests run at small scale
# (MKL_ALLOC_TEST_SCALE=small) and proptest with few cases (PROPTEST_CASES,
# default 4): Miri interprets every instruction, about 1000 times slower.
#
# Under Miri the thread races, growth loops and collection tests run
# fewer rounds (`cfg!(miri)` in the tests; the same checks). Not run under
# Miri, and why:
# - alloc_alignment: a matrix over 21 alignments x 45 sizes x 8 operations
#   filling and checking 12 MiB of patterns: hours under Miri. The same
#   guarantees (alignment kept by allocate, grow, shrink, realloc) are
#   checked here by alloc_bad_layouts, split_allocator and
#   shared_vec's alignment tests.
# - alloc_model: proptest sequences over blocks up to 1 MiB checked against
#   a 1 MiB pattern, minutes per case under Miri; the fuzz target alloc_ops
#   runs the same kind of sequences natively (scripts/fuzz.sh).
# - binding: compares addresses of MKL's Fortran symbols (no MKL here).
# - fast_mm, huge_pages: child processes, /proc, madvise.
# - manager's peak_stays_some...: re-runs its binary as a child process
#   (`#[cfg_attr(miri, ignore)]`).
# - split_global, stress, stress_threads_global, shared_vec_stress: block
#   counts of a whole process, or timed stress (the release stress step).
# - loom_shared_vec: loom's own model checker (the loom step).
set -euo pipefail
cd "$(dirname "$0")/.."

# `miri.sh [--full] [stacked|tree]...`: CI runs the quick selection below
# (38 tests per model, about a minute each on 2 cores); --full runs every
# binary of the list further down (102 tests, too slow for CI: `manager`
# alone ran past 6 minutes under Miri here, so its run time is not known).
full=0
if [ "${1:-}" = "--full" ]; then full=1; shift; fi
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(stacked tree)

if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "miri: no nightly toolchain here (Miri exists only on nightly); skipped"
  exit 0
fi
if ! cargo +nightly miri --version >/dev/null 2>&1; then
  echo "miri: installing the miri component of the nightly toolchain"
  rustup component add miri --toolchain nightly
fi
cargo +nightly miri setup

export MKL_ALLOC_TEST_SCALE=small
export PROPTEST_CASES="${PROPTEST_CASES:-4}"
# proptest would read and write failure files next to the sources; Miri's isolation
# forbids the file system anyway.
export PROPTEST_DISABLE_FAILURE_PERSISTENCE=true

if [ "$full" = 1 ]; then
  tests=(
    shared_vec shared_vec_edges shared_vec_export shared_vec_model
    alloc_bad_layouts allocator_api2_04 manager split_allocator
    global_std alloc_threads alloc_collections
  )
else
  # The unit tests (allocator, block cache classes, env parser, RawBuf,
  # c_heap, the emulation itself), bad layouts, collections on both
  # allocators, and SharedMklVec's exports (raw-pointer writers, exact
  # resizes racing exporters): each binary well under a minute.
  tests=(alloc_bad_layouts alloc_collections shared_vec_export)
fi
# Tests skipped by name (substring), each with its reason: none today.
skips=()

test_args=(--lib)
for t in "${tests[@]}"; do test_args+=(--test "$t"); done
skip_args=()
for s in "${skips[@]}"; do skip_args+=(--skip "$s"); done

# -Zmiri-isolation-error=hide: a test that reads /proc (the machine's memory)
# gets an error, as where /proc does not exist, and takes its fallback.
base="-Zmiri-strict-provenance -Zmiri-isolation-error=hide -Zmiri-env-forward=MKL_ALLOC_TEST_SCALE -Zmiri-env-forward=PROPTEST_CASES -Zmiri-env-forward=PROPTEST_DISABLE_FAILURE_PERSISTENCE"
log_dir=target/miri-logs
mkdir -p "$log_dir"
summary=()
for model in "${models[@]}"; do
  case "$model" in
    stacked) flags="$base" ;;
    tree) flags="$base -Zmiri-tree-borrows" ;;
    *) echo "miri: unknown model $model (stacked or tree)" >&2; exit 2 ;;
  esac
  echo "== Miri, $model borrows: ${tests[*]} and the unit tests"
  start=$(date +%s)
  MIRIFLAGS="$flags" cargo +nightly miri test --no-fail-fast --features serde,bytemuck,allocator-api2-04 \
    "${test_args[@]}" -- "${skip_args[@]}" 2>&1 | tee "$log_dir/$model.log"
  passed=$(grep -o '^test result: ok. [0-9]* passed' "$log_dir/$model.log" | grep -o '[0-9]* passed' | awk '{s+=$1} END {print s+0}')
  summary+=("$model borrows: $passed tests passed in $(( $(date +%s) - start ))s")
done
printf 'miri: %s\n' "${summary[@]}"
