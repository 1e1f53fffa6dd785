#!/usr/bin/env bash
# The Python package's wheels for publishing (issue 23), built, audited and
# tested as a user without Rust gets them:
#
#   bash scripts/python-wheels.sh OUTDIR [--pythons "3.10 3.13"]
#   bash scripts/python-wheels.sh OUTDIR --windows
#
# --windows (issue 28): the win_amd64 wheel instead, cp311-abi3-win_amd64,
# cross-built here for x86_64-pc-windows-gnu (the target and mingw-w64's
# gcc must be installed: scripts/windows-python-check.sh installs them).
# PyO3 0.30 links python3.dll with raw-dylib (its `generate-import-lib`
# feature is deprecated and no longer needed), so no Windows Python is
# needed to build; maturin builds the abi3 wheel from its own sysconfig.
# The extension links the `mkl` wheel's mkl_rt.3.dll, which it finds at run
# time in the environment's Library\bin (mkl_alloc/__init__.py adds the
# folder with os.add_dll_directory). The wheel is audited (its name, one
# .pyd, no MKL DLL inside, the DLLs the .pyd imports: python3.dll, not a
# version's python3XY.dll, mkl_rt.3.dll and Windows' own) and put into
# OUTDIR; scripts/windows-python-check.sh installs and tests it under wine.
#
# Wheels (two cover CPython 3.10 and later):
#   - cp310-cp310: CPython 3.10, version-specific. pyo3 has the buffer
#     protocol in the limited API only from 3.11 on (MKLMemory exports
#     through it), so 3.10 cannot share the stable-ABI wheel;
#   - cp311-abi3: CPython 3.11, 3.12, 3.13 and later (with the GIL), built
#     once against the stable ABI (python/Cargo.toml's `abi3` feature).
#     Free-threaded CPython has no stable ABI before 3.15: it installs the
#     sdist, which builds for it.
# Why abi3 rather than a wheel per version: the extension compiles
# unchanged against the limited API, two builds replace four, the two
# Pythons CI tests (3.10, 3.13) then build and test every wheel that is
# published, and later CPythons (3.14) install it as they come.
# Both are manylinux2014 (glibc 2.17, x86-64), linked with zig (the
# `ziglang` package) against glibc 2.17's symbols; this machine's own glibc
# would make them manylinux_2_34. The extension's one library outside that
# policy is libmkl_rt.so.3, deliberately: it comes from the `mkl` wheel, a
# dependency, through the extension's RUNPATH ($ORIGIN/../../.., the
# environment's lib/; python/build.rs), so that NumPy, mkl-service and
# mkl_alloc share one MKL and one memory manager. Bundling a copy would
# make a second MKL in the process, so it is neither bundled nor allowed to
# fail the build (maturin's `--auditwheel warn`, which still fails on a
# glibc symbol newer than the tag); the audit below checks that it is the
# only such library.
#
# Steps:
#   1. a tool venv, target/python-wheels/tools: maturin, ziglang and
#      auditwheel from the package index, at pinned versions
#      (scripts/python-tools.sh, shared with scripts/sdist-check.sh);
#   2. the wheels, for the Pythons asked for (default: 3.10 3.11 3.12 3.13;
#      3.11+ share the abi3 wheel, built with the oldest of them asked for);
#   3. each wheel audited: its tags, auditwheel's glibc policy
#      (manylinux_2_17) and external libraries (libmkl_rt.so.3 alone), its
#      RUNPATH, and its version against Cargo's;
#   4. each Python asked for: a fresh venv made and used with no cargo or
#      rustc on the PATH (pip cannot fall back to building the source);
#      the wheel alone (no NumPy) imported and used, with libmkl_rt loaded
#      from the venv's `mkl` wheel; then the `test` extra, an MKLMemory
#      round trip through NumPy, DLPack and pickle, and pytest python/tests;
#   5. only then the wheels into OUTDIR (previous mkl_alloc wheels there
#      removed): OUTDIR holds exactly what to publish.
#
# Interpreters: pyenv's (`$PYENV_ROOT/versions/3.X.*`) or `python3.X` on the
# PATH. Builds run under `nice` (shared machines). CI builds and tests the
# oldest and the newest (3.10 and 3.13): both wheels, built and tested.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

