#!/usr/bin/env bash
# Builds and runs a small downstream crate per MKL link mode, each depending
# on this checkout by path, in a temporary folder (issue: every MKL setup).
# Each run checks MKL memory, a cblas_dgemm on MklAllocator buffers against a
# naive product, and prints the MKL libraries it loaded (ldd for dynamic ones).
#
#   bash scripts/downstream-check.sh                 # the four CI modes
#   bash scripts/downstream-check.sh mkl-static-ilp64-seq mkl-dynamic-ilp64-iomp
#
# Modes share one target folder (target/downstream) so dependencies build once.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
export CARGO_TARGET_DIR="$root/target/downstream"
modes=("$@")
[ ${#modes[@]} -gt 0 ] || modes=(default mkl-static-lp64-iomp mkl-dynamic-lp64-seq mkl-rt)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
unset LD_LIBRARY_PATH
passed=0 failed=0

for mode in "${modes[@]}"; do
  crate="$tmp/ds-$mode"
  mkdir -p "$crate/src"
  cp scripts/downstream/main.rs "$crate/src/main.rs"
  if [ "$mode" = default ]; then
    dep="mkl-alloc = { path = \"$root\" }"
  else
    dep="mkl-alloc = { path = \"$root\", default-features = false, features = [\"$mode\"] }"
  fi
  extra=""
  case "$mode" in
    # A graph that also asks intel-mkl-src for the same configuration, as
    # ndarray-linalg's intel-mkl features do.
    mkl-static-lp64-iomp) extra="intel-mkl-src = { version = \"0.8\", default-features = false, features = [\"$mode\"] }" ;;
  esac
  cat >"$crate/Cargo.toml" <<TOML
[package]
name = "ds-$mode"
version = "0.0.0"
edition = "2024"
publish = false

[dependencies]
$dep
$extra
allocator-api2 = { version = "0.2", default-features = false, features = ["alloc"] }

[lints.rust]
unexpected_cfgs = { level = "allow" }

[workspace]
TOML
  # A downstream build script that gives the binary an rpath to the library
  # folder mkl-alloc reports, so the dynamic modes also run outside cargo.
  cat >"$crate/build.rs" <<'RS'
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_MKL_ALLOC_LIB_DIR");
    if let Ok(dir) = std::env::var("DEP_MKL_ALLOC_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
    if std::env::var("CARGO_MANIFEST_DIR").unwrap().contains("ilp64") {
        println!("cargo:rustc-cfg=ilp64");
    }
}
RS
  echo "== $mode"
  log="$tmp/$mode.log"
  if ! (cd "$crate" && DOWNSTREAM_MODE=$mode cargo build --release --quiet) >"$log" 2>&1; then
    cat "$log"; echo "FAIL: $mode: the downstream crate does not build"; failed=$((failed+1)); continue
  fi
  bin="$CARGO_TARGET_DIR/release/ds-$mode"
  ok=true
  # Through cargo (its library path), then the binary alone (its rpath only).
  (cd "$crate" && DOWNSTREAM_MODE=$mode cargo run --release --quiet) || ok=false
  "$bin" >"$log" 2>&1 || { cat "$log"; echo "(run directly, no LD_LIBRARY_PATH)"; ok=false; }
  case "$mode" in
    default|mkl-static-*) ;;
    *) ldd "$bin" | grep -E 'mkl|iomp' | sed 's/^/  ldd: /'
       if ldd "$bin" | grep -q 'not found'; then echo "FAIL: $mode: ldd finds a library missing"; ok=false; fi ;;
  esac
  if $ok; then passed=$((passed+1)); else echo "FAIL: $mode"; failed=$((failed+1)); fi
done
echo "downstream: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
