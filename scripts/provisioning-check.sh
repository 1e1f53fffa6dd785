#!/usr/bin/env bash
# Checks build.rs's provisioning rules against the real build script:
# - with the fetch turned off and no MKL anywhere, the build fails and says
#   how to provide MKL;
# - a half-written cache (no completion stamp) is never used.
# Reuses the current target directory: only build.rs re-runs.
set -euo pipefail
cd "$(dirname "$0")/.."
unset MKLROOT
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

expect_refusal() {
  local what=$1
  if MKL_ALLOC_NO_DOWNLOAD=1 MKL_ALLOC_CACHE="$tmp/cache" cargo check --lib >"$tmp/log" 2>&1; then
    echo "FAIL: $what: the build succeeded without MKL"; exit 1
  fi
  for needle in "Intel oneMKL was not found" "MKLROOT" "pkg-config" "mkl-static==" "MKL_ALLOC_NO_DOWNLOAD"; do
    grep -q -- "$needle" "$tmp/log" || { echo "FAIL: $what: error lacks '$needle'"; cat "$tmp/log"; exit 1; }
  done
  echo "ok: $what"
}

expect_refusal "empty cache, fetch off"

# A cache killed half-way: archives present, stamp missing.
mkdir -p "$tmp/cache/lib" "$tmp/cache/include"
for lib in mkl_intel_lp64 mkl_sequential mkl_core; do echo junk >"$tmp/cache/lib/lib$lib.a"; done
echo '/* */' >"$tmp/cache/include/mkl.h"
expect_refusal "half-written cache, fetch off"

# The same with a stamp whose sizes do not match the files.
printf 'mkl 2026.2.0\n' >"$tmp/cache/mkl-alloc-complete"
expect_refusal "cache with a wrong stamp, fetch off"
echo "provisioning: 3 passed, 0 failed"
