#!/usr/bin/env python3
"""Draws docs/charts/architecture.svg from the code: src/'s files in their
layers (the table of tests/layers.rs, read from that file), and between
layers the number of `crate::` links (file to file) that run from one to
the other; within a layer, the links among its files.

    python3 scripts/architecture.py [--check]

--check: exit 1 if the committed picture differs from what the code gives
(the picture is then stale: run the script and commit it). Needs only
Python 3. The links are found as tests/layers.rs finds them (comments
dropped, `use` groups expanded, the crate root's re-exports followed);
that test is the rule, this is its picture.
"""

import os
import re
import sys
from collections import Counter, defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "src")
OUT = os.path.join(ROOT, "docs", "charts", "architecture.svg")


def table():
    """LAYERS and ROOT_NAMES, parsed from tests/layers.rs."""
    text = open(os.path.join(ROOT, "tests", "layers.rs"), encoding="utf-8").read()
    body = text[text.index("const LAYERS"):text.index("const ROOT_NAMES")]
    layers = []
    for m in re.finditer(r'\(\s*"([^"]+)",\s*&\[(.*?)\],?\s*\)', body, re.S):
        layers.append((m.group(1), re.findall(r'"([^"]+)"', m.group(2))))
    body = text[text.index("const ROOT_NAMES"):text.index("const KNOWN")]
    names = dict(re.findall(r'\("([^"]+)",\s*"([^"]+)"\)', body))
    return layers, names


def layer_of(layers, f):
    for i, (_, files) in enumerate(layers):
        if any(f == p or (p.endswith("/") and f.startswith(p)) for p in files):
            return i
    raise SystemExit(f"architecture.py: {f} is in no layer of tests/layers.rs")


def strip_comments(s):
    s = re.sub(r"/\*.*?\*/", "", s, flags=re.S)
    return re.sub(r"//[^\n]*", "", s)


def paths_at(s):
    """The paths a `crate::` at the start of s names (use groups expanded)."""
    out = []

    def tree(i, prefix):
        cur = list(prefix)
        while True:
            i += len(s[i:]) - len(s[i:].lstrip())
            if s.startswith("{", i):
                i += 1
                while True:
                    i = tree(i, cur)
                    i += len(s[i:]) - len(s[i:].lstrip())
                    if s.startswith(",", i):
                        i += 1
                        i += len(s[i:]) - len(s[i:].lstrip())
                    if i >= len(s) or s[i] == "}":
                        return i + 1
            m = re.match(r"[A-Za-z_][A-Za-z0-9_]*", s[i:])
            if not m:
                break
            if m.group(0) != "self":
                cur.append(m.group(0))
            i += m.end()
            if s.startswith("::", i):
                i += 2
                continue
            break
        out.append(cur)
        return i

    tree(0, [])
    return out


def links():
    layers, names = table()
    files = {}
    for d, _, fs in os.walk(SRC):
        for x in fs:
            if x.endswith(".rs"):
                rel = os.path.relpath(os.path.join(d, x), SRC).replace(os.sep, "/")
                files[rel] = open(os.path.join(d, x), encoding="utf-8").read()
    modules = {}
    for f in files:
        m = f[:-3].split("/")
        if m[-1] == "mod":
            m = m[:-1]
        if m == ["lib"]:
            m = []
        modules[tuple(m)] = f
    edges = set()
    for f, text in files.items():
        text = strip_comments(text)
        for m in re.finditer(r"(?<!\$)crate::", text):
            for path in paths_at(text[m.end():m.end() + 600]):
                if path and path[0] in names:
                    path = names[path[0]].split("::") + path[1:]
                for n in range(len(path), -1, -1):
                    t = modules.get(tuple(path[:n]))
                    if t:
                        break
                if t and t != f:
                    edges.add((f, t))
    return layers, sorted(files), edges


