#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/ for SECONDS each (default 60) and
# fails on any crash, leak, sanitizer report or timeout (libFuzzer exits
# non-zero and leaves the input in fuzz/artifacts/<target>/).
#
# Usage: scripts/fuzz.sh [SECONDS] [target ...]
#   Targets (fuzz/fuzz_targets/): shared_vec_ops, serde_de, alloc_ops,
#   medium_ops.
#
# Needs a nightly toolchain (libFuzzer and AddressSanitizer flags): where
# none is installed the script says so and skips. Installs cargo-fuzz
# (`cargo install cargo-fuzz --locked`) where it is missing. The fuzz targets
# link the real MKL (the default static mode, through the build script).
#
# Corpus: the committed seeds in fuzz/seeds/<target>/ are read; what the run
# discovers goes to target/fuzz-corpus/<target>/ (kept between runs, never
# committed). Each target's executions are printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-60}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(shared_vec_ops serde_de alloc_ops medium_ops)

if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "fuzz: no nightly toolchain here (cargo-fuzz needs nightly for -Zsanitizer and libFuzzer); skipped"
  exit 0
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz: installing cargo-fuzz"
  cargo install cargo-fuzz --locked
fi

root=$PWD
corpus_root="$root/target/fuzz-corpus"
log_dir="$root/target/fuzz-logs"
mkdir -p "$log_dir"

start=$(date +%s)
# One build of every target (release, debug assertions, AddressSanitizer).
(cd fuzz && cargo +nightly fuzz build -O --debug-assertions)
echo "fuzz: built in $(( $(date +%s) - start ))s"

# LeakSanitizer stays on, less one report explained in fuzz/lsan.supp (MKL's
# per-thread account, referenced only from a medium block of the crate's
# region, which LeakSanitizer does not scan).
export LSAN_OPTIONS="suppressions=$PWD/fuzz/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"

# The targets run side by side (libFuzzer is one thread each; on CI's two
# cores four targets take 60 s of wall time instead of 240, each with
# about half a core), then each log is read.
pids=()
for t in "${targets[@]}"; do
  mkdir -p "$corpus_root/$t"
  echo "== fuzz $t for ${seconds}s"
  # -rss_limit_mb: the allocator target asks for blocks of up to 1 MiB at
  # alignments up to 16 MiB; 4 GiB leaves room without hiding a leak.
  (cd fuzz && exec cargo +nightly fuzz run -O --debug-assertions "$t" \
      "$corpus_root/$t" "seeds/$t" -- \
      -max_total_time="$seconds" -rss_limit_mb=4096 -timeout=30 -print_final_stats=1) \
      >"$log_dir/$t.log" 2>&1 &
  pids+=($!)
done
summary=()
failed=0
for i in "${!targets[@]}"; do
  t=${targets[$i]}
  if ! wait "${pids[$i]}"; then
    tail -n 60 "$log_dir/$t.log"
    echo "fuzz: $t FAILED (log: $log_dir/$t.log, input: fuzz/artifacts/$t/)" >&2
    failed=1
    continue
  fi
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log_dir/$t.log" | grep -o '[0-9]*$' || echo '?')
  summary+=("$t: $runs executions in ${seconds}s, no crash")
done
[ "$failed" -eq 0 ] || exit 1
printf 'fuzz: %s\n' "${summary[@]}"
echo "fuzz: total $(( $(date +%s) - start ))s"
