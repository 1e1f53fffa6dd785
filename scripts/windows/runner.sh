#!/bin/sh
# Cargo's runner for x86_64-pc-windows-gnu under wine (scripts/windows-check.sh
# sets CARGO_TARGET_X86_64_PC_WINDOWS_GNU_RUNNER to this file). Windows finds
# DLLs on PATH, which wine takes from WINEPATH: the folders in
# MKL_ALLOC_WINE_DLLS (colon-separated: the test-only bcryptprimitives.dll's
# and the cache's folder of MKL's DLLs), then every folder cargo put on the
# library path (LD_LIBRARY_PATH here, the host's variable; for test binaries
# it holds the build script's folder of MKL's DLLs, for doctests it does
# not), as wine's Z: drive paths. stdin from /dev/null: wine otherwise
# blocks on a terminal it does not own.
set -eu
winepath_of() { printf 'Z:%s' "$(printf '%s' "$1" | tr '/' '\\')"; }
path=
old_ifs=$IFS; IFS=:
for dir in ${MKL_ALLOC_WINE_DLLS:-} ${LD_LIBRARY_PATH:-}; do
  [ -n "$dir" ] && path="${path:+$path;}$(winepath_of "$dir")"
done
IFS=$old_ifs
export WINEPATH="$path"
export WINEDLLOVERRIDES="bcryptprimitives=n,b${WINEDLLOVERRIDES:+;$WINEDLLOVERRIDES}"
export MKL_THREADING_LAYER="${MKL_THREADING_LAYER:-SEQUENTIAL}"
export WINEDEBUG="${WINEDEBUG:--all}"
exec wine "$@" </dev/null