def esc(s):
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def draw():
    layers, files, edges = links()
    by_layer = defaultdict(list)
    for f in files:
        by_layer[layer_of(layers, f)].append(f)
    between = Counter()
    within = Counter()
    up = 0
    for a, b in edges:
        la, lb = layer_of(layers, a), layer_of(layers, b)
        if la == lb:
            within[la] += 1
        else:
            between[(la, lb)] += 1
            up += lb < la
    # Files shown by folder (a folder's files as one box with their count).
    W, gap, left, arrows = 1240, 34, 150, 150

    def boxes(i):
        """The layer's boxes as (label, x, line): a file directly in src/ or
        src/backing/ alone, a folder's files (shared_vec/, backing/medium/,
        ...) as one box with their count; wrapped to the width."""
        groups = Counter()
        for f in by_layer[i]:
            d = os.path.dirname(f)
            groups[f if d in ("", "backing") else d + "/"] += 1
        out, x, line = [], left, 0
        for g, n in sorted(groups.items()):
            label = g if n == 1 else f"{g} ({n})"
            w = 9 + 7 * len(label)
            if x + w > W - arrows:
                x, line = left, line + 1
            out.append((label, x, line, w))
            x += w + 8
        return out

    rows = [boxes(i) for i in range(len(layers))]
    heights = [58 + 38 * max((b[2] for b in r), default=0) for r in rows]
    tops = [50]
    for h in heights[:-1]:
        tops.append(tops[-1] + h + gap)
    height = tops[-1] + heights[-1] + 30
    svg = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" '
        f'font-family="sans-serif" font-size="12">',
        f'<rect width="{W}" height="{height}" fill="white"/>',
        f'<text x="{W // 2}" y="26" text-anchor="middle" font-size="16">'
        f"src/ in layers: {len(files)} files, {len(edges)} links between files, "
        f"{up} reaching up (drawn by scripts/architecture.py)</text>",
    ]
    for i, (name, _) in enumerate(layers):
        y, h = tops[i], heights[i]
        svg.append(f'<rect x="10" y="{y}" width="{W - 20}" height="{h}" rx="6" '
                   f'fill="#eef3fb" stroke="#7a8fb3"/>')
        svg.append(f'<text x="20" y="{y + 22}" font-weight="bold">{esc(name)}</text>')
        svg.append(f'<text x="20" y="{y + 40}" fill="#555">{within[i]} links within</text>')
        for label, x, line, w in rows[i]:
            by = y + 14 + 38 * line
            svg.append(f'<rect x="{x}" y="{by}" width="{w}" height="30" rx="4" '
                       f'fill="white" stroke="#9aa"/>')
            svg.append(f'<text x="{x + 5}" y="{by + 19}">{esc(label)}</text>')
    # Arrows from each layer to each lower one it uses, with the count.
    for (la, lb), n in sorted(between.items()):
        y1 = tops[la] + heights[la]
        y2 = tops[lb]
        x = W - 30 - 20 * la - 5 * lb
        colour = "#b22" if lb < la else "#357"
        if lb < la:
            y1, y2 = tops[la], tops[lb] + heights[lb]
        svg.append(f'<line x1="{x}" y1="{y1}" x2="{x}" y2="{y2}" stroke="{colour}" '
                   f'stroke-width="1.5" marker-end="url(#a)"/>')
        svg.append(f'<text x="{x - 4}" y="{(y1 + y2) // 2}" text-anchor="end" '
                   f'font-size="10" fill="{colour}">{n}</text>')
    svg.insert(1, '<defs><marker id="a" markerWidth="8" markerHeight="8" refX="6" refY="4" '
                  'orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#357"/></marker></defs>')
    svg.append("</svg>")
    return "\n".join(svg) + "\n"


def main():
    svg = draw()
    if "--check" in sys.argv[1:]:
        old = open(OUT, encoding="utf-8").read() if os.path.exists(OUT) else ""
        if old != svg:
            sys.exit(f"{OUT} is stale: run python3 scripts/architecture.py and commit it")
        print("architecture.svg: up to date")
        return
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        f.write(svg)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
