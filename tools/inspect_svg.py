#!/usr/bin/env python3
"""Turns the CSV of `run -m inspect --csv` into an SVG heatmap. Standard library only.

    python3 tools/inspect_svg.py inspect.csv -o heatmap.svg

One row per (layer, head); two panels, the mean |q chunk| and |k chunk| of each
rotary pair, highest frequency on the left, each row shaded to its own maximum.
A red line marks where the unrotated pairs of p-RoPE begin. A third panel shows
the attention summary (weight on BOS, current, previous token) on a 0..1 scale.
"""
import argparse
import csv
import sys
from xml.sax.saxutils import escape

CELL, GAP, LABEL, TOP = 18, 30, 70, 56


def read_csv(path):
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        sys.exit(f"inspect_svg.py: error: cannot read {path}: {e.strerror}")
    chunks = [r for r in rows if r.get("kind") == "chunk"]
    attention = [r for r in rows if r.get("kind") == "attention"]
    if not chunks:
        sys.exit(f"inspect_svg.py: error: {path} has no chunk rows (not a run -m inspect CSV?)")
    return chunks, attention


def shade(value, max_value):
    """White (0) to dark blue (the row's maximum)."""
    t = value / max_value if max_value > 0 else 0.0
    r, g, b = (int(255 - t * (255 - c)) for c in (8, 48, 107))
    return f"#{r:02x}{g:02x}{b:02x}"


def heatmap(chunks, attention):
    heads = sorted({(int(r["layer"]), int(r["head"])) for r in chunks})
    pairs = max(int(r["pair"]) for r in chunks) + 1
    rotated = sum(1 for r in chunks if (int(r["layer"]), int(r["head"])) == heads[0] and r["rotated"] == "1")
    by_head = {h: sorted((r for r in chunks if (int(r["layer"]), int(r["head"])) == h), key=lambda r: int(r["pair"]))
               for h in heads}
    attn = {(int(r["layer"]), int(r["head"])): r for r in attention}
    panel = pairs * CELL
    width = max(LABEL + 2 * panel + 3 * CELL + 3 * GAP + 20, 560)
    height = TOP + len(heads) * CELL + 30
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="monospace" font-size="10">',
           f'<rect x="0" y="0" width="{width}" height="{height}" fill="white"/>']
    out.append(f'<text x="4" y="14">mean |chunk| per rotary pair, pair 0 (highest frequency) left; '
               f'{rotated} of {pairs} pairs rotate</text>')
    titles = [("q", LABEL), ("k", LABEL + panel + GAP), ("attention", LABEL + 2 * (panel + GAP))]
    for text, x in titles:
        out.append(f'<text x="{x}" y="{TOP - 22}">{escape(text)}</text>')
    for i, text in enumerate(("B", "C", "P")):  # BOS, current, previous
        out.append(f'<text x="{LABEL + 2 * (panel + GAP) + i * CELL + 5}" y="{TOP - 6}">{text}</text>')
    for row, h in enumerate(heads):
        y = TOP + row * CELL
        out.append(f'<text x="4" y="{y + CELL - 3}">L{h[0]} H{h[1]}</text>')
        for panel_index, key in enumerate(("q_norm", "k_norm")):
            values = [float(r[key]) for r in by_head[h]]
            x0 = LABEL + panel_index * (panel + GAP)
            for i, v in enumerate(values):
                out.append(f'<rect x="{x0 + i * CELL}" y="{y}" width="{CELL}" height="{CELL}" fill="{shade(v, max(values))}">'
                           f'<title>L{h[0]} H{h[1]} pair {i}: {escape(key)} {v:.4g}</title></rect>')
        if h in attn:
            x0 = LABEL + 2 * (panel + GAP)
            for i, key in enumerate(("bos", "current", "previous")):
                v = float(attn[h][key])
                out.append(f'<rect x="{x0 + i * CELL}" y="{y}" width="{CELL}" height="{CELL}" fill="{shade(v, 1.0)}">'
                           f'<title>L{h[0]} H{h[1]} {key}: {v:.3f}</title></rect>')
    if rotated < pairs:  # where the unrotated pairs of p-RoPE begin
        for panel_index in range(2):
            x = LABEL + panel_index * (panel + GAP) + rotated * CELL
            out.append(f'<line x1="{x}" y1="{TOP}" x2="{x}" y2="{TOP + len(heads) * CELL}" stroke="red" stroke-width="2"/>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", help="the CSV written by run -m inspect --csv")
    parser.add_argument("-o", "--output", required=True, help="the SVG file to write")
    args = parser.parse_args()
    chunks, attention = read_csv(args.csv)
    svg = heatmap(chunks, attention)
    try:
        with open(args.output, "w") as f:
            f.write(svg)
    except OSError as e:
        sys.exit(f"inspect_svg.py: error: cannot write {args.output}: {e.strerror}")
    heads = len({(r["layer"], r["head"]) for r in chunks})
    print(f"inspect_svg.py: wrote {args.output} ({heads} heads)")


if __name__ == "__main__":
    main()
