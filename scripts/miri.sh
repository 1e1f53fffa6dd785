#!/usr/bin/env bash
# The crate's unsafe core under Miri: the library's unit tests and the
# integration tests that make sense under an interpreter, under Stacked
# Borrows and under Tree Borrows, with strict provenance, Miri's data-race
# detector and leak check on (its defaults).
#
# Miri cannot call MKL: under cfg(miri) `ffi` is served by the emulation in
# src/ffi/miri/ (MKL's contract over std's System allocator) and the
# build script links nothing. The emulation takes large blocks (1 MiB and
# more with MKL's overhead) through MKL's memory pointers, as MKL does, so
# the backing beneath MKL (its hooks, chunk registry and block cache) runs
# under Miri too, on chunks that are never resized in place.
#
# Usage: scripts/miri.sh [--full] [stacked|tree ...]   (default: both models;
# one build in target/miri, then two lanes side by side: the models' runs
# in the default mode, and their mode runs; output in
# target/miri-logs/MODEL.log, printed at the end)
#
# Then each model runs the tests that resize blocks (SharedMklVec's growth
# and shrinks, collections, the C heap's realloc, tests/miri_modes.rs and
# the emulation's own tests) once more in a mode of the emulation
# (MKL_ALLOC_MIRI_MODE, see src/ffi/miri/mode.rs), which walks branches the
# default never takes; output in target/miri-logs/MODEL-MODE.log:
# - in-place, under Stacked Borrows: MKL_realloc resizes in place where the
#   block has room (every shrink; growth into room the emulation keeps
#   behind each block), as MKL does for a shrink and a small growth: the
#   crate's "resized in place" branches (RawBuf's growth keeping its pointer
#   and MKL's count). Stacked Borrows because there the pointer handed out
#   covers the block's current size only, so an overrun into the room is
#   still reported; Tree Borrows would not see it.
# - misaligned-realloc, under Stacked Borrows, only the tests that resize
#   blocks aligned above 64: MKL_realloc moves every block to an address
#   aligned to exactly 64, breaking MKL's contract on purpose, so that
#   raw_realloc's realign path (src/allocator.rs) runs.
# - exact-align, under Tree Borrows: every block at an address aligned to
#   exactly its alignment (never to twice it), moved blocks too, so that
#   nothing works by accidental extra alignment.
# With --full, each model runs every mode.
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
# - heap_size: pins MKL's own accounting of a block (size, alignment, a
#   24-byte header), which the emulation does not model (it counts the
#   bytes asked for).
# - fast_mm, huge_pages: child processes, /proc, madvise; likewise
#   block_cache's environment-variable, cgroup, out-of-memory, idle and
#   huge-page tests (ignored under Miri), and its decay through MKL's small
#   frees (the emulation's small blocks never reach the hooks).
# - manager's peak_stays_some...: re-runs its binary as a child process
#   (`#[cfg_attr(miri, ignore)]`).
# - split_global, stress, stress_threads_global, shared_vec_stress: block
#   counts of a whole process, or timed stress (the release stress step).
# - loom_*: loom's own model checker (the loom step).
set -euo pipefail
cd "$(dirname "$0")/.."

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

# CI's selection: the library's unit tests (allocator, block cache
# classes, env parser, RawBuf, c_heap, the emulation itself), bad layouts,
# collections on both allocators, SharedMklVec (views racing resizes,
# exports through raw pointers, serde, edges), the split allocator, the
# C heap under NumPy's handler, allocator-api2 0.4, and resizes in place or
# moved (miri_modes). Their blocks of 1 MiB and more already pass through
# MKL's pointers into the backing (hooks, chunk table, block cache).
tests=(
  alloc_bad_layouts alloc_collections shared_vec shared_vec_edges shared_vec_export
  split_allocator c_heap allocator_api2_04 miri_modes
)
if [ "$full" = 1 ]; then
  # Beyond CI's budget: the global allocator binary, threads handing blocks
  # around, the manager's statistics, shrinks, the proptest model, and the
  # block cache's own tests (their many chunk-sized blocks took 15-25
  # minutes per model under Miri on the 2-core machine).
  tests+=(global_std alloc_threads manager shrink_returns_memory shared_vec_model block_cache)
fi
# Tests skipped by name (substring), each with its reason: none today.
skips=()

test_args=(--lib)
for t in "${tests[@]}"; do test_args+=(--test "$t"); done
skip_args=()
for s in "${skips[@]}"; do skip_args+=(--skip "$s"); done

# The modes' selection (whole test binaries, besides the library's tests),
# and misaligned-realloc's filters within it (test names with these).
mode_tests=(shared_vec shared_vec_edges alloc_collections c_heap miri_modes)
mode_args=(--lib)
for t in "${mode_tests[@]}"; do mode_args+=(--test "$t"); done
misaligned_filters=(ffi::miri backing::miri_tests alignment realloc grow_and_shrink)

# -Zmiri-isolation-error=hide: a test that reads /proc (the machine's memory)
# gets an error, as where /proc does not exist, and takes its fallback.
# Miri's isolation hides the host's environment: each variable the tests
# read is forwarded by name. MKL_ALLOC_MIRI_MODE is set by run_model only:
# the main runs are in the default mode whatever the caller's environment.
unset MKL_ALLOC_MIRI_MODE
base="-Zmiri-strict-provenance -Zmiri-isolation-error=hide -Zmiri-env-forward=MKL_ALLOC_TEST_SCALE -Zmiri-env-forward=PROPTEST_CASES -Zmiri-env-forward=PROPTEST_DISABLE_FAILURE_PERSISTENCE -Zmiri-env-forward=MKL_ALLOC_MIRI_MODE"
log_dir=target/miri-logs
mkdir -p "$log_dir"

