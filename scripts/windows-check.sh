#!/usr/bin/env bash
# The crate on Windows x86-64, cross-built here and tested under wine
# (issue 28): `cargo test --target x86_64-pc-windows-gnu` in the mkl-rt mode
# (mkl_rt.3.dll from the pinned win_amd64 wheels, provisioned by the build
# script like the Linux ones), every test binary and doctest run by wine
# through scripts/windows/runner.sh.
#
# Installs what it needs: the Rust target (rustup), the mingw-w64 toolchain
# and wine from Debian (apt-get), and the test-only bcryptprimitives.dll
# that wine 8.0 lacks, built here from scripts/windows/bcryptprimitives.c.
# Also checks that a static mode is refused on the GNU target with a
# message that says what to use instead, and that the build script itself
# compiles for a Windows host and runs there (under wine): offline on the
# cache, making its folder of links; and with a part missing, taking that
# part's lock (LockFileEx) before its fetch is tried.
#
# The backing beneath MKL runs here as on Linux: MKL's DLLs take the
# crate's hooks through the libimalloc.dll that the build writes into its
# folder of links (build/imalloc.rs), on the test binaries' PATH (and told
# to the runner for the doctests).
#
# Skips, each with its reason in the source, all reported as `ignored`:
# Linux-only tests (/proc's RSS and smaps, THP advice, RLIMIT_AS, a faked
# cgroup limit: seven) are ignored off Linux; the tests that ask for 2^45 bytes or more (four) are ignored under wine
# (`--cfg mkl_alloc_wine`, set here for the target only): wine reserves such
# sizes where Windows refuses them, and the system then kills the process.
# Whole test files that are Unix-only (fork_stress: no fork on Windows;
# build_locks: the build script's flock and /proc code) are cfg'd out. The
# examples (Linux measurement programs: getrusage, /proc) are not built.
#
# Usage: scripts/windows-check.sh [extra cargo test arguments]
# Environment: WINEPREFIX (default target/windows-check/wineprefix).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
triple=x86_64-pc-windows-gnu

step() { printf -- '-- %s (%s)\n' "$1" "$(date +%T)"; }

. scripts/windows/toolchain.sh

work="$PWD/target/windows-check"
dlls="$work/dlls"
mkdir -p "$dlls"
step "the wine-only test DLL bcryptprimitives.dll (ProcessPrng over BCryptGenRandom)"
x86_64-w64-mingw32-gcc -shared -O2 -o "$dlls/bcryptprimitives.dll" \
  scripts/windows/bcryptprimitives.c scripts/windows/bcryptprimitives.def -lbcrypt

export WINEPREFIX="${WINEPREFIX:-$work/wineprefix}"
export WINEDEBUG=-all
# The build script's cache (build/cache.rs), whose windows/ folder holds
# MKL's DLLs: doctests get no library path from cargo, so the runner is told.
mkl_version=$(sed -n 's/^pub const MKL_VERSION: &str = "\(.*\)";$/\1/p' build/pins.rs)
cache="${MKL_ALLOC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mkl-alloc/$mkl_version}"
export MKL_ALLOC_WINE_DLLS="$dlls:$cache/windows"
export CARGO_TARGET_X86_64_PC_WINDOWS_GNU_RUSTFLAGS="--cfg mkl_alloc_wine"
export CARGO_TARGET_X86_64_PC_WINDOWS_GNU_LINKER=x86_64-w64-mingw32-gcc
export CARGO_TARGET_X86_64_PC_WINDOWS_GNU_RUNNER="$PWD/scripts/windows/runner.sh"
if [ ! -d "$WINEPREFIX" ]; then
  step "a wine prefix in $WINEPREFIX"
  wineboot --init </dev/null >/dev/null 2>&1 || true
  wineserver -w || true
fi

# With intel-mkl-src's build script overridden (docs/linking.md), its
# build-dependencies are not built: the refusal is this crate's alone.
step "a static mode is refused on the GNU target"
if cargo check --target "$triple" --lib \
    --config "target.$triple.mkl_core.provided-by=\"mkl-alloc\"" >"$work/static.log" 2>&1; then
  echo "FAIL: the default static mode built for $triple"; exit 1
fi
grep -q "not available for the GNU Windows target" "$work/static.log" \
  || { echo "FAIL: the refusal lacks its message:"; cat "$work/static.log"; exit 1; }
