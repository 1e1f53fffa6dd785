"""``python -m mkl_alloc``: what this process's mkl_alloc runs on, one screen.

Prints ``mkl_alloc.show_config()``'s report: the package's and MKL's
versions, MKL's interface and threading layers, the backing's state and
why, the block cache's budget and decay, the huge-page threshold (each with
where it came from: its ``MKL_ALLOC_*`` variable, the default, or the
program, through ``mkl_alloc.configure()``) and the
figures of ``mem_stat()``. ``--json`` prints the same as one JSON object
(``show_config(mode="dicts")``), for scripts and bug reports.
"""

from __future__ import annotations

import argparse
import json
import sys

import mkl_alloc


def main(argv: list[str] | None = None) -> int:
    """Parses ``argv`` (``sys.argv[1:]`` by default), prints the report and
    returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m mkl_alloc",
        description="Report the mkl_alloc package's configuration: versions, MKL's layers, "
        "the backing's state, the settings in force and where each came from, and "
        "mem_stat()'s figures.",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the report as one JSON object instead of text",
    )
    args = parser.parse_args(argv)
    if args.json:
        json.dump(mkl_alloc.show_config(mode="dicts"), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        mkl_alloc.show_config()
    return 0


if __name__ == "__main__":
    sys.exit(main())