usage() { echo "usage: $0 OUTDIR [--pythons \"3.10 3.11 3.12 3.13\" | --windows]" >&2; exit 2; }
outdir=""
windows=""
pythons="3.10 3.11 3.12 3.13"
while [ $# -gt 0 ]; do
  case "$1" in
    --pythons) [ $# -ge 2 ] || usage; pythons=${2//,/ }; shift 2 ;;
    --pythons=*) pythons=${1#--pythons=}; pythons=${pythons//,/ }; shift ;;
    --windows) windows=1; shift ;;
    -h|--help) usage ;;
    -*) echo "unknown option: $1" >&2; usage ;;
    *) [ -z "$outdir" ] || usage; outdir=$1; shift ;;
  esac
done
[ -n "$outdir" ] || usage
mkdir -p "$outdir"
outdir=$(cd "$outdir" && pwd)

work="$root/target/python-wheels"
stage="$work/stage"
phase() { printf -- '-- %s (%ss)\n' "$1" "$SECONDS"; }

# 1. Tools (maturin, ziglang, auditwheel), pinned: scripts/python-tools.sh.
# shellcheck source=python-tools.sh
. scripts/python-tools.sh
python_tools

# Cargo's version is the package's (pyproject's `dynamic`; the workspace's
# version in the root Cargo.toml).
version=$(cargo metadata --no-deps --format-version 1 | python3 -c '
import json, sys
v = {p["name"]: p["version"] for p in json.load(sys.stdin)["packages"]}
assert v["mkl-alloc"] == v["mkl-alloc-python"], v
print(v["mkl-alloc"])')
echo "version: $version (mkl-alloc and mkl-alloc-python)"

if [ -n "$windows" ]; then
  triple=x86_64-pc-windows-gnu
  for tool in x86_64-w64-mingw32-gcc x86_64-w64-mingw32-objdump; do
    command -v "$tool" >/dev/null || { echo "--windows needs $tool (mingw-w64: scripts/windows-python-check.sh installs it)" >&2; exit 1; }
  done
  rustup target list --installed | grep -qx "$triple" \
    || { echo "--windows needs the Rust target $triple (rustup target add $triple)" >&2; exit 1; }
  rm -rf "$stage"
  mkdir -p "$stage/win"
  phase "maturin build: cp311-abi3-win_amd64 ($triple)"
  CARGO_TARGET_X86_64_PC_WINDOWS_GNU_LINKER=x86_64-w64-mingw32-gcc PATH="$tools/bin:$PATH" \
    nice -n 10 "$tools/bin/maturin" build --release -m python/Cargo.toml --target "$triple" \
    --features abi3 -o "$stage/win"
  whl="$stage/win/mkl_alloc-$version-cp311-abi3-win_amd64.whl"
  if [ ! -f "$whl" ] || [ "$(ls "$stage/win" | wc -l)" -ne 1 ]; then
    echo "expected exactly $whl; got: $(ls "$stage/win")" >&2
    exit 1
  fi
  phase "audit $(basename "$whl")"
  rm -rf "$stage/win-unpacked"
  mkdir "$stage/win-unpacked"
  (cd "$stage/win-unpacked" && python3 -m zipfile -e "$whl" .)
  files=$(cd "$stage/win-unpacked" && find . -type f | sort)
  pyds=$(grep -c '\.pyd$' <<<"$files" || true)
  if [ "$pyds" -ne 1 ] || [ ! -f "$stage/win-unpacked/mkl_alloc/_native.pyd" ]; then
    echo "expected one extension, mkl_alloc/_native.pyd; the wheel has: $files" >&2; exit 1
  fi
  if grep -qi '\.dll$' <<<"$files"; then
    echo "a DLL inside the wheel (MKL's come from the mkl wheel): $files" >&2; exit 1
  fi
  imports=$(x86_64-w64-mingw32-objdump -p "$stage/win-unpacked/mkl_alloc/_native.pyd" \
    | sed -n 's/^[[:space:]]*DLL Name: //p' | sort -u)
  # Beyond python3.dll and mkl_rt.3.dll: Windows' own DLLs (the Rust
  # standard library's and the C runtime's, and advapi32 for the large-page
  # privilege's token calls), found on every Windows.
  unexpected=$(grep -viE '^(python3|mkl_rt\.3|kernel32|ntdll|msvcrt|userenv|ws2_32|bcryptprimitives|advapi32|api-ms-win-[a-z0-9-]+)\.dll$' <<<"$imports" || true)
  if [ -n "$unexpected" ] || ! grep -qx 'python3.dll' <<<"$imports" || ! grep -qx 'mkl_rt.3.dll' <<<"$imports"; then
    echo "_native.pyd imports $(tr '\n' ' ' <<<"$imports"): expected python3.dll (abi3), mkl_rt.3.dll and Windows' own DLLs" >&2
    exit 1
  fi
  echo "  mkl_alloc/_native.pyd imports: $(tr '\n' ' ' <<<"$imports")"
  rm -f "$outdir"/mkl_alloc-*win_amd64.whl
  cp "$whl" "$outdir/"
  echo "wheel in $outdir:"
  ls -l "$outdir/$(basename "$whl")"
  phase "python wheels (windows): ok"
  exit 0
fi

# An interpreter for 3.X: pyenv's newest 3.X.* build with the GIL, else
# python3.X from the PATH; checked by asking it its version.
find_python() {
  local want=$1 py cand
  for cand in $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}/versions/$want".* 2>/dev/null | sort -rV); do
    py="$cand/bin/python$want"
    [ -x "$py" ] || continue
    if "$py" -c 'import sys, sysconfig; sys.exit(sysconfig.get_config_var("Py_GIL_DISABLED") == 1)' 2>/dev/null; then
      echo "$py"
      return 0
    fi
  done
  py=$(command -v "python$want" 2>/dev/null) || true
  if [ -n "$py" ] && [ "$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" = "$want" ]; then
    echo "$py"
    return 0
  fi
  echo "no CPython $want found (pyenv or python$want on the PATH)" >&2
  return 1
}

