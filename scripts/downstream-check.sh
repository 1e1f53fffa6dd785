#!/usr/bin/env bash
# Builds and runs downstream crates of this checkout, outside it, in a
# temporary folder: a new user's crate made as the README says (cargo-add),
# the README's Rust examples as pasted (readme), and a small crate per MKL
# link mode depending on this checkout by path (issue: every MKL setup),
# whose run checks MKL memory, a cblas_dgemm on MklAllocator buffers against
# a naive product, and prints the MKL libraries it loaded (ldd for dynamic
# ones).
#
#   bash scripts/downstream-check.sh                 # cargo-add, readme, the four CI modes, one-mkl
#   bash scripts/downstream-check.sh mkl-static-ilp64-seq mkl-dynamic-ilp64-iomp
#   bash scripts/downstream-check.sh cargo-add readme one-mkl
#
# The plant: a fake MKL 2020.1 (a static libmkl_core.a whose MKL_malloc
# returns NULL) where intel-mkl-src's ocipkg fallback finds it
# ($XDG_DATA_HOME/ocipkg/...), as if its download had succeeded.
#
# cargo-add: a new user's crate, `cargo new` then `cargo add` (of this
# checkout by path: default features), the README's first example as its
# main.rs, no .cargo/config.toml. Built and run with XDG_DATA_HOME at the
# plant, then at an empty folder (where the download fails): intel-mkl-src
# is not in the graph, and the 8 MiB vector is MKL's.
#
# readme: every ```rust block of README.md as pasted (issue 55), in one
# `cargo new` crate with the README's own `cargo add --path` line (pointed
# at this checkout) and whatever `cargo add allocator-api2 hashbrown` and
# `cargo add mimalloc` pick today (no pin: a new major that breaks an
# example fails here first). Each block is a binary (src/bin/readme-LINE.rs,
# LINE the fence's line in README.md): a block with `fn main` as it is, one
# without wrapped in `fn main() { ... }` as rustdoc does; all are built
# with one `cargo build`, and each is run. A fence `rust,ignore` or
# `rust,compile_fail` is skipped, `rust,no_run` built only.
#
# one-mkl: the default configuration with the `intel-mkl-src` feature (a
# graph that has intel-mkl-src anyway, ndarray-linalg & co.), and the plant.
# The build must refuse, naming both MKLs; with the override the refusal
# proposes, it must build a program whose MKL allocations work. Nothing is
# downloaded (the folder exists).
#
# Modes share one target folder (target/downstream) so dependencies build once.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
export CARGO_TARGET_DIR="$root/target/downstream"
modes=("$@")
[ ${#modes[@]} -gt 0 ] || modes=(cargo-add readme default mkl-static-lp64-iomp mkl-dynamic-lp64-seq mkl-rt one-mkl)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
unset LD_LIBRARY_PATH
passed=0 failed=0

# The plant (see the header), once: sets $plant. Returns non-zero on failure.
xdg="$tmp/xdg" plant=""
plant_fake_mkl() {
  [ -z "$plant" ] || return 0
  # The image intel-mkl-src 0.8 falls back to, read from its own build script.
  local src image
  src=$(cargo metadata --quiet --format-version 1 --manifest-path "$root/Cargo.toml" --features intel-mkl-src | python3 -c '
import json, sys
m = json.load(sys.stdin)
print(next(p["manifest_path"] for p in m["packages"] if p["name"] == "intel-mkl-src"))') || return 1
  image=$(sed -n 's|.*"\([^"]*/rust-mkl/linux/\){}:\([^"]*\)".*|\1mkl-static-lp64-seq/__\2|p' "$(dirname "$src")/build.rs" | head -1)
  [ -n "$image" ] || { echo "FAIL: no Linux ocipkg image in $(dirname "$src")/build.rs"; return 1; }
  printf '#include <stddef.h>\nvoid *MKL_malloc(size_t size, int align) { (void)size; (void)align; return NULL; }\n' >"$tmp/fake.c"
  mkdir -p "$xdg/ocipkg/$image"
  cc -c -fPIC -o "$tmp/fake.o" "$tmp/fake.c" && ar rcs "$xdg/ocipkg/$image/libmkl_core.a" "$tmp/fake.o" || return 1
  plant="$xdg/ocipkg/$image"
}

# A new user's crate (see the header). Returns non-zero on failure.
cargo_add() {
  local crate="$tmp/ds-cargo-add" log="$tmp/cargo-add.log" empty="$tmp/xdg-empty" data bytes
  plant_fake_mkl || return 1
  mkdir -p "$empty"
  (cd "$tmp" && cargo new --quiet --vcs none ds-cargo-add && cd ds-cargo-add && cargo add --quiet --path "$root") || return 1
  # The README's first example, verbatim.
  sed -n '/^## Use it/,/^## /p' README.md | sed -n '/^```rust/,/^```/p' | sed '1d;/^```/,$d' >"$crate/src/main.rs"
  grep -q 'global_allocator' "$crate/src/main.rs" || { echo "FAIL: cargo-add: no #[global_allocator] example in README's Use it"; return 1; }
  [ ! -e "$crate/.cargo" ] || { echo "FAIL: cargo-add: the crate has a .cargo folder"; return 1; }
  (cd "$crate" && cargo tree --quiet -e normal,build --prefix none) >"$log" 2>&1 || { cat "$log"; echo "FAIL: cargo-add: cargo tree"; return 1; }
  if grep -Eq '^(intel-mkl-src|ocipkg) ' "$log"; then
    echo "FAIL: cargo-add: intel-mkl-src is in the default graph"; return 1
  fi
  # mkl-alloc built afresh, its build script run under the plant (the
  # default case then reuses this build).
  (cd "$crate" && cargo clean --release --quiet -p mkl-alloc) || return 1
  for data in "$plant" "$empty"; do
    if ! (cd "$crate" && XDG_DATA_HOME="${data%%/ocipkg/*}" cargo run --release --quiet) >"$log" 2>&1; then
      cat "$log"; echo "FAIL: cargo-add: does not build or run (XDG_DATA_HOME=${data%%/ocipkg/*})"; return 1
    fi
    bytes=$(sed -n 's/.*MemStats { bytes: \([0-9]*\),.*/\1/p' "$log")
    if [ -z "$bytes" ] || [ "$bytes" -lt $((8 << 20)) ]; then
      cat "$log"; echo "FAIL: cargo-add: MKL does not count the 8 MiB vector"; return 1
    fi
    "$CARGO_TARGET_DIR/release/ds-cargo-add" >/dev/null || { echo "FAIL: cargo-add: the binary fails run directly"; return 1; }
    echo "ok: cargo-add: builds and runs, MKL holds $bytes bytes ($([ "$data" = "$plant" ] && echo "intel-mkl-src's download folder planted" || echo "no download folder"))"
  done
  [ -z "$(ls -A "$empty")" ] || { echo "FAIL: cargo-add: something wrote into XDG_DATA_HOME: $(ls -A "$empty")"; return 1; }
}

# The README's Rust examples (see the header). Returns non-zero on failure.
readme() {
  local crate="$tmp/ds-readme" log="$tmp/readme.log" line bin i
  local -a add runs
  # The README's dependency line for a checkout, this checkout's path put in.
  line=$(sed -n 's/^\(cargo add --path [^#]*[^ #]\) *\(#.*\)\{0,1\}$/\1/p' README.md | head -1)
  [ -n "$line" ] || { echo "FAIL: readme: no 'cargo add --path' line in README.md"; return 1; }
  read -ra add <<<"$line"
  for i in "${!add[@]}"; do [ "${add[$i]}" != --path ] || add[i+1]=$root; done
  echo "  $line (path: this checkout)"
  (cd "$tmp" && cargo new --quiet --vcs none ds-readme) || return 1
  (cd "$crate" && "${add[@]}" --quiet && cargo add --quiet allocator-api2 hashbrown && cargo add --quiet mimalloc) >"$log" 2>&1 \
    || { cat "$log"; echo "FAIL: readme: cargo add"; return 1; }
  sed -n '/^\[dependencies\]/,$p' "$crate/Cargo.toml" | sed '1d;s/^/  /'
  rm "$crate/src/main.rs"
  mkdir "$crate/src/bin"
  # One binary per block; prints "LINE run" or "LINE build" per binary.
  python3 - README.md "$crate/src/bin" >"$tmp/readme.bins" <<'PY' || { echo "FAIL: readme: extracting the examples"; return 1; }
import re, sys
readme, out = sys.argv[1], sys.argv[2]
block, start, info = None, 0, ""
for n, text in enumerate(open(readme, encoding="utf-8"), 1):
    if block is None:
        m = re.match(r"^```(rust[^`]*)$", text.rstrip("\n"))
        if m:
            block, start, info = [], n, m.group(1)
        continue
    if text.rstrip("\n") != "```":
        block.append(text)
        continue
    attrs = {a.strip() for a in info.split(",")[1:]}
    src = "".join(block)
    block = None
    if attrs & {"ignore", "compile_fail"}:
        print(f"README.md:{start}: skipped ({info})", file=sys.stderr)
        continue
    if not re.search(r"^\s*fn main\s*\(", src, re.M):
        src = "fn main() {\n" + "".join("    " + l if l.strip() else l for l in src.splitlines(True)) + "}\n"
    open(f"{out}/readme-{start}.rs", "w", encoding="utf-8").write(src)
    print(start, "build" if "no_run" in attrs else "run")
PY
  mapfile -t runs <"$tmp/readme.bins"
  [ ${#runs[@]} -gt 0 ] || { echo "FAIL: readme: no rust block in README.md"; return 1; }
  if ! (cd "$crate" && cargo build --release --quiet --bins) >"$log" 2>&1; then
    cat "$log"; echo "FAIL: readme: an example does not compile (the binary readme-LINE is README.md's block at LINE)"; return 1
  fi
  for line in "${runs[@]}"; do
    bin="readme-${line% *}"
    if [ "${line#* }" = build ]; then echo "ok: README.md:${line% *}: builds (no_run)"; continue; fi
    "$CARGO_TARGET_DIR/release/$bin" >"$log" 2>&1 || { cat "$log"; echo "FAIL: readme: README.md:${line% *}: the example fails"; return 1; }
    echo "ok: README.md:${line% *}: builds and runs"
  done
}

# The two-MKLs check (see the header). Returns non-zero on failure.
one_mkl() {
  local crate="$tmp/ds-one-mkl"
  mkdir -p "$crate/src"
  cp scripts/downstream/main.rs "$crate/src/main.rs"
  plant_fake_mkl || return 1
  cat >"$crate/Cargo.toml" <<TOML
[package]
name = "ds-one-mkl"
version = "0.0.0"
edition = "2024"
publish = false

[dependencies]
mkl-alloc = { path = "$root", features = ["intel-mkl-src"] }
allocator-api2 = { version = "0.2", default-features = false, features = ["alloc"] }

[lints.rust]
unexpected_cfgs = { level = "allow" }

[workspace]
TOML
  local log="$tmp/one-mkl.log"
  # intel-mkl-src's build script must run again to see the plant.
  (cd "$crate" && cargo clean --release --quiet -p intel-mkl-src) || return 1
  if (cd "$crate" && XDG_DATA_HOME="$xdg" DOWNSTREAM_MODE=one-mkl cargo build --release --quiet) >"$log" 2>&1; then
    if grep -rqs -- "$plant" "$CARGO_TARGET_DIR"/release/build/intel-mkl-src-*/output; then
      echo "FAIL: one-mkl: the build succeeded although intel-mkl-src linked the planted MKL 2020.1 beside mkl-alloc's"
    else
      echo "FAIL: one-mkl: the build succeeded and intel-mkl-src did not pick up the plant (test broken?)"
    fi
    return 1
  fi
  for needle in "two MKLs" "$plant" "2026.2.0" "mkl_core]" 'provided-by = "mkl-alloc"' MKLROOT; do
    grep -qF -- "$needle" "$log" || { cat "$log"; echo "FAIL: one-mkl: the refusal lacks '$needle'"; return 1; }
  done
  sed -n '/two MKLs/,/its MKL alone/p' "$log" | sed 's/^/  | /'
  echo "ok: one-mkl: refused, naming both MKLs and the ways out"
  # The first way out: intel-mkl-src's build script overridden.
  local triple
  triple=$(rustc -vV | sed -n 's/^host: //p')
  mkdir -p "$crate/.cargo"
  printf '[target.%s.mkl_core]\nprovided-by = "mkl-alloc"\n' "$triple" >"$crate/.cargo/config.toml"
  if ! (cd "$crate" && XDG_DATA_HOME="$xdg" DOWNSTREAM_MODE=one-mkl cargo run --release --quiet) >"$log" 2>&1; then
    cat "$log"; echo "FAIL: one-mkl: with the override the program does not build or its allocations fail"; return 1
  fi
  cat "$log"
  # Leave intel-mkl-src's next run unaffected by the plant.
  (cd "$crate" && rm -rf .cargo && cargo clean --release --quiet -p intel-mkl-src) || true
}

for mode in "${modes[@]}"; do
  if [ "$mode" = cargo-add ]; then
    echo "== cargo-add"
    if cargo_add; then passed=$((passed+1)); else echo "FAIL: cargo-add"; failed=$((failed+1)); fi
    continue
  fi
  if [ "$mode" = readme ]; then
    echo "== readme"
    if readme; then passed=$((passed+1)); else echo "FAIL: readme"; failed=$((failed+1)); fi
    continue
  fi
  if [ "$mode" = one-mkl ]; then
    echo "== one-mkl"
    if one_mkl; then passed=$((passed+1)); else echo "FAIL: one-mkl"; failed=$((failed+1)); fi
    continue
  fi
  crate="$tmp/ds-$mode"
  mkdir -p "$crate/src"
  cp scripts/downstream/main.rs "$crate/src/main.rs"
  if [ "$mode" = default ]; then
    dep="mkl-alloc = { path = \"$root\" }"
  else
    dep="mkl-alloc = { path = \"$root\", default-features = false, features = [\"$mode\"] }"
  fi
  extra=""
  case "$mode" in
    # A graph that also asks intel-mkl-src for the same configuration, as
    # ndarray-linalg's intel-mkl features do: mkl-alloc's `intel-mkl-src`
    # feature joins it (one intel-mkl-src, one MKL).
    mkl-static-lp64-iomp)
      dep="mkl-alloc = { path = \"$root\", default-features = false, features = [\"$mode\", \"intel-mkl-src\"] }"
      extra="intel-mkl-src = { version = \"0.8\", default-features = false, features = [\"$mode\"] }" ;;
  esac
  cat >"$crate/Cargo.toml" <<TOML
[package]
name = "ds-$mode"
version = "0.0.0"
edition = "2024"
publish = false

[dependencies]
$dep
$extra
allocator-api2 = { version = "0.2", default-features = false, features = ["alloc"] }

[lints.rust]
unexpected_cfgs = { level = "allow" }

[workspace]
TOML
  # A downstream build script that gives the binary an rpath to the library
  # folder mkl-alloc reports, so the dynamic modes also run outside cargo.
  cat >"$crate/build.rs" <<'RS'
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_MKL_ALLOC_LIB_DIR");
    if let Ok(dir) = std::env::var("DEP_MKL_ALLOC_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
    if std::env::var("CARGO_MANIFEST_DIR").unwrap().contains("ilp64") {
        println!("cargo:rustc-cfg=ilp64");
    }
}
RS
  echo "== $mode"
  log="$tmp/$mode.log"
  if ! (cd "$crate" && DOWNSTREAM_MODE=$mode cargo build --release --quiet) >"$log" 2>&1; then
    cat "$log"; echo "FAIL: $mode: the downstream crate does not build"; failed=$((failed+1)); continue
  fi
  bin="$CARGO_TARGET_DIR/release/ds-$mode"
  ok=true
  # Through cargo (its library path), then the binary alone (its rpath only).
  (cd "$crate" && DOWNSTREAM_MODE=$mode cargo run --release --quiet) || ok=false
  "$bin" >"$log" 2>&1 || { cat "$log"; echo "(run directly, no LD_LIBRARY_PATH)"; ok=false; }
  if [ -n "$extra" ]; then
    # One MKL beside intel-mkl-src: one build script alone links mkl_core.
    linkers=$(cd "$crate" && DOWNSTREAM_MODE=$mode cargo build --release --quiet --message-format=json | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "build-script-executed" and any("mkl_core" in l for l in m["linked_libs"]):
        print(m["package_id"])')
    echo "  mkl_core linked by: $linkers"
    [ "$(echo "$linkers" | grep -c .)" -eq 1 ] || { echo "FAIL: $mode: mkl_core is not linked by exactly one crate"; ok=false; }
  fi
  case "$mode" in
    default|mkl-static-*) ;;
    *) ldd "$bin" | grep -E 'mkl|iomp' | sed 's/^/  ldd: /'
       if ldd "$bin" | grep -q 'not found'; then echo "FAIL: $mode: ldd finds a library missing"; ok=false; fi ;;
  esac
  if $ok; then passed=$((passed+1)); else echo "FAIL: $mode"; failed=$((failed+1)); fi
done
echo "downstream: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
