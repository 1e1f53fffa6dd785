#!/usr/bin/env bash
# The nightly-only integrations, run where a nightly toolchain exists (CI
# skips this when `cargo +nightly` is not installed; nothing requires it).
# Two downstream crates of this checkout (outside it, so that this crate's
# dev-dependencies stay out of the nightly graphs):
# - the `nightly` feature: std's own Vec / Box in MKL memory;
# - a graph where another crate switches on allocator-api2 0.2's `nightly`
#   feature (as hashbrown 0.14's `nightly` does), without ours: still builds.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "nightly: no nightly toolchain here; skipped"
  exit 0
fi
root=$PWD
export CARGO_TARGET_DIR="$root/target/nightly"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

run_crate() {
  local name=$1 deps=$2 main=$3
  mkdir -p "$tmp/$name/src"
  printf '[package]\nname = "%s"\nversion = "0.0.0"\nedition = "2021"\npublish = false\n\n[dependencies]\n%s\n\n[workspace]\n' \
    "$name" "$deps" >"$tmp/$name/Cargo.toml"
  printf '%s\n' "$main" >"$tmp/$name/src/main.rs"
  (cd "$tmp/$name" && cargo +nightly run --quiet)
}

run_crate nightly-feature "mkl-alloc = { path = \"$root\", features = [\"nightly\"] }" '
#![feature(allocator_api)]
use mkl_alloc::{manager, MklAllocator, MklSplitAllocator};
fn main() {
    let before = manager::stats();
    let mut v: Vec<f64, MklAllocator> = Vec::new_in(MklAllocator);
    v.extend((0..100_000).map(f64::from));
    assert_eq!(v.as_ptr() as usize % 64, 0);
    assert_eq!(v[99_999], 99_999.0);
    let during = manager::stats();
    assert!(during.bytes >= before.bytes + 800_000, "{before:?} -> {during:?}");
    let b = Box::new_in([7u8; 100], MklAllocator);
    assert_eq!(b.as_ptr() as usize % 64, 0);
    let mut s: Vec<u8, MklSplitAllocator> = Vec::new_in(MklSplitAllocator);
    s.extend(std::iter::repeat_n(3u8, 10_000)); // grows from System into MKL
    assert_eq!(s.as_ptr() as usize % 64, 0);
    assert!(s.iter().all(|&x| x == 3));
    println!("nightly feature: std Vec and Box in MKL memory: ok");
}'

run_crate nightly-graph "mkl-alloc = { path = \"$root\" }
allocator-api2 = { version = \"0.2\", features = [\"nightly\"] }" '
#![feature(allocator_api)]
use mkl_alloc::MklAllocator;
fn main() {
    // allocator-api2 0.2 with `nightly` re-exports core'"'"'s Allocator, so
    // MklAllocator'"'"'s allocator-api2 implementation is that trait here, and
    // mkl-alloc compiles only because it turns the gate on by itself.
    let mut v: Vec<u64, MklAllocator> = Vec::new_in(MklAllocator);
    v.extend(0..10_000u64);
    let w: allocator_api2::vec::Vec<u64, MklAllocator> = allocator_api2::vec::Vec::new_in(MklAllocator);
    assert_eq!((v[4_321], w.len()), (4_321, 0));
    assert_eq!(v.as_ptr() as usize % 64, 0);
    println!("graph with allocator-api2/nightly switched on elsewhere: ok");
}'
echo "nightly: 2 passed, 0 failed"
