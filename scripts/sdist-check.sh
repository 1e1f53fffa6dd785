#!/usr/bin/env bash
# The Python package's sdist (issue 23): what a user without a matching
# wheel installs (another CPython, free-threaded CPython, another glibc), so
# it must build by itself on a machine with Rust:
#
#   1. `maturin sdist` (the tool venv of scripts/python-tools.sh) into
#      target/sdist-check/dist: python/ plus the root crate's files as
#      `cargo package` lists them (Cargo.toml's `include`) and Cargo.lock;
#   2. its contents checked: the files the build needs (both manifests,
#      the lock, both build scripts, the crates' sources, pyproject, the
#      Python sources), the licences and READMEs; none of the fuzz corpus,
#      benches, examples, Rust tests, scripts or CI;
#   3. a fresh venv (the Python given, default python3) and there `pip
#      install 'mkl_alloc-V.tar.gz[test]'`: pip builds the sdist in its
#      isolated environment (maturin, the `mkl` and `mkl-include` wheels),
#      as a user's pip does; the crate's manifest must parse there without
#      the files the sdist leaves out;
#   4. a smoke test: mkl_alloc from the venv, on the venv's libmkl_rt, the
#      version and the PyPI description (python/README.md) right; then
#      pytest python/tests.
#
#   bash scripts/sdist-check.sh [--python PYTHON]
#
# CARGO_TARGET_DIR is target/sdist-check-cargo, so that a second local run
# does not compile everything again; in CI it starts empty, as a user's does.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
python=python3
while [ $# -gt 0 ]; do
  case "$1" in
    --python) [ $# -ge 2 ] || { echo "--python needs a value" >&2; exit 2; }; python=$2; shift 2 ;;
    *) echo "usage: $0 [--python PYTHON]" >&2; exit 2 ;;
  esac
done
out="$root/target/sdist-check"
rm -rf "$out"
mkdir -p "$out"
phase() { printf -- '-- %s (%ss)\n' "$1" "$SECONDS"; }

# shellcheck source=python-tools.sh
. scripts/python-tools.sh
python_tools

version=$(cargo metadata --no-deps --format-version 1 | "$tools/bin/python" -c '
import json, sys
v = {p["name"]: p["version"] for p in json.load(sys.stdin)["packages"]}
assert v["mkl-alloc"] == v["mkl-alloc-python"], v
print(v["mkl-alloc"])')

phase "maturin sdist"
"$tools/bin/maturin" sdist -m python/Cargo.toml -o "$out/dist"
sdist="$out/dist/mkl_alloc-$version.tar.gz"
[ -f "$sdist" ] || { echo "expected $sdist; got: $(ls "$out/dist")" >&2; exit 1; }

phase "contents of $(basename "$sdist")"
"$tools/bin/python" - "$sdist" "$version" <<'PY'
import sys
import tarfile

sdist, version = sys.argv[1], sys.argv[2]
top = f"mkl_alloc-{version}/"
with tarfile.open(sdist) as t:
    names = {m.name[len(top):] for m in t.getmembers() if m.isfile()}
need = {
    "PKG-INFO", "pyproject.toml", "Cargo.toml", "Cargo.lock", "README.md",
    "LICENSE-MIT", "LICENSE-APACHE", "src/lib.rs",
    "python/Cargo.toml", "python/build.rs", "python/src/lib.rs", "python/README.md",
    "mkl_alloc/__init__.py", "mkl_alloc/_native.pyi", "mkl_alloc/py.typed",
}
missing = need - names
# The root build script: build.rs today, build/main.rs once it is split.
if "build.rs" not in names and "build/main.rs" not in names:
    missing.add("build.rs or build/main.rs")
assert not missing, f"missing from the sdist: {sorted(missing)}"
unwanted = [
    n for n in names
    if n.split("/")[0] in {"fuzz", "benches", "examples", "tests", "loom_tests", "scripts", ".ci", "target", ".cargo"}
]
assert not unwanted, f"not meant for the sdist: {unwanted[:10]}"
rust = sorted(n for n in names if n.endswith(".rs"))
print(f"  {len(names)} files, {len(rust)} Rust sources; {sdist}")
PY

phase "fresh venv ($python): pip install '$(basename "$sdist")[test]' (builds the extension)"
"$python" -m venv "$out/venv"
"$out/venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
start=$SECONDS
CARGO_TARGET_DIR="$root/target/sdist-check-cargo" nice -n 10 \
  "$out/venv/bin/python" -m pip install --disable-pip-version-check "$sdist[test]"
build_time=$((SECONDS - start))

phase "smoke test: the installed package, its MKL and its metadata"
cd "$out"
"$out/venv/bin/python" - "$out/venv" "$version" <<'PY'
import importlib.metadata as md
import os
import sys

import numpy as np

import mkl_alloc
from mkl_alloc import MKLMemory

venv, version = os.path.realpath(sys.argv[1]), sys.argv[2]
assert os.path.realpath(mkl_alloc.__file__).startswith(venv + os.sep), mkl_alloc.__file__
meta = md.metadata("mkl-alloc")
assert meta["Version"] == version, meta["Version"]
# The PyPI page is python/README.md, not the Rust crate's README.
description = meta.get_payload() or meta.get("Description", "")
assert description.lstrip().startswith("# mkl-alloc (Python)"), description[:80]
m = MKLMemory(8 * 1000, alignment=4096)
a = np.frombuffer(m, dtype=np.float64)
a[:] = np.arange(1000.0)
assert a.ctypes.data == m._pointer and m._pointer % 4096 == 0
del a
m.realloc(16 * 1000)
assert np.from_dlpack(m).view(np.float64)[:1000].sum() == 999 * 1000 / 2
with open("/proc/self/maps") as maps:
    rt = {line.split()[-1] for line in maps if "libmkl_rt.so" in line}
assert rt == {os.path.join(venv, "lib", "libmkl_rt.so.3")}, rt
print(f"ok: mkl-alloc {meta['Version']}, {os.path.basename(mkl_alloc._native.__file__)}, {rt.pop()}")
PY

phase "pytest python/tests (JAX's tests skip: no jax extra here)"
# CI=true would turn the skipped JAX tests into failures (see .ci/run).
# At the small scale, as the wheels' runs (scripts/python-wheels.sh).
env -u CI MKL_ALLOC_TEST_SCALE="${MKL_ALLOC_TEST_SCALE:-small}" \
  "$out/venv/bin/python" -m pytest -q -p no:cacheprovider "$root/python/tests"
echo "sdist: $(basename "$sdist") ($(du -k "$sdist" | cut -f1) KiB), pip install built it in ${build_time}s"
phase "sdist check: ok"
