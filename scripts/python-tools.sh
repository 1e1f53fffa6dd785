# Sourced by scripts/python-wheels.sh and scripts/sdist-check.sh: the tool
# venv they share, target/python-wheels/tools, with maturin (wheels and
# sdist), ziglang (maturin links the manylinux2014 wheels with zig against
# glibc 2.17's symbols) and auditwheel (the wheels' audit), from the package
# index. Pinned, so that a wheel built next month is built the same way; the
# venv is remade when the pins change. Sets $tools.
python_tools() {
  local pins=("maturin==1.16.0" "ziglang==0.17.1" "auditwheel==6.8.2")
  tools="$PWD/target/python-wheels/tools"
  if [ ! -x "$tools/bin/maturin" ] || [ "$(cat "$tools/pins" 2>/dev/null)" != "${pins[*]}" ]; then
    printf -- '-- tool venv: %s (%ss)\n' "${pins[*]}" "$SECONDS"
    rm -rf "$tools"
    python3 -m venv "$tools"
    "$tools/bin/pip" install --quiet --disable-pip-version-check "${pins[@]}"
    echo "${pins[*]}" >"$tools/pins"
  fi
}