echo "ok: refused with its message"

features=(--no-default-features --features mkl-rt,serde,bytemuck)
step "cargo test --target $triple ${features[*]} --tests (under wine)"
cargo test --target "$triple" "${features[@]}" --tests --no-fail-fast "$@" 2>&1 | tee "$work/test.log"
step "the doctests, under wine"
# The tests' folder of links (the same features build the same one): its
# libimalloc.dll puts the doctests' MKL on the backing too.
# Cargo's target folder, as cargo itself resolves it: target/, or the
# caller's CARGO_TARGET_DIR (or a config's build.target-dir).
target_dir=$(cargo metadata --no-deps --format-version 1 \
  | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
links=$(ls -td "$target_dir/$triple"/debug/build/mkl-alloc-*/out/mkl-lib | head -1)
export MKL_ALLOC_WINE_DLLS="$MKL_ALLOC_WINE_DLLS:$links"
cargo test --target "$triple" "${features[@]}" --doc "$@" 2>&1 | tee "$work/doctest.log"

# The build script as a Windows program (after the tests, whose build
# filled the cache): build/main.rs with the root
# Cargo.toml's build-dependencies, in a package of its own.
step "the build script on a Windows host (compiled for $triple, run under wine)"
bs="$work/build-script"
mkdir -p "$bs/out"
cat >"$bs/Cargo.toml" <<EOF
[package]
name = "mkl-alloc-build-script"
version = "0.0.0"
edition = "2024"
rust-version = "1.85"
publish = false

[[bin]]
name = "build-script"
path = "$PWD/build/main.rs"

[dependencies]
intel-mkl-tool = { version = "0.8", default-features = false }

[target.'cfg(unix)'.dependencies]
libc = "0.2"

[target.'cfg(windows)'.dependencies]
windows-sys = { version = "0.61", features = ["Win32_Storage_FileSystem", "Win32_System_IO"] }

[workspace]
EOF
cp Cargo.lock "$bs/Cargo.lock"
cargo build --quiet --manifest-path "$bs/Cargo.toml" --target "$triple" --target-dir "$bs/target"
exe="$bs/target/$triple/debug/build-script.exe"
win() { printf 'Z:%s' "$(printf '%s' "$1" | tr '/' '\\')"; }
run_build_script() { # the cache folder, then extra environment
  local c=$1; shift
  rm -rf "${bs:?}/out" && mkdir "$bs/out"
  env OUT_DIR="$(win "$bs/out")" MKL_ALLOC_CACHE="$(win "$c")" CARGO_FEATURE_MKL_RT=1 \
    CARGO_CFG_TARGET_OS=windows CARGO_CFG_TARGET_ENV=gnu RUSTC=false "$@" \
    scripts/windows/runner.sh "$exe"
}
run_build_script "$cache" MKL_ALLOC_NO_DOWNLOAD=1 >"$bs/run.log" || true
if ! grep -qx 'cargo:rustc-link-lib=dylib=mkl_rt.3' "$bs/run.log" || [ ! -s "$bs/out/mkl-lib/mkl_rt.3.dll" ]; then
  echo "FAIL: the build script under wine did not link mkl_rt.3:"; cat "$bs/run.log"; exit 1
fi
echo "ok: offline on the cache; mkl_rt.3.dll in its folder of links (link count $(stat -c %h "$bs/out/mkl-lib/mkl_rt.3.dll"))"
# A copy of the cache (hard links) with one part's stamp removed.
rm -rf "${bs:?}/cache" && cp -al "$cache" "$bs/cache" && rm "$bs/cache/windows/.complete-libiomp5md.dll"
run_build_script "$bs/cache" PYTHON=no-such-python >"$bs/fetch.log" || true
if ! grep -q 'cannot run `no-such-python -m pip`' "$bs/fetch.log" || [ ! -e "$bs/cache/windows/.lock-libiomp5md.dll" ]; then
  echo "FAIL: the missing part was not locked and fetched:"; cat "$bs/fetch.log"; exit 1
fi
echo "ok: a missing part is locked, then fetched (here the fetch fails: no pip under wine)"
rm -rf "${bs:?}/cache"

wineserver -k 2>/dev/null || true
echo "windows-check: passed in $(( $(date +%s) - start )) s"
