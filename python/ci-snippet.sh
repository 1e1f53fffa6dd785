# For .ci/run (the lead splices this in; it uses .ci/run's `step` helper and
# runs from the repository root). The README's two Python commands, in a
# fresh virtual environment, with the threads test at its CI length (CI=true:
# at least 10 s).

step "Python package: fresh venv, pip install ./python, pytest python/tests"
rm -rf target/ci-venv
python3 -m venv target/ci-venv
target/ci-venv/bin/pip install ./python
CI=true target/ci-venv/bin/python -m pytest python/tests

# The extension crate is not a default member (its mkl-rt link and the root's
# default static link exclude each other in one cargo invocation): check it on
# its own, against the venv's interpreter and its `mkl` wheel.
step "clippy: the Python extension (mkl-rt)"
PYO3_PYTHON="$PWD/target/ci-venv/bin/python" PYTHON="$PWD/target/ci-venv/bin/python" \
  cargo clippy -p mkl-alloc-python --all-targets -- -D warnings
