"""Installs win_amd64 wheels into the embeddable Windows CPython's folder,
from Linux (scripts/windows-python-check.sh): pip cannot install for a
Python it cannot run, and the embeddable distribution has no pip.

Usage: python3 install_wheels.py PREFIX WHEEL...

Each wheel (a zip) is unpacked as pip lays out a Windows environment whose
``sys.prefix`` is PREFIX: the package files into ``PREFIX/Lib/site-packages``
(the ``.data/purelib`` and ``.data/platlib`` parts too), ``.data/data`` into
PREFIX itself (the `mkl` wheel's ``Library/bin/*.dll``), ``.data/scripts``
into ``PREFIX/Scripts``; the dist-info's RECORD lists what was written, with
paths relative to site-packages, so that ``importlib.metadata`` finds the
files (mkl_alloc's ``__init__`` looks up mkl_rt.3.dll that way).
"""

import os
import sys
import zipfile


def install(prefix: str, wheel: str) -> int:
    """Unpacks one wheel; returns the number of files written."""
    site = os.path.join(prefix, "Lib", "site-packages")
    written = []
    with zipfile.ZipFile(wheel) as z:
        record = None
        for info in z.infolist():
            if info.is_dir():
                continue
            parts = info.filename.split("/")
            if parts[0].endswith(".data") and len(parts) > 2:
                kind, rest = parts[1], parts[2:]
                if kind in ("purelib", "platlib"):
                    dest = os.path.join(site, *rest)
                elif kind == "data":
                    dest = os.path.join(prefix, *rest)
                elif kind == "scripts":
                    dest = os.path.join(prefix, "Scripts", *rest)
                else:
                    raise SystemExit(f"{wheel}: unknown scheme {kind!r} in {info.filename}")
            else:
                dest = os.path.join(site, *parts)
            if parts[0].endswith(".dist-info") and parts[-1] == "RECORD":
                record = dest
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with z.open(info) as src, open(dest, "wb") as out:
                out.write(src.read())
            written.append(os.path.relpath(dest, site).replace(os.sep, "/"))
    if record is None:
        raise SystemExit(f"{wheel}: no RECORD")
    with open(record, "w") as f:
        f.writelines(f"{path},,\n" for path in written)
    return len(written)


def main() -> None:
    prefix, wheels = sys.argv[1], sys.argv[2:]
    for wheel in wheels:
        print(f"  {os.path.basename(wheel)}: {install(prefix, wheel)} files")


if __name__ == "__main__":
    main()
