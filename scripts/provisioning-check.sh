#!/usr/bin/env bash
# Checks the build script's provisioning rules (build/) against the real thing:
# - with the fetch turned off and no MKL anywhere, the build fails and says
#   how to provide MKL (the default mode and mkl-rt);
# - a half-written cache part (no stamp, or a stamp that does not match the
#   files) is never used;
# - a failed fetch leaves no folder or MKL file behind (only empty lock files);
# - a python3 without pip fails with pip's own message in the output;
# - a fetch waits while another build holds the lock of a part it needs;
# - the sweep of dead builds' work folders spares live ones of other hosts
#   and PID namespaces, even where their locks are not seen (build/workdir.rs);
# - with DOCS_RS set, `cargo doc` needs no MKL and touches no cache.
# Reuses the current target directory: only the build script re-runs.
# The lock and sweep rules are also unit-tested: cargo test --test build_locks.
set -euo pipefail
cd "$(dirname "$0")/.."
unset MKLROOT
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0
# pip pointed at a closed local port: any fetch fails at once.
unreachable=(env PIP_INDEX_URL=http://127.0.0.1:9/ PIP_RETRIES=0 PIP_TIMEOUT=2 PIP_NO_CACHE_DIR=1)

expect_refusal() {
  local what=$1; shift
  if MKL_ALLOC_CACHE="$tmp/cache" "$@" >"$tmp/log" 2>&1; then
    echo "FAIL: $what: the build succeeded without MKL"; exit 1
  fi
  for needle in "Intel oneMKL" "was not found" "MKLROOT" "pkg-config" "==2026.2.0" "MKL_ALLOC_NO_DOWNLOAD"; do
    grep -q -- "$needle" "$tmp/log" || { echo "FAIL: $what: error lacks '$needle'"; cat "$tmp/log"; exit 1; }
  done
  echo "ok: $what"; passed=$((passed+1))
}

no_fetch=(env MKL_ALLOC_NO_DOWNLOAD=1 cargo check --lib)
expect_refusal "empty cache, fetch off" "${no_fetch[@]}"
expect_refusal "empty cache, fetch off, mkl-rt" env MKL_ALLOC_NO_DOWNLOAD=1 PYTHON=false \
  cargo check --lib --no-default-features --features mkl-rt

# A cache killed half-way: files present, stamps missing.
mkdir -p "$tmp/cache/static" "$tmp/cache/include"
for lib in mkl_intel_lp64 mkl_sequential mkl_core; do echo junk >"$tmp/cache/static/lib$lib.a"; done
echo '/* */' >"$tmp/cache/include/mkl.h"
expect_refusal "half-written cache, fetch off" "${no_fetch[@]}"

# The same with stamps whose sizes do not match the files.
for lib in mkl_intel_lp64 mkl_sequential mkl_core; do
  printf 'mkl_static-2026.2.0-py2.py3-none-manylinux_2_28_x86_64.whl 090e439bf202b45579c75d2ba50ff7ead05752d553a06aba79c3ed2b5247921b\nlib%s.a 12345\n' \
    "$lib" "$lib" >"$tmp/cache/static/.complete-lib$lib.a"
done
expect_refusal "cache with wrong stamps, fetch off" "${no_fetch[@]}"

# A fetch that fails (no reachable index) is refused and leaves no work
# folder and no MKL file: only the empty lock files of the parts it tried.
rm -rf "$tmp/cache"
expect_refusal "failed fetch" "${unreachable[@]}" cargo check --lib
left=$(find "$tmp/cache" -mindepth 1 \( -name '.work-*' -o ! -type d ! \( -name '.lock-*' -empty \) \) -print 2>/dev/null)
if [ -n "$left" ]; then
  echo "FAIL: failed fetch left files behind:"; echo "$left" | head; exit 1
fi
echo "ok: failed fetch left nothing behind but empty lock files"; passed=$((passed+1))

# A python3 without pip (Debian's python3 without python3-pip): the build
# fails with pip's own reason in its output, not only the exit status.
rm -rf "$tmp/cache"
python3 -m venv --without-pip "$tmp/nopip"
expect_refusal "python without pip" env PYTHON="$tmp/nopip/bin/python" cargo check --lib
grep -q "No module named pip" "$tmp/log" || {
  echo "FAIL: python without pip: pip's own message is not in the output"; cat "$tmp/log"; exit 1
}
echo "ok: python without pip: the output says 'No module named pip'"; passed=$((passed+1))
rm -rf "$tmp/cache"

# A fetch waits while another build holds a part's lock (build/locks.rs):
# a helper holds the headers' lock until the build has the lock file open
# (waiting in flock), checks that no fetch started meanwhile (no work
# folder), and lets go; the build's fetch then runs (and fails).
mkdir -p "$tmp/cache/include"
python3 -c 'import fcntl, glob, os, sys, time
lock, cache, held = sys.argv[1:4]
f = open(lock, "a+"); fcntl.flock(f, fcntl.LOCK_EX); open(held, "w").close()
me, target = f"/proc/{os.getpid()}/", os.path.realpath(lock)
def opened_elsewhere():
    for fd in glob.glob("/proc/[0-9]*/fd/*"):
        try:
            if not fd.startswith(me) and os.readlink(fd) == target: return True
        except OSError: pass
while not opened_elsewhere(): time.sleep(0.1)
time.sleep(1)
if glob.glob(os.path.join(cache, ".work-*")): sys.exit("FAIL: part lock: a fetch started while another build held the lock")' \
  "$tmp/cache/include/.lock-headers" "$tmp/cache" "$tmp/part-held" &
holder=$!
while [ ! -e "$tmp/part-held" ]; do kill -0 "$holder" 2>/dev/null || { echo "FAIL: part lock: the helper died"; exit 1; }; sleep 0.1; done
MKL_ALLOC_CACHE="$tmp/cache" "${unreachable[@]}" cargo check --lib >"$tmp/log" 2>&1 || true
if kill "$holder" 2>/dev/null; then
  echo "FAIL: part lock: the build ended without waiting for the headers' lock"; exit 1
fi
wait "$holder" || exit 1
grep -q "pip download\` failed" "$tmp/log" || { cat "$tmp/log"; echo "FAIL: part lock: no fetch was attempted"; exit 1; }
echo "ok: a fetch waits for another build's lock on the same part"; passed=$((passed+1))

# A cache shared with builds this one cannot see (another host over NFS,
# another PID namespace), swept by the rule in build/workdir.rs: a folder
# goes only if its lock can be taken and its owner is this host's (boot and
# PID namespace) with a dead PID, or, owned elsewhere, it is a day old.
# - live: another host's build holding its lock (a helper process), aged:
#   kept, the lock wins over age;
# - remote: another host's recent folder whose lock is free (NFS with
#   local_lock=flock: that host's lock is invisible here): kept;
# - dead: this host's, its PID gone, lock free: removed;
# - stale: another host's, lock free, two days old: removed;
# - an older build's `.partial-<pid>` folder, whose PID means nothing here
#   (above any pid_max): left alone.
rm -rf "$tmp/cache"
w="$tmp/cache/.work"
live="$w-otherhost-7-7-0" remote="$w-otherhost-8-8-0" dead="$w-thishost-9-9-0" stale="$w-otherhost-6-6-0"
old="$tmp/cache/.partial-999999999"
mkdir -p "$live" "$remote" "$dead" "$stale" "$old"
touch "$live/lock" "$remote/lock" "$dead/lock" "$stale/lock" "$old/mkl_core.part"
owner() { printf 'host %s\nboot %s\npidns %s\npid %s\n' "$1" "$2" "$3" "$4"; }
true & gone=$!; wait "$gone"
owner "$(cat /proc/sys/kernel/hostname)" "$(cat /proc/sys/kernel/random/boot_id)" "$(readlink /proc/self/ns/pid)" "$gone" >"$dead/owner"
for dir in "$live" "$remote" "$stale"; do owner otherhost 00000000-0000-0000-0000-000000000000 'pid:[1]' 7 >"$dir/owner"; done
touch -d '2 days ago' "$live" "$stale"
python3 -c 'import fcntl, sys, time
f = open(sys.argv[1]); fcntl.flock(f, fcntl.LOCK_EX); open(sys.argv[2], "w").close(); time.sleep(600)' \
  "$live/lock" "$tmp/held" &
holder=$!
while [ ! -e "$tmp/held" ]; do kill -0 "$holder" 2>/dev/null || { echo "FAIL: sweep: the helper died"; exit 1; }; sleep 0.1; done
MKL_ALLOC_CACHE="$tmp/cache" "${unreachable[@]}" cargo check --lib >"$tmp/log" 2>&1 || true
kill "$holder"; wait "$holder" 2>/dev/null || true
grep -q "pip download\` failed" "$tmp/log" || { cat "$tmp/log"; echo "FAIL: sweep: no fetch was attempted"; exit 1; }
[ -e "$live/lock" ] || { echo "FAIL: sweep deleted a live build's work folder (lock held)"; exit 1; }
[ -e "$remote/lock" ] || { echo "FAIL: sweep deleted another host's recent work folder (its lock is not seen here)"; exit 1; }
[ -e "$old/mkl_core.part" ] || { echo "FAIL: sweep deleted $old, whose PID belongs to no process here"; exit 1; }
[ ! -e "$dead" ] || { echo "FAIL: sweep kept a dead build's work folder (this host, PID gone, lock free)"; exit 1; }
[ ! -e "$stale" ] || { echo "FAIL: sweep kept another host's two-day-old work folder (lock free)"; exit 1; }
echo "ok: the sweep keeps live and recent work folders of other hosts/namespaces, removes dead and stale ones"; passed=$((passed+1))

# docs.rs: no MKL, no reachable index, and the cache stays empty.
rm -rf "$tmp/cache"
if ! DOCS_RS=1 MKL_ALLOC_CACHE="$tmp/cache" CARGO_TARGET_DIR=target/docsrs "${unreachable[@]}" \
    cargo doc --no-deps --lib --features serde,bytemuck >"$tmp/log" 2>&1; then
  cat "$tmp/log"; echo "FAIL: DOCS_RS=1 cargo doc failed"; exit 1
fi
if [ -n "$(find "$tmp/cache" -mindepth 1 -print -quit 2>/dev/null)" ]; then
  echo "FAIL: DOCS_RS=1 cargo doc wrote into the cache"; exit 1
fi
echo "ok: DOCS_RS=1 cargo doc builds with no MKL and an empty cache"; passed=$((passed+1))
echo "provisioning: $passed passed, 0 failed"