declare -A interp wheel_for
abi3_python=""
for v in $pythons; do
  case "$v" in
    3.10|3.11|3.12|3.13) ;;
    *) echo "unsupported Python $v: 3.10 to 3.13 (3.11+ take the abi3 wheel)" >&2; exit 2 ;;
  esac
  interp[$v]=$(find_python "$v")
  echo "Python $v: ${interp[$v]}"
  if [ "$v" != 3.10 ] && [ -z "$abi3_python" ]; then
    abi3_python=$v
  fi
done

# 2. Build. maturin reads python/pyproject.toml; the options here are what
# a published wheel needs beyond a local build: zig and manylinux2014.
rm -rf "$stage"
mkdir -p "$stage"
build() { # LABEL PYTHON [maturin options]
  local label=$1 py=$2
  shift 2
  phase "maturin build: $label"
  PATH="$tools/bin:$PATH" nice -n 10 "$tools/bin/maturin" build --release \
    -m python/Cargo.toml -i "$py" --zig --compatibility manylinux2014 --auditwheel warn \
    -o "$stage/$label" "$@"
}
if [ -n "${interp[3.10]:-}" ]; then
  build cp310 "${interp[3.10]}"
fi
if [ -n "$abi3_python" ]; then
  build abi3 "${interp[$abi3_python]}" --features abi3
fi

