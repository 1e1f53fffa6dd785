#!/usr/bin/env bash
# Checks that every relative link and image in the project's Markdown
# (README.md, python/README.md, docs/*.md) resolves: the file or folder it
# names exists inside the repository, and a `#fragment` names a heading of
# the target Markdown file (GitHub's heading slugs, duplicates numbered -1,
# -2, ...; explicit `id=`/`name=` anchors count too). Links inside fenced
# code blocks and code spans are not links and are skipped; so are absolute
# URLs (`https:`, `mailto:`, ...). Fragments into non-Markdown files
# (`src/lib.rs#L10`) are not checked, only the file.
#
# Usage: bash scripts/check-links.sh [FILE.md ...]
#   With no argument: README.md, python/README.md and docs/*.md.
# Exit status: 0 when every link resolves, 1 when any does not (each broken
# one is listed as FILE:LINE: TARGET: why), 2 on a usage error.
# Needs bash and python3 (standard library only).
set -euo pipefail
cd "$(dirname "$0")/.."

command -v python3 >/dev/null || { echo "check-links.sh: python3 is required" >&2; exit 2; }

if [ "$#" -eq 0 ]; then
  set -- README.md python/README.md
  for f in docs/*.md; do
    [ -e "$f" ] && set -- "$@" "$f"
  done
fi

exec python3 - "$@" <<'PY'
import os
import re
import sys
import unicodedata
from urllib.parse import unquote

ROOT = os.path.realpath(os.getcwd())

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
INLINE = re.compile(r"\]\(\s*(<[^>]*>|[^)\s]*)(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)")
REFDEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
HTML_ATTR = re.compile(r"""\b(?:src|href)\s*=\s*["']([^"']+)["']""", re.I)
HTML_ID = re.compile(r"""<[^>]*\b(?:id|name)\s*=\s*["']([^"']+)["']""", re.I)
HTML_COMMENT = re.compile(r"<!--.*?-->", re.S)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def prose_lines(text):
    """(line number, line) for every line outside fenced code blocks."""
    text = HTML_COMMENT.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    fence = None
    for n, line in enumerate(text.split("\n"), 1):
        m = FENCE.match(line)
        if fence is None:
            if m:
                fence = m.group(1)
                continue
            yield n, line
        elif m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) \
                and line.strip() == m.group(1):
            fence = None


def heading_text(raw):
    """The text GitHub renders for a heading's Markdown."""
    t = CODE_SPAN.sub(lambda m: m.group(2).strip(), raw)
    t = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", t)  # links and images: their text
    t = re.sub(r"<[^>]+>", "", t)                      # HTML tags
    t = re.sub(r"(\*\*|__|\*|~~)", "", t)              # emphasis markers
    t = t.replace("\\", "")                            # backslash escapes
    return t.strip()


def slug(text):
    """GitHub's heading slug (github-slugger): lower case, every character
    that is not a letter, mark, number, connector (`_`), hyphen or space
    removed, each space a hyphen."""
    out = []
    for ch in text.lower():
        cat = unicodedata.category(ch)
        if ch in " -" or cat[0] in "LMN" or cat == "Pc":
            out.append("-" if ch == " " else ch)
    return "".join(out)


_anchors = {}


def anchors(path):
    """Every fragment a Markdown file answers to."""
    if path not in _anchors:
        found, seen = set(), {}
        with open(path, encoding="utf-8") as f:
            text = f.read()
        prev = None
        for _, line in prose_lines(text):
            texts = []
            m = ATX.match(line)
            if m and m.group(2) is not None:
                texts.append(m.group(2))
            elif m:
                texts.append("")
            elif prev is not None and prev.strip() and SETEXT.match(line) \
                    and not ATX.match(prev) and not prev.lstrip().startswith(("|", "-", "*", ">")):
                texts.append(prev)
            for raw in texts:
                base = slug(heading_text(raw))
                n = seen.get(base, 0)
                seen[base] = n + 1
                found.add(base if n == 0 else f"{base}-{n}")
            found.update(HTML_ID.findall(line))
            prev = line
        _anchors[path] = found
    return _anchors[path]


def targets(line):
    stripped = CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)
    for rx in (INLINE, REFDEF, HTML_ATTR):
        for m in rx.finditer(stripped):
            t = m.group(1)
            if t.startswith("<") and t.endswith(">"):
                t = t[1:-1]
            yield t


def check(doc):
    broken, count = [], 0
    with open(doc, encoding="utf-8") as f:
        text = f.read()
    base_dir = os.path.dirname(os.path.abspath(doc))
    for n, line in prose_lines(text):
        for target in targets(line):
            if not target or SCHEME.match(target) or target.startswith("//"):
                continue
            count += 1
            path_part, _, fragment = target.partition("#")
            path_part = unquote(path_part.split("?", 1)[0])
            if path_part == "":
                resolved = os.path.abspath(doc)
            elif path_part.startswith("/"):
                resolved = os.path.join(ROOT, path_part.lstrip("/"))
            else:
                resolved = os.path.join(base_dir, path_part)
            resolved = os.path.normpath(resolved)
            real = os.path.realpath(resolved)
            where = f"{doc}:{n}: {target}"
            if real != ROOT and not real.startswith(ROOT + os.sep):
                broken.append(f"{where}: outside the repository")
                continue
            if not os.path.exists(resolved):
                broken.append(f"{where}: no such file or folder ({os.path.relpath(resolved, ROOT)})")
                continue
            if not fragment:
                continue
            md = resolved
            if os.path.isdir(md):
                md = os.path.join(md, "README.md")
                if not os.path.isfile(md):
                    continue
            if not md.lower().endswith((".md", ".markdown")):
                continue
            if unquote(fragment) not in anchors(md):
                broken.append(f"{where}: no heading with the anchor #{fragment} in {os.path.relpath(md, ROOT)}")
    return broken, count


def main(docs):
    broken, total = [], 0
    for doc in docs:
        if not os.path.isfile(doc):
            print(f"check-links.sh: {doc}: no such file", file=sys.stderr)
            return 2
        b, c = check(doc)
        broken += b
        total += c
    for b in broken:
        print(b)
    if broken:
        print(f"check-links: {len(broken)} of {total} relative links in {len(docs)} files are broken")
        return 1
    print(f"check-links: all {total} relative links in {len(docs)} files resolve")
    return 0


sys.exit(main(sys.argv[1:]))
PY
