#!/usr/bin/env bash
# The split allocator's cost over its small side, in instructions: each
# whole-program workload binary (examples/workload_*.rs) run once under
# valgrind's callgrind, which counts the instructions executed (user space
# only). The count is the same run after run for the same binary and
# input, whatever else the machine is doing, where the CPU time of the
# service workload spreads 0.70-1.27 from round to round on a shared
# 2-core VM (docs/performance.md): it tells a 2 % change that timing
# cannot. What it does not see: the kernel's work (page faults, system
# calls) and the cost of each instruction (cache misses), so the numeric
# and mixed workloads stay with `cargo run --release --example perf --
# workload`.
#
# Usage: scripts/instructions.sh [entries] [kind]
#   entries: the service workload's size (default 100000: ~600 million
#   instructions, 20-40 s per binary under callgrind); kind: service
#   (default), numeric or mixed.
#
# Prints one row per allocator (instructions) and the ratios of each split
# to its small side alone.
set -euo pipefail
cd "$(dirname "$0")/.."

entries="${1:-100000}"
kind="${2:-service}"
if ! command -v valgrind >/dev/null; then
  echo "instructions.sh: needs valgrind (Debian: apt-get install valgrind)" >&2
  exit 2
fi

pairs=(system:split mimalloc:split_mimalloc jemalloc:split_jemalloc)
examples=()
for p in "${pairs[@]}"; do
  examples+=(--example "workload_${p%%:*}" --example "workload_${p##*:}")
done
cargo build --release --quiet "${examples[@]}"
dir="${CARGO_TARGET_DIR:-target}/release/examples"

count() {
  valgrind --tool=callgrind --callgrind-out-file=/dev/null "$dir/workload_$1" \
    "$entries" "$kind" 2>&1 >/dev/null |
    sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}

printf '%-16s %15s   %-16s %15s   %s\n' alone instructions split instructions ratio
for p in "${pairs[@]}"; do
  a="${p%%:*}" s="${p##*:}"
  na=$(count "$a")
  ns=$(count "$s")
  if [ -z "$na" ] || [ -z "$ns" ]; then
    echo "instructions.sh: no count from callgrind for workload_$a or workload_$s" >&2
    exit 1
  fi
  printf '%-16s %15s   %-16s %15s   %s\n' "$a" "$na" "$s" "$ns" \
    "$(awk -v a="$na" -v s="$ns" 'BEGIN { printf "%.3f", s / a }')"
done