# 3. Audit: name, policy, external libraries, RUNPATH.
declare -A expect=(
  [cp310]="mkl_alloc-$version-cp310-cp310-manylinux2014_x86_64.manylinux_2_17_x86_64.whl"
  [abi3]="mkl_alloc-$version-cp311-abi3-manylinux2014_x86_64.manylinux_2_17_x86_64.whl"
)
for label in cp310 abi3; do
  [ -d "$stage/$label" ] || continue
  whl="$stage/$label/${expect[$label]}"
  if [ ! -f "$whl" ] || [ "$(ls "$stage/$label" | wc -l)" -ne 1 ]; then
    echo "expected exactly $whl; got: $(ls "$stage/$label")" >&2
    exit 1
  fi
  phase "audit $(basename "$whl")"
  "$tools/bin/auditwheel" show --json "$whl" >"$stage/$label.auditwheel.json"
  "$tools/bin/python" - "$whl" "$stage/$label.auditwheel.json" <<'PY'
import io
import json
import sys
import zipfile

from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile

whl, report = sys.argv[1], json.load(open(sys.argv[2]))
# glibc symbol versions: what the tag promises.
assert report["sym_tag"] == "manylinux_2_17_x86_64", report["sym_tag"]
glibc = sorted(
    (v for vs in report["versioned_symbols"].values() for v in vs if v.startswith("GLIBC_")),
    key=lambda v: tuple(int(x) for x in v[6:].split(".")),
)
# Outside the policy: the `mkl` wheel's libmkl_rt, and nothing else.
external = set(report["external_libs"])
assert external == {"libmkl_rt.so.3"}, external
with zipfile.ZipFile(whl) as z:
    sos = [n for n in z.namelist() if n.endswith(".so")]
    assert len(sos) == 1 and sos[0].startswith("mkl_alloc/_native."), sos
    assert not any("libmkl" in n for n in z.namelist()), "an MKL library inside the wheel"
    elf = ELFFile(io.BytesIO(z.read(sos[0])))
    dyn = next(s for s in elf.iter_sections() if isinstance(s, DynamicSection))
    tags = {}
    for t in dyn.iter_tags():
        tags.setdefault(t.entry.d_tag, []).append(t)
    runpath = [t.runpath for t in tags.get("DT_RUNPATH", [])]
    needed = [t.needed for t in tags.get("DT_NEEDED", [])]
# $ORIGIN/../../.. from <prefix>/lib/python3.X/site-packages/mkl_alloc/ is
# <prefix>/lib, where the `mkl` wheel puts libmkl_rt.so.3.
assert runpath == ["$ORIGIN/../../.."], runpath
print(f"  {sos[0]}: NEEDED {', '.join(needed)}; RUNPATH {runpath[0]}")
print(f"  auditwheel: symbols {report['sym_tag']}, newest glibc symbol {glibc[-1]}, "
      f"outside the policy: {', '.join(sorted(external))} (the mkl wheel's, by RUNPATH)")
PY
done

# 4. Test each Python in a fresh venv with no Rust on the PATH.
norust=""
IFS=: read -r -a dirs <<<"$PATH"
for d in "${dirs[@]}"; do
  [ -n "$d" ] || continue
  if [ -e "$d/cargo" ] || [ -e "$d/rustc" ] || [ "$d" = "$HOME/.cargo/bin" ]; then
    continue
  fi
  norust="${norust:+$norust:}$d"
done