# The modes each model runs after its main run (see the top).
modes_of() {
  if [ "$full" = 1 ]; then
    echo in-place misaligned-realloc exact-align
  else
    case "$1" in
      stacked) echo in-place misaligned-realloc ;;
      tree) echo exact-align ;;
    esac
  fi
}

# One run of `cargo miri test` under a model, its output in
# target/miri-logs/NAME.log, its duration in NAME.seconds and its exit
# status in NAME.status. Every run shares one build (target/miri): Miri
# reads MIRIFLAGS and MKL_ALLOC_MIRI_MODE when it interprets, not when it
# builds, and cargo holds no lock while tests run, so two runs side by side
# share it.
run_tests() {
  local model=$1 name=$2 flags
  shift 2
  case "$model" in
    stacked) flags="$base" ;;
    tree) flags="$base -Zmiri-tree-borrows" ;;
  esac
  local start=$SECONDS status=0
  # Each line stamped with the seconds since the start (a test's line
  # appears when it finishes): where the time goes.
  MIRIFLAGS="$flags" CARGO_TARGET_DIR=target/miri \
    cargo +nightly miri test --no-fail-fast --features serde,bytemuck \
    "$@" 2>&1 |
    while IFS= read -r line; do printf '%4d %s\n' $((SECONDS - start)) "$line"; done \
      >"$log_dir/$name.log" || status=$?
  echo "$((SECONDS - start))" >"$log_dir/$name.seconds"
  echo "$status" >"$log_dir/$name.status"
  return "$status"
}

# The tests of a model's default-mode run. Without --full, Tree Borrows'
# default run leaves out the binaries its exact-align run takes (the same
# tests, the same branches, with blocks at tighter addresses and moved on
# every resize): those run under Tree Borrows once, in that mode.
default_args_of() {
  if [ "$full" = 1 ] || [ "$1" != tree ]; then
    echo "${test_args[@]}"
    return
  fi
  local t
  for t in "${tests[@]}"; do
    [[ " ${mode_tests[*]} " == *" $t "* ]] || printf -- '--test %s ' "$t"
  done
}

# One mode run of a model.
run_mode() {
  local model=$1 mode=$2 filters=()
  [ "$mode" != misaligned-realloc ] || filters=("${misaligned_filters[@]}")
  MKL_ALLOC_MIRI_MODE=$mode run_tests "$model" "$model-$mode" "${mode_args[@]}" -- \
    "${filters[@]}" "${skip_args[@]}"
}

# Lane one: the runs in the default mode, one per model, then (without
# --full) the short misaligned-realloc run, which balances the lanes.
run_defaults() {
  local model status=0
  for model in "${models[@]}"; do
    # shellcheck disable=SC2046 # default_args_of prints words on purpose
    run_tests "$model" "$model" $(default_args_of "$model") -- "${skip_args[@]}" || status=1
  done
  if [ "$full" = 0 ] && [[ " ${models[*]} " == *" stacked "* ]]; then
    run_mode stacked misaligned-realloc || status=1
  fi
  return "$status"
}

# Lane two: the other mode runs of every model, one after the other.
run_modes() {
  local model mode status=0
  for model in "${models[@]}"; do
    for mode in $(modes_of "$model"); do
      [ "$full" = 1 ] || [ "$mode" != misaligned-realloc ] || continue
      run_mode "$model" "$mode" || status=1
    done
  done
  return "$status"
}

for model in "${models[@]}"; do
  case "$model" in
    stacked | tree) ;;
    *) echo "miri: unknown model $model (stacked or tree)" >&2; exit 2 ;;
  esac
done
echo "== Miri (${models[*]} borrows): ${tests[*]} and the unit tests;"
echo "   then in the emulation's modes: ${mode_tests[*]} and the unit tests"
echo "   (misaligned-realloc: those named ${misaligned_filters[*]})"

# One build for every run, on both cores (each run is one thread of Miri).
# Built apart per model, the two builds took 4 of CI's 16 Miri minutes.
start=$SECONDS
if ! CARGO_TARGET_DIR=target/miri cargo +nightly miri test --no-run \
  --features serde,bytemuck "${test_args[@]}" >"$log_dir/build.log" 2>&1; then
  cat "$log_dir/build.log"
  echo "miri: the build failed" >&2
  exit 1
fi
echo "-- built in $((SECONDS - start))s ($log_dir/build.log)"

# Then two lanes side by side: the default-mode runs in one, the mode runs
# in the other (in CI about 12 and 11 minutes: the balance this split gives).
run_defaults &
defaults_pid=$!
run_modes &
modes_pid=$!
failed=()
wait "$defaults_pid" || failed+=("the default mode")
wait "$modes_pid" || failed+=("the emulation's modes")

summary=()
for model in "${models[@]}"; do
  for mode in default $(modes_of "$model"); do
    name=$model
    [ "$mode" = default ] || name="$model-$mode"
    log="$log_dir/$name.log"
    echo "-- $model borrows, $mode mode ($log)"
    # A failed run in full; otherwise each binary's result line.
    if [ "$(cat "$log_dir/$name.status")" != 0 ]; then
      cat "$log"
    else
      grep -aE '^ *[0-9]+ +(Running|test result)' "$log"
    fi
    passed=$(grep -ao 'test result: ok. [0-9]* passed' "$log" | grep -o '[0-9]* passed' | awk '{s+=$1} END {print s+0}')
    summary+=("$model borrows, $mode mode: $passed tests passed in $(cat "$log_dir/$name.seconds")s")
  done
done
printf 'miri: %s\n' "${summary[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "miri: failed in ${failed[*]}" >&2
  exit 1
fi
