# Sourced by scripts/windows-check.sh and scripts/windows-python-check.sh:
# the Windows target, mingw-w64 and wine, installed where missing
# (rustup, Debian's packages). Expects `triple` and `step` from the caller.
step "toolchain: the $triple target, mingw-w64, wine"
rustup target list --installed | grep -qx "$triple" || rustup target add "$triple"
if ! command -v x86_64-w64-mingw32-gcc >/dev/null || ! command -v wine >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc-mingw-w64-x86-64 wine64 wine >/dev/null
fi
