#!/usr/bin/env bash
# Builds and runs a small downstream crate per MKL link mode, each depending
# on this checkout by path, in a temporary folder (issue: every MKL setup).
# Each run checks MKL memory, a cblas_dgemm on MklAllocator buffers against a
# naive product, and prints the MKL libraries it loaded (ldd for dynamic ones).
#
#   bash scripts/downstream-check.sh                 # the four CI modes, then one-mkl
#   bash scripts/downstream-check.sh mkl-static-ilp64-seq mkl-dynamic-ilp64-iomp
#   bash scripts/downstream-check.sh one-mkl         # only the two-MKLs check
#
# one-mkl: a fake MKL 2020.1 (a static libmkl_core.a whose MKL_malloc
# returns NULL) planted where intel-mkl-src's ocipkg fallback finds it
# ($XDG_DATA_HOME/ocipkg/...). The default build must refuse, naming both
# MKLs; with the override the refusal proposes, it must build a program
# whose MKL allocations work. Nothing is downloaded (the folder exists).
#
# Modes share one target folder (target/downstream) so dependencies build once.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
export CARGO_TARGET_DIR="$root/target/downstream"
modes=("$@")
[ ${#modes[@]} -gt 0 ] || modes=(default mkl-static-lp64-iomp mkl-dynamic-lp64-seq mkl-rt one-mkl)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
unset LD_LIBRARY_PATH
passed=0 failed=0

# The two-MKLs check (see the header). Returns non-zero on failure.
one_mkl() {
  local crate="$tmp/ds-one-mkl" xdg="$tmp/xdg"
  mkdir -p "$crate/src"
  cp scripts/downstream/main.rs "$crate/src/main.rs"
  printf '#include <stddef.h>\nvoid *MKL_malloc(size_t size, int align) { (void)size; (void)align; return NULL; }\n' >"$tmp/fake.c"
  cat >"$crate/Cargo.toml" <<TOML
[package]
name = "ds-one-mkl"
version = "0.0.0"
edition = "2024"
publish = false

[dependencies]
mkl-alloc = { path = "$root" }
allocator-api2 = { version = "0.2", default-features = false, features = ["alloc"] }

[lints.rust]
unexpected_cfgs = { level = "allow" }

[workspace]
TOML
  # The image intel-mkl-src 0.8 falls back to, read from its own build script.
  local src image plant
  src=$(cd "$crate" && cargo metadata --quiet --format-version 1 | python3 -c '
import json, sys
m = json.load(sys.stdin)
print(next(p["manifest_path"] for p in m["packages"] if p["name"] == "intel-mkl-src"))')
  image=$(sed -n 's|.*"\([^"]*/rust-mkl/linux/\){}:\([^"]*\)".*|\1mkl-static-lp64-seq/__\2|p' "$(dirname "$src")/build.rs" | head -1)
  [ -n "$image" ] || { echo "FAIL: one-mkl: no Linux ocipkg image in $(dirname "$src")/build.rs"; return 1; }
  plant="$xdg/ocipkg/$image"
  mkdir -p "$plant"
  cc -c -fPIC -o "$tmp/fake.o" "$tmp/fake.c" && ar rcs "$plant/libmkl_core.a" "$tmp/fake.o" || return 1
  local log="$tmp/one-mkl.log"
  # intel-mkl-src's build script must run again to see the plant.
  (cd "$crate" && cargo clean --release --quiet -p intel-mkl-src) || return 1
  if (cd "$crate" && XDG_DATA_HOME="$xdg" DOWNSTREAM_MODE=one-mkl cargo build --release --quiet) >"$log" 2>&1; then
    if grep -rqs -- "$plant" "$CARGO_TARGET_DIR"/release/build/intel-mkl-src-*/output; then
      echo "FAIL: one-mkl: the build succeeded although intel-mkl-src linked the planted MKL 2020.1 beside mkl-alloc's"
    else
      echo "FAIL: one-mkl: the build succeeded and intel-mkl-src did not pick up the plant (test broken?)"
    fi
    return 1
  fi
  for needle in "two MKLs" "$plant" "2026.2.0" "mkl_core]" 'provided-by = "mkl-alloc"' MKLROOT; do
    grep -qF -- "$needle" "$log" || { cat "$log"; echo "FAIL: one-mkl: the refusal lacks '$needle'"; return 1; }
  done
  sed -n '/two MKLs/,/download it again/p' "$log" | sed 's/^/  | /'
  echo "ok: one-mkl: refused, naming both MKLs and the ways out"
  # The first way out: intel-mkl-src's build script overridden.
  local triple
  triple=$(rustc -vV | sed -n 's/^host: //p')
  mkdir -p "$crate/.cargo"
  printf '[target.%s.mkl_core]\nprovided-by = "mkl-alloc"\n' "$triple" >"$crate/.cargo/config.toml"
  if ! (cd "$crate" && XDG_DATA_HOME="$xdg" DOWNSTREAM_MODE=one-mkl cargo run --release --quiet) >"$log" 2>&1; then
    cat "$log"; echo "FAIL: one-mkl: with the override the program does not build or its allocations fail"; return 1
  fi
  cat "$log"
  # Leave intel-mkl-src's next run unaffected by the plant.
  (cd "$crate" && rm -rf .cargo && cargo clean --release --quiet -p intel-mkl-src) || true
}

for mode in "${modes[@]}"; do
  if [ "$mode" = one-mkl ]; then
    echo "== one-mkl"
    if one_mkl; then passed=$((passed+1)); else echo "FAIL: one-mkl"; failed=$((failed+1)); fi
    continue
  fi
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
