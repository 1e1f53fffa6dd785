#!/usr/bin/env bash
# The Python package on the CPythons after 3.13 (issue 34): 3.14 and 3.15,
# as Debian testing builds them, with the abi3 wheel a user installs there.
#
#   bash scripts/python-next-check.sh [--wheel PATH] [--pythons "3.14 3.15"]
#
# No CPython 3.14 or 3.15 can be had on this machine's Debian (bookworm),
# nor from pyenv here; Debian testing ships both. So:
#   1. a Debian testing root, target/python-next/root, made with debootstrap
#      (installed with apt-get if missing; bookworm's debootstrap makes a
#      testing root with its `sid` script), from the mirror this machine's
#      apt sources name. It is kept between local runs (remade when the
#      package list below changes) and made afresh under CI=true;
#   2. the abi3 wheel (cp311-abi3), built from this checkout with maturin
#      unless --wheel names one (CI passes the one scripts/python-wheels.sh
#      built and audited, the wheel that is published);
#   3. for each Python: a fresh venv inside the root, the wheel installed
#      with its `test` extra (and `jax` where jaxlib has a wheel for that
#      Python: 3.14, not 3.15), then `python -m pytest python/tests` from
#      the repository root, as the README says, with CI=true (a missing
#      optional module fails rather than skips). Each run must end with no
#      skipped test beyond those whose dependency has no wheel for that
#      Python (on 3.15: jaxlib for test_jax, mkl-service for its example);
#      any other skip fails the check.
# The root sees /proc, /dev, /sys, the checkout (/repo) and the wheel only
# through bind mounts made inside a private mount namespace (unshare -m):
# they vanish with the namespace when the check ends, whatever happens, so
# nothing stays mounted on the machine.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

usage() { echo "usage: $0 [--wheel PATH] [--pythons \"3.14 3.15\"]" >&2; exit 2; }
wheel=""
pythons="3.14 3.15"
while [ $# -gt 0 ]; do
  case "$1" in
    --wheel) [ $# -ge 2 ] || usage; wheel=$2; shift 2 ;;
    --pythons) [ $# -ge 2 ] || usage; pythons=${2//,/ }; shift 2 ;;
    -h|--help) usage ;;
    *) echo "unknown argument: $1" >&2; usage ;;
  esac
done
for v in $pythons; do
  case "$v" in 3.14|3.15) ;; *) echo "unsupported Python $v here: 3.14 or 3.15 (3.10-3.13: scripts/python-wheels.sh)" >&2; exit 2 ;; esac
done
[ "$(id -u)" = 0 ] || { echo "$0 needs root (debootstrap, chroot, mounts)" >&2; exit 1; }

work="$repo/target/python-next"
root="$work/root"
phase() { printf -- '-- %s (%ss)\n' "$1" "$SECONDS"; }

