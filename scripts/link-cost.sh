#!/usr/bin/env bash
# Link cost per MKL link mode: the wall time and peak memory (the largest
# process: the linker) of relinking a downstream integration-test binary,
# and of a doctest run (rustdoc links every doctest as its own program),
# beside the same crate without mkl-alloc. Interleaved rounds, shuffled
# order; prints medians and ratios to "without". Usage:
#   bash scripts/link-cost.sh [rounds]        # default 3
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
rounds=${1:-3}
export CARGO_TARGET_DIR="$root/target/link-cost"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
variants=(without default mkl-dynamic-lp64-seq mkl-rt)

for v in "${variants[@]}"; do
  c="$tmp/lc-$v"; mkdir -p "$c/src" "$c/tests"
  case $v in
    without) dep="" ; use="std::alloc::System" ;;
    default) dep="mkl-alloc = { path = \"$root\" }" ; use="mkl_alloc::MklAllocator" ;;
    *) dep="mkl-alloc = { path = \"$root\", default-features = false, features = [\"$v\"] }" ; use="mkl_alloc::MklAllocator" ;;
  esac
  printf '[package]\nname = "lc-%s"\nversion = "0.0.0"\nedition = "2021"\npublish = false\n\n[dependencies]\n%s\n\n[workspace]\n' "$v" "$dep" >"$c/Cargo.toml"
  cat >"$c/src/lib.rs" <<RS
//! A crate whose buffers come from one allocator.
use std::alloc::{GlobalAlloc, Layout};

/// Sums \`n\` ones held in a block of this crate's allocator.
///
/// \`\`\`
/// assert_eq!(lc::ones(1000), 1000.0);
/// \`\`\`
///
/// \`\`\`
/// assert_eq!(lc::ones(1), 1.0);
/// \`\`\`
pub fn ones(n: usize) -> f64 {
    let layout = Layout::array::<f64>(n).unwrap();
    // SAFETY: n > 0 in every caller; the block is written before it is read and freed once.
    unsafe {
        let p = $use.alloc(layout) as *mut f64;
        for i in 0..n { p.add(i).write(1.0); }
        let s = (0..n).map(|i| *p.add(i)).sum();
        $use.dealloc(p as *mut u8, layout);
        s
    }
}
RS
  sed -i "s/lc::/lc_${v//-/_}::/" "$c/src/lib.rs"
  printf '#[test]\nfn t() { assert_eq!(lc_%s::ones(10), 10.0); }\n' "${v//-/_}" >"$c/tests/t.rs"
  (cd "$c" && cargo test --quiet --no-run 2>/dev/null && cargo test --quiet --doc >/dev/null 2>&1) \
    || { echo "warm-up build of $v failed"; (cd "$c" && cargo test --no-run); exit 1; }
done

measure() { # variant what -> "seconds maxrss_kb"
  local c="$tmp/lc-$1" out="$tmp/time"
  if [ "$2" = link ]; then
    touch "$c/tests/t.rs"
    (cd "$c" && /usr/bin/time -o "$out" -f "%e %M" cargo test --quiet --no-run --test t >/dev/null 2>&1)
  else
    (cd "$c" && /usr/bin/time -o "$out" -f "%e %M" cargo test --quiet --doc >/dev/null 2>&1)
  fi
  cat "$out"
}

declare -A samples
for ((r = 1; r <= rounds; r++)); do
  for v in $(printf '%s\n' "${variants[@]}" | shuf); do
    for what in link doc; do
      samples[$v.$what]+="$(measure "$v" "$what");"
    done
  done
done

median() { tr ';' '\n' | sed '/^$/d' | awk -v col="$1" '{print $col}' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo "| Mode | relink a test binary | peak memory | doctest run (2 doctests) | peak memory |"
echo "|---|---:|---:|---:|---:|"
base_lt=$(echo "${samples[without.link]}" | median 1); base_dt=$(echo "${samples[without.doc]}" | median 1)
for v in "${variants[@]}"; do
  lt=$(echo "${samples[$v.link]}" | median 1); lm=$(echo "${samples[$v.link]}" | median 2)
  dt=$(echo "${samples[$v.doc]}" | median 1); dm=$(echo "${samples[$v.doc]}" | median 2)
  awk -v v="$v" -v lt="$lt" -v lm="$lm" -v dt="$dt" -v dm="$dm" -v bl="$base_lt" -v bd="$base_dt" \
    'BEGIN { printf "| %s | %.2f s (%.1fx) | %d MiB | %.2f s (%.1fx) | %d MiB |\n", v, lt, lt / bl, lm / 1024, dt, dt / bd, dm / 1024 }'
done
