#!/usr/bin/env bash
# The Python package as a wheel for a machine without Rust (issue 17):
#
#   1. `pip wheel ./python -w dist` (here dist = target/wheel-check/dist),
#      which needs the Rust toolchain: the mkl_alloc wheel and the wheels it
#      depends on (mkl and its own), a folder to carry to another machine;
#   2. a fresh virtual environment, made and used with no cargo or rustc on
#      the PATH (~/.cargo/bin and any other folder holding them removed), so
#      that pip cannot fall back to building the source;
#   3. there: `pip install --no-index --find-links dist mkl-alloc` (dist/ is
#      all the package needs); then the `test` extra from the index,
#      `import mkl_alloc` from that environment, an MKLMemory round trip
#      through NumPy, DLPack and pickle, and pytest on python/tests.
#
#   bash scripts/python-wheel-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out="$root/target/wheel-check"
rm -rf "$out"
mkdir -p "$out"

phase() { printf -- '-- %s (%ss)\n' "$1" "$SECONDS"; }
phase "pip wheel ./python -w dist"
python3 -m pip wheel ./python -w "$out/dist"
wheels=("$out"/dist/mkl_alloc-*.whl)
[ ${#wheels[@]} -eq 1 ] && [ -f "${wheels[0]}" ] || { echo "expected one mkl_alloc wheel in $out/dist" >&2; exit 1; }
wheel=${wheels[0]}
echo "wheel: $(basename "$wheel") ($(du -k "$wheel" | cut -f1) KiB)"

# PATH without the Rust toolchain.
norust=""
IFS=: read -r -a dirs <<<"$PATH"
for d in "${dirs[@]}"; do
  [ -n "$d" ] || continue
  if [ -e "$d/cargo" ] || [ -e "$d/rustc" ] || [ "$d" = "$HOME/.cargo/bin" ]; then
    continue
  fi
  norust="${norust:+$norust:}$d"
done

(
  export PATH="$norust"
  unset CARGO_HOME RUSTUP_HOME RUSTUP_TOOLCHAIN
  if command -v cargo >/dev/null || command -v rustc >/dev/null; then
    echo "a Rust toolchain is still on the PATH: $(command -v cargo rustc)" >&2
    exit 1
  fi
  phase "fresh venv, no Rust on the PATH: pip install --no-index --find-links dist mkl-alloc"
  python3 -m venv "$out/venv"
  "$out/venv/bin/pip" install --quiet --no-index --find-links "$out/dist" mkl-alloc
  cd "$out"
  phase "the run-time install alone (no NumPy): import, memoryview, realloc, pickle"
  "$out/venv/bin/python" -c '
import pickle
import mkl_alloc
m = mkl_alloc.MKLMemory(b"round trip", alignment=4096)
with memoryview(m) as v:
    v[:5] = b"ROUND"
m.realloc(4096)
assert m.tobytes()[:10] == b"ROUND trip" and m._pointer % 4096 == 0
assert pickle.loads(pickle.dumps(m)).tobytes() == m.tobytes()
print("ok:", mkl_alloc.mem_stat())'
  phase "the test extra (NumPy, pytest, ...) from the index"
  "$out/venv/bin/pip" install --quiet --find-links "$out/dist" "$wheel[test]"
  phase "import and an MKLMemory round trip"
  "$out/venv/bin/python" - "$out/venv" <<'PY'
import os
import pickle
import sys

import numpy as np

import mkl_alloc
from mkl_alloc import MKLMemory

venv = os.path.realpath(sys.argv[1])
assert os.path.realpath(mkl_alloc.__file__).startswith(venv + os.sep), mkl_alloc.__file__
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
print(f"ok: {mkl_alloc.__file__}, {mkl_alloc.mem_stat()}")
PY
  phase "pytest python/tests (JAX's tests skip: no jax extra here)"
  # CI=true would turn the skipped JAX tests into failures: they run in the
  # main Python step, which installs the jax extra.
  env -u CI "$out/venv/bin/python" -m pytest -q -p no:cacheprovider "$root/python/tests"
)
phase "wheel check: ok"
