#!/usr/bin/env bash
# MPI from Rust (issue 24): builds examples/mpi (rsmpi over MPICH, MKL buffers
# in collectives, non-blocking requests and point to point) and runs it on 4
# ranks under MPICH's mpiexec (hydra), with mkl-alloc's block cache off and
# then on. Passes only if, both times, mpiexec exits 0 and all 4 ranks print
# `rank N: ok`.
#
#   bash scripts/mpi-check.sh
#
# Needs MPICH (headers, mpicc, mpiexec) and libclang (rsmpi's build script
# runs bindgen on mpi.h); installs them from Debian's packages where missing.
# The example is a crate of its own, outside the root workspace, so that the
# root's `cargo test` needs neither.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
ranks=4

# MPICH by its own names: on a Debian machine that also has Open MPI, the
# plain `mpicc` / `mpiexec` alternatives may be Open MPI's, and a program
# built against one MPI cannot be launched by the other's mpiexec.
# rsmpi's build script (build-probe-mpi) asks $MPICC first.
mpicc=mpicc.mpich
mpiexec=mpiexec.mpich

# Echoes what is missing, if anything.
missing() {
  command -v "$mpicc" >/dev/null || echo "$mpicc (package mpich)"
  command -v "$mpiexec" >/dev/null || echo "$mpiexec (package mpich)"
  # The header, through the wrapper's own include path (libmpich-dev).
  if command -v "$mpicc" >/dev/null &&
    ! echo '#include <mpi.h>' | "$mpicc" -E -x c - >/dev/null 2>&1; then
    echo "mpi.h for $mpicc (package libmpich-dev)"
  fi
  # bindgen loads libclang.so at build time; the dev package also brings
  # clang's own headers (stddef.h & co.), which bindgen needs to parse mpi.h.
  if [ -z "${LIBCLANG_PATH:-}" ] && ! compgen -G '/usr/lib/llvm-*/lib/libclang.so' >/dev/null; then
    echo "libclang.so (package libclang-dev)"
  fi
}

need=$(missing)
if [ -n "$need" ]; then
  printf 'mpi-check: missing, installing from Debian packages:\n%s\n' "$need"
  if ! command -v apt-get >/dev/null; then
    echo "mpi-check: no apt-get here: install MPICH (with its headers and mpicc) and libclang, then run again" >&2
    exit 1
  fi
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  # update first: a fresh machine's package lists may be empty or stale.
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq libmpich-dev mpich libclang-dev
  need=$(missing)
  if [ -n "$need" ]; then
    printf 'mpi-check: still missing after apt-get install:\n%s\n' "$need" >&2
    exit 1
  fi
fi

# Its own target folder under target/: the example's lock file and feature
# set differ from the root workspace's, and a shared folder would make each
# build invalidate the other's artefacts. --locked: build exactly the
# committed examples/mpi/Cargo.lock (rsmpi 0.8).
export CARGO_TARGET_DIR="$PWD/target/mpi-example"
export MPICC="$mpicc"
echo "mpi-check: building examples/mpi (release)"
cargo build --release --locked --manifest-path examples/mpi/Cargo.toml
bin="$CARGO_TARGET_DIR/release/mkl-alloc-mpi-example"

# Twice: with mkl-alloc's block cache off and on (whichever the release's
# default), since the cache changes what MPI sees of a freed block: a cached
# block stays mapped and is handed out again (docs/mpi.md). mpiexec passes
# the environment on to every rank.
# A hung rank (a collective some rank never joins) would hang mpiexec for
# ever: the timeout turns it into a failure. The program itself aborts the
# whole job (MPI_Abort) on any failed check.
failed=0
for cache in off on; do
  log="$CARGO_TARGET_DIR/mpi-check-cache-$cache.log"
  echo "mpi-check: MKL_ALLOC_BLOCK_CACHE=$cache $mpiexec -n $ranks $bin"
  status=0
  MKL_ALLOC_BLOCK_CACHE=$cache timeout 300 "$mpiexec" -n "$ranks" "$bin" 2>&1 | tee "$log" || status=$?
  # Every rank must say so itself: a rank that returned without its checks
  # (or a launcher that started fewer ranks) must not pass for a success.
  # (grep finds nothing when every rank failed: not an error of this script.)
  ok=$({ grep -E "^rank [0-9]+: ok$" "$log" || true; } | sort -u | wc -l)
  echo "mpi-check: block cache $cache: $ok of $ranks ranks ok, mpiexec exit status $status"
  if [ "$status" -ne 0 ] || [ "$ok" -ne "$ranks" ]; then
    echo "mpi-check: block cache $cache: FAILED (want exit status 0 and all $ranks ranks ok; output above and in $log)" >&2
    failed=$((failed + 1))
  fi
done

echo "mpi-check: $((SECONDS - start)) s"
echo "mpi-check: $((2 - failed)) passed, $failed failed"
[ "$failed" -eq 0 ]