results=()
for v in $pythons; do
  if [ "$v" = 3.10 ]; then whl="$stage/cp310/${expect[cp310]}"; else whl="$stage/abi3/${expect[abi3]}"; fi
  venv="$work/venv-$v"
  start=$SECONDS
  (
    export PATH="$norust"
    unset CARGO_HOME RUSTUP_HOME RUSTUP_TOOLCHAIN
    if command -v cargo >/dev/null || command -v rustc >/dev/null; then
      echo "a Rust toolchain is still on the PATH: $(command -v cargo rustc)" >&2
      exit 1
    fi
    phase "Python $v: fresh venv, no Rust on the PATH, pip install $(basename "$whl")"
    rm -rf "$venv"
    "${interp[$v]}" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$whl"
    cd "$work"
    phase "Python $v: the run-time install alone (no NumPy): RUNPATH, import, memoryview, realloc, pickle, one MKL"
    # The extension loaded by the dynamic loader alone, before mkl_alloc's
    # __init__ could load libmkl_rt itself (its fallback for editable
    # installs): only the RUNPATH can find the `mkl` wheel's library here.
    "$venv/bin/python" - <<'PY'
import ctypes
import importlib.metadata as md

so = [f for f in md.files("mkl-alloc") if f.name.startswith("_native.") and f.suffix == ".so"]
assert len(so) == 1, so
ctypes.CDLL(str(so[0].locate()))
print("ok: the dynamic loader resolves libmkl_rt.so.3 through the RUNPATH")
PY
    "$venv/bin/python" - "$venv" <<'PY'
import os
import pickle
import sys

import mkl_alloc

venv = os.path.realpath(sys.argv[1])
assert os.path.realpath(mkl_alloc.__file__).startswith(venv + os.sep), mkl_alloc.__file__
m = mkl_alloc.MKLMemory(b"round trip", alignment=4096)
with memoryview(m) as v:
    v[:5] = b"ROUND"
m.realloc(4096)
assert m.tobytes()[:10] == b"ROUND trip" and m._pointer % 4096 == 0
assert pickle.loads(pickle.dumps(m)).tobytes() == m.tobytes()
# The RUNPATH found the venv's `mkl` wheel, and no other libmkl_rt is loaded.
with open("/proc/self/maps") as maps:
    rt = {line.split()[-1] for line in maps if "libmkl_rt.so" in line}
assert rt == {os.path.join(venv, "lib", "libmkl_rt.so.3")}, rt
print("ok:", os.path.basename(mkl_alloc._native.__file__), "with", rt.pop())
PY
    phase "Python $v: the test extra from the index"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$whl[test]"
    phase "Python $v: an MKLMemory round trip through NumPy, DLPack and pickle"
    "$venv/bin/python" - <<'PY'
import pickle

import numpy as np

import mkl_alloc
from mkl_alloc import MKLMemory

m = MKLMemory(8 * 1000, alignment=4096)
a = np.frombuffer(m, dtype=np.float64)
a[:] = np.arange(1000.0)
assert a.ctypes.data == m._pointer and m._pointer % 4096 == 0 and m.exports == 1
del a
m.realloc(16 * 1000)
d = np.from_dlpack(m)
assert d.ctypes.data == m._pointer
del d
copy = pickle.loads(pickle.dumps(m, protocol=5))
assert copy.tobytes() == m.tobytes() and copy.alignment == 4096
assert np.frombuffer(copy, dtype=np.float64)[:1000].sum() == 999 * 1000 / 2
print(f"ok: NumPy {np.__version__}, {mkl_alloc.mem_stat()}")
PY
    phase "Python $v: pytest python/tests (JAX's tests skip: no jax extra here)"
    # CI=true would turn the skipped JAX tests into failures: they run in
    # the main Python step, which installs the jax extra.
    # The suite at its small scale (fewer forks and stateful examples):
    # the full scale runs once, in .ci/run's main venv.
    env -u CI MKL_ALLOC_TEST_SCALE="${MKL_ALLOC_TEST_SCALE:-small}" \
      "$venv/bin/python" -m pytest -q -p no:cacheprovider "$root/python/tests"
  )
  results+=("Python $v: $(basename "$whl"): tests passed ($((SECONDS - start)) s)")
done

# 5. Publishable wheels only, once every check passed.
rm -f "$outdir"/mkl_alloc-*.whl
for label in cp310 abi3; do
  if [ -d "$stage/$label" ]; then
    cp "$stage/$label/${expect[$label]}" "$outdir/"
  fi
done
printf '%s\n' "${results[@]}"
echo "wheels in $outdir:"
ls -l "$outdir"/mkl_alloc-*.whl
phase "python wheels: ok"
