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
#
# Wine's own errors (its `err` channel: a DLL not found, a crash in the
# loader) are kept with the program's stderr in a file: shown whole when
# the program fails (a test binary that exits 1 before printing anything
# otherwise leaves no trace, as once in CI), and without wine's lines when
# it passes. MKL_ALLOC_WINEDEBUG sets other channels.
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
export WINEDEBUG="${MKL_ALLOC_WINEDEBUG:-err+all,fixme-all}"
log=$(mktemp)
status=0
wine "$@" </dev/null 2>"$log" || status=$?
if [ "$status" -ne 0 ]; then
  echo "runner.sh: $1 exited with status $status under wine; its stderr, with wine's errors:" >&2
  cat "$log" >&2
else
  grep -Ev '^[0-9a-f]{4}:(err|fixme|warn|trace):' "$log" >&2 || true
fi
rm -f "$log"
exit "$status"