# 1. The root.
packages="python3.14,python3.14-venv,python3.15,python3.15-venv,ca-certificates"
if [ "${CI:-}" = "true" ] || [ "$(cat "$root/.packages" 2>/dev/null)" != "$packages" ]; then
  command -v debootstrap >/dev/null || {
    phase "apt-get install debootstrap"
    apt-get update -qq && apt-get install -y -qq debootstrap >/dev/null
  }
  # The first URI of this machine's apt sources (deb822 or one-line form).
  mirror=$(sed -n 's/^URIs:[[:space:]]*\([^[:space:]]*\).*/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1)
  [ -n "$mirror" ] || mirror=$(awk '$1 == "deb" { print ($2 ~ /^\[/ ? $3 : $2); exit }' \
    /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null)
  [ -n "$mirror" ] || { echo "no Debian mirror in /etc/apt/sources.list*: debootstrap needs one" >&2; exit 1; }
  phase "debootstrap forky (Debian testing): $packages"
  rm -rf "$root" "$root.new"
  mkdir -p "$work"
  debootstrap --variant=minbase --include="$packages" forky "$root.new" "$mirror" \
    /usr/share/debootstrap/scripts/sid >"$work/debootstrap.log" 2>&1 \
    || { tail -20 "$work/debootstrap.log" >&2; echo "debootstrap failed (log: $work/debootstrap.log)" >&2; exit 1; }
  echo "$packages" >"$root.new/.packages"
  mv "$root.new" "$root"
fi
# What the root needs from this machine to reach the package index as pip
# does here: name resolution, the CA bundle and pip's own settings.
cp -L /etc/resolv.conf "$root/etc/resolv.conf"
[ -f /etc/pip.conf ] && cp /etc/pip.conf "$root/etc/pip.conf"
mkdir -p "$root/etc/ssl/certs"
cp -L /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"

# 2. The wheel.
if [ -z "$wheel" ]; then
  # shellcheck source=python-tools.sh
  . scripts/python-tools.sh
  python_tools
  py311=$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.1[1-3].*/bin/python3 2>/dev/null | sort -V | tail -1)
  [ -n "$py311" ] || py311=$(command -v python3)
  phase "maturin build: cp311-abi3 (with $py311)"
  rm -rf "$work/wheel"
  PATH="$tools/bin:$PATH" nice -n 10 "$tools/bin/maturin" build --release -m python/Cargo.toml \
    -i "$py311" --features abi3 -o "$work/wheel"
  wheel=$(ls "$work"/wheel/mkl_alloc-*-cp311-abi3-*.whl)
fi
[ -f "$wheel" ] || { echo "no wheel at $wheel" >&2; exit 1; }
case "$(basename "$wheel")" in *-abi3-*) ;; *) echo "$wheel is not the abi3 wheel" >&2; exit 1 ;; esac
mkdir -p "$root/wheel"
rm -f "$root"/wheel/*.whl
cp "$wheel" "$root/wheel/"
whl="/wheel/$(basename "$wheel")"
echo "wheel: $(basename "$wheel")"

# 3. Each Python, in the root, in a private mount namespace.
status=0
for v in $pythons; do
  # The jax extra on both: on 3.15 its marker leaves JAX out (no jaxlib
  # wheel), and test_jax.py skips, saying so.
  extras="test,jax"
  phase "CPython $v: venv, pip install '$(basename "$wheel")[$extras]', pytest python/tests"
  log="$work/pytest-$v.log"
  set +e
  unshare -m --propagation private sh -euc '
    root=$1 repo=$2 v=$3 whl=$4 extras=$5
    for d in proc dev sys; do mkdir -p "$root/$d"; mount --rbind "/$d" "$root/$d"; done
    mkdir -p "$root/repo"
    mount --bind "$repo" "$root/repo"
    exec chroot "$root" /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root \
      LANG=C.UTF-8 CI=true MKL_ALLOC_TEST_SCALE=small /bin/sh -euc "
        rm -rf /venv-$v
        python$v -m venv /venv-$v
        /venv-$v/bin/pip install --quiet --disable-pip-version-check \"$whl[$extras]\"
        cd /repo
        /venv-$v/bin/python -c \"import sys, mkl_alloc; print(sys.version.split()[0], mkl_alloc.__file__, mkl_alloc.backing())\"
        /venv-$v/bin/python -m pytest -p no:cacheprovider -rs python/tests
      "
  ' sh "$root" "$repo" "$v" "$whl" "$extras" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  set -e
  if [ "$rc" -ne 0 ]; then
    echo "CPython $v: pytest failed (exit $rc; log: $log)" >&2
    status=1
    continue
  fi
  # Every skip (pytest -rs lists them) must be one the interpreter cannot
  # avoid: a test dependency with no wheel for it (conftest.NO_WHEEL_FROM).
  unexpected=$(grep '^SKIPPED' "$log" | grep -v "has no CPython $v wheel" || true)
  if [ -n "$unexpected" ]; then
    echo "CPython $v: skipped tests beyond those with no wheel for $v:" >&2
    echo "$unexpected" >&2
    status=1
  fi
done
[ "$status" -eq 0 ] && phase "python next (${pythons}): ok"
exit "$status"
