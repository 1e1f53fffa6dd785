#!/usr/bin/env bash
# NumPy's own test suite with every array on MKL memory (issue 14).
#
# Runs NumPy's numpy._core test modules twice in the given environment:
# once with the mkl_alloc NEP 49 handler installed for the whole session
# (python/tests/numpy_suite/plugin.py, which also fails the run if the
# handler is no longer in force at the end), once on NumPy's default
# handler; then fails if the handler run has any failure or error the
# baseline run does not have, or if the handler run ran fewer tests.
#
#   bash scripts/numpy-suite.sh [PYTHON]     (default: target/ci-venv/bin/python)
#
# The environment needs mkl_alloc installed (pip install ./python); NumPy's
# tests need hypothesis, installed here if missing. About 3.5 minutes per
# run on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${1:-target/ci-venv/bin/python}"
# Absolute (the runs start in another folder), without resolving the venv's symlink.
PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"
"$PY" -c "import hypothesis" 2>/dev/null || "$PY" -m pip install -q hypothesis
NUMPY_DIR="$("$PY" -c 'import numpy, os; print(os.path.dirname(numpy.__file__))')"
MODULES=(test_multiarray test_numeric test_ufunc test_indexing test_shape_base test_item_selection)
FILES=()
for m in "${MODULES[@]}"; do FILES+=("$NUMPY_DIR/_core/tests/$m.py"); done

OUT="target/numpy-suite"
rm -rf "$OUT"
mkdir -p "$OUT"

run() { # run NAME on|off
  echo "-- NumPy suite, handler $2"
  local rc=0
  # From $OUT, so that the source tree's python/ is not imported instead of
  # the installed package. --rootdir: NumPy's own conftest.py (markers,
  # hypothesis profile) is loaded from its tree; "not slow" as numpy.test().
  (cd "$OUT" && MKL_ALLOC_SUITE_HANDLER="$2" PYTHONPATH="$OLDPWD/python/tests/numpy_suite" \
    "$PY" -m pytest -p plugin -p no:cacheprovider --rootdir "$NUMPY_DIR" -m "not slow" \
    -q -rfE --junitxml="$1.xml" \
    "${FILES[@]}" > "$1.log" 2>&1) || rc=$?
  tail -n 3 "$OUT/$1.log"
  # 0: all passed, 1: some tests failed (compared below); anything else is a broken run.
  if [ "$rc" -gt 1 ]; then
    echo "NumPy suite ($1) did not run to the end (pytest exit $rc); see $OUT/$1.log" >&2
    exit 1
  fi
}

run handler on
run baseline off
grep -q "mkl_alloc handler check: still in force" "$OUT/handler.log" || {
  echo "the handler was not in force at the end of the handler run; see $OUT/handler.log" >&2
  exit 1
}

"$PY" - "$OUT/handler.xml" "$OUT/baseline.xml" <<'PY'
import sys
import xml.etree.ElementTree as ET

def results(path):
    bad, ran = set(), 0
    for case in ET.parse(path).iter("testcase"):
        ran += 1
        name = f"{case.get('classname')}::{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            bad.add(name)
        elif case.find("skipped") is not None:
            ran -= 1
    return bad, ran

(h_bad, h_ran), (b_bad, b_ran) = results(sys.argv[1]), results(sys.argv[2])
new = sorted(h_bad - b_bad)
print(f"handler run: {h_ran} tests run, {len(h_bad)} failed; baseline: {b_ran} run, {len(b_bad)} failed")
if new:
    print("failures only under the mkl_alloc handler:", *new, sep="\n  ")
    sys.exit(1)
if h_ran < b_ran:
    print(f"the handler run ran fewer tests ({h_ran}) than the baseline ({b_ran})")
    sys.exit(1)
print("no new failure under the mkl_alloc handler")
PY
