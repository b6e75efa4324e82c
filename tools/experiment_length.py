#!/usr/bin/env python3
"""Past the training length: RoPE scaling rules on models trained at L = 64, scored to 8L.

    python3 tools/experiment_length.py            (make experiment-length)

Takes the models of `make experiment` for p in {0, 0.25, 0.5, 1} and seeds 0 and 1
(--runs, experiment/runs/p*_s*: a finished model is used as it is, a missing one is
trained as tools/experiment.py trains it). Scores each model's held-out val.txt with
`run -m ppl` in windows of 8L = 512 positions (-c 512), with no rule and with the
linear, ntk, yarn and llama3 rules at factor 8 (--rope-original-len L always given),
and writes to --out:
    results.md           mean nll per position band [0, L), [L, 2L), [2L, 4L), [4L, 8L)
                         for each p and rule: mean over seeds (min..max)
    nll_by_position.svg  nll against position (mean over seeds and over bins, --points
                         to a band: 8 positions wide up to 2L, then 16, then 32), one
                         panel per p, one line per rule
    csv/                 run's `position,nll` rows, one file per model and rule
Standard library only; training needs PyTorch (train.py).
"""
import argparse
import csv
import re
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from experiment import ROOT, label, spread, train_one  # noqa: E402  (tools/experiment.py)

RULES = ["none", "linear", "ntk", "yarn", "llama3"]
RULE_COLORS = {"none": "#222222", "linear": "#1f77b4", "ntk": "#2ca02c", "yarn": "#ff7f0e", "llama3": "#9467bd"}
ORIGINAL_LEN_OFFSET = 60  # the header's rope_original_len (0 in files written before it existed)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(ROOT / "experiment" / "length"))
    p.add_argument("--runs", default=str(ROOT / "experiment" / "runs"),
                   help="the trained models, DIR/p{p}_s{seed}/ (shared with make experiment)")
    p.add_argument("--fractions", type=float, nargs="+", default=[0.0, 0.25, 0.5, 1.0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--rules", nargs="+", default=RULES, choices=RULES)
    p.add_argument("--train-len", type=int, default=64, help="L, the models' training window (train.py --seq-len)")
    p.add_argument("--factor", type=int, default=8, help="the rules' factor; windows of factor x L positions")
    p.add_argument("--points", type=int, default=8, help="points per band in the SVG (bins of band width / points)")
    p.add_argument("--run", default=str(ROOT / "run"), help="the run binary")
    p.add_argument("--train-args", default="", help="more train.py flags for missing models, e.g. '--steps 20'")
    args = p.parse_args(argv)
    if args.train_len < 1 or args.factor < 2 or args.points < 1:
        p.error("--train-len must be >= 1, --factor >= 2, --points >= 1")
    return args


def bands(L, factor):
    """[0, L), [L, 2L), [2L, 4L), ... up to factor x L."""
    edges = [0, L]
    while edges[-1] * 2 < factor * L:
        edges.append(edges[-1] * 2)
    edges.append(factor * L)
    return list(zip(edges, edges[1:]))


def band_name(lo, hi, L):
    def mult(n):
        return "0" if n == 0 else "L" if n == L else f"{n // L}L" if n % L == 0 else str(n)
    return f"[{mult(lo)}, {mult(hi)})"


def header_original_len(model):
    with open(model, "rb") as f:
        f.seek(ORIGINAL_LEN_OFFSET)
        return struct.unpack("<i", f.read(4))[0]


def score(args, run_dir, rule, csv_path):
    """run -m ppl on val.txt in windows of factor x L positions under one rule; returns
    per-position [sum of nll, count] and the start-up line's "N of M pairs"."""
    ctx = args.factor * args.train_len
    cmd = [args.run, str(run_dir / "model.bin"), "-z", str(run_dir / "tokenizer.bin"), "-m", "ppl", "-f",
           str(run_dir / "val.txt"), "-c", str(ctx), "--rope-original-len", str(args.train_len), "--csv",
           str(csv_path)]
    if rule != "none":
        cmd += ["--rope-scaling", rule, "--rope-factor", str(args.factor)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"experiment_length: run -m ppl failed ({' '.join(cmd)}): {r.stderr.strip()}")
    pairs = re.search(r"\((\d+ of \d+ pairs) rotate\)", r.stderr)
    return read_csv(csv_path, ctx), pairs.group(1) if pairs else "?"


def read_csv(csv_path, ctx):
    """run's `position,nll` rows as [sum of nll, count] for each position 0 .. ctx - 1."""
    sums = [[0.0, 0] for _ in range(ctx)]
    with open(csv_path) as f:
        for row in csv.DictReader(f):
            s = sums[int(row["position"])]
            s[0] += float(row["nll"])
            s[1] += 1
    if not sums[0][1]:
        sys.exit(f"experiment_length: {csv_path} has no rows")
    return sums


def band_mean(sums, lo, hi):
    total = sum(s[0] for s in sums[lo:hi])
    count = sum(s[1] for s in sums[lo:hi])
    return total / count if count else float("nan")


def binned(sums, band_list, points):
    """(middle position, mean nll) over bins: each band cut into `points` bins (at least one
    position wide), so that the wider bands far from L are smoothed more."""
    out = []
    for lo, hi in band_list:
        width = max(1, (hi - lo) // points)
        for a in range(lo, hi, width):
            b = min(a + width, hi, len(sums))
            if b > a and sum(s[1] for s in sums[a:b]):
                out.append(((a + b - 1) / 2, band_mean(sums, a, b)))
    return out


def paired(results, p, rule, k, base="none"):
    """rule minus base in band k, seed by seed."""
    return [a - b for a, b in zip(results[p][rule][k], results[p][base][k])]


def signed_spread(values):
    return f"{statistics.mean(values):+.3f} ({min(values):+.3f}..{max(values):+.3f})"


def write_results(path, results, pairs, args, svg_name):
    L, F = args.train_len, args.factor
    bs = bands(L, F)
    names = [band_name(lo, hi, L) for lo, hi in bs]
    lines = [f"# Past the training length: models trained at L = {L}, scored in windows of {F}L = {F * L}", "",
             "| p | rule | " + " | ".join(f"nll {n}" for n in names) + " |",
             "|---|---|" + "---:|" * len(bs)]
    for p in args.fractions:
        for rule in args.rules:
            cells = " | ".join(spread(results[p][rule][k]) for k in range(len(bs)))
            lines.append(f"| {label(p)} | {rule} | {cells} |")
    lines += ["", f"Mean over seeds {', '.join(map(str, args.seeds))} (min..max), nats per token of each model's "
              f"held-out val.txt, by the token's position in its window (position 0 is predicted from BOS "
              f"alone). Rules at factor {F} with original length {L}; 'none' is no scaling. Pairs rotating: "
              + "; ".join(f"p = {p:g}: {pairs[p]}" for p in args.fractions) + ". Written by `make experiment-length` "
              "(tools/experiment_length.py).", ""]
    lines += [paragraph(results, args, names), "", f"![nll against position for each p and rule]({svg_name})", ""]
    path.write_text("\n".join(lines))
    return "\n".join(lines)


def paragraph(results, args, names):
    """The numbers that matter, in words: how far each model's loss rises past L without a rule,
    which rule is lowest in the last band, and what each rule costs inside L (seed-paired)."""
    last, first = len(names) - 1, 0
    ps, rules = args.fractions, args.rules
    text = []
    if "none" in rules:
        rise = [f"{statistics.mean(results[p]['none'][last]) - statistics.mean(results[p]['none'][first]):+.3f} "
                f"(p = {p:g})" for p in ps]
        text.append(f"Without a rule, the loss in {names[last]} against {names[first]} changes by " + ", ".join(rise)
                    + ".")
    for p in ps:
        best = min(rules, key=lambda r: statistics.mean(results[p][r][last]))
        if len(rules) > 1 and all(results[p][r] == results[p][rules[0]] for r in rules):
            text.append(f"For p = {p:g} every rule scores the same, to the digit (no pair rotates).")
            continue
        s = f"For p = {p:g} the lowest loss in {names[last]} is {best}'s, {statistics.mean(results[p][best][last]):.3f}"
        if "none" in rules and best != "none":
            s += f" (against none, seed by seed: {signed_spread(paired(results, p, best, last))})"
            costs = [f"{r} {signed_spread(paired(results, p, r, first))}" for r in rules if r != "none"]
            s += f"; inside {names[first]} the rules change the loss against none by " + ", ".join(costs)
        text.append(s + ".")
    return " ".join(text)


def write_svg(path, curves, args, pairs, titles):
    """nll against position: one panel per p (shared axes), one polyline per rule, a dashed
    vertical line at L. A hand-written SVG in tools/experiment.py's style."""
    L, ctx = args.train_len, args.factor * args.train_len
    cols = 2 if len(args.fractions) > 1 else 1
    rows = (len(args.fractions) + cols - 1) // cols
    PW, PH, left, right, top, bottom, gap = 320, 230, 60, 110, 30, 50, 40
    W = left + cols * PW + (cols - 1) * gap + right
    H = top + rows * PH + (rows - 1) * (gap + 10) + bottom
    values = [v for p in curves for r in curves[p] for _, v in curves[p][r]]
    y0, y1 = min(values), max(values)
    y0, y1 = y0 - 0.03 * (y1 - y0 or 1), y1 + 0.03 * (y1 - y0 or 1)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" '
           f'font-size="12"><rect width="{W}" height="{H}" fill="white"/>']
    for n, p in enumerate(args.fractions):
        px, py = left + (n % cols) * (PW + gap), top + (n // cols) * (PH + gap + 10)

        def x(pos):
            return px + pos / ctx * PW

        def y(v):
            return py + (y1 - v) / (y1 - y0) * PH

        for i in range(6):  # grid and axis labels
            v = y0 + (y1 - y0) * i / 5
            out.append(f'<line x1="{px}" y1="{y(v):.1f}" x2="{px + PW}" y2="{y(v):.1f}" stroke="#eee"/>')
            if n % cols == 0:
                out.append(f'<text x="{px - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.2f}</text>')
        for lo, hi in bands(L, args.factor):
            out.append(f'<text x="{x(lo):.1f}" y="{py + PH + 16}" text-anchor="middle">{lo}</text>')
        out.append(f'<text x="{x(ctx):.1f}" y="{py + PH + 16}" text-anchor="middle">{ctx}</text>')
        out.append(f'<line x1="{x(L):.1f}" y1="{py}" x2="{x(L):.1f}" y2="{py + PH}" stroke="#444" '
                   f'stroke-dasharray="4 3"/><text x="{x(L) + 4:.1f}" y="{py + PH - 6}">L = {L}</text>')
        out.append(f'<text x="{px + PW / 2}" y="{py - 8}" text-anchor="middle">p = {label(p)}, {pairs[p]} rotate'
                   f'{titles.get(p, "")}</text>'
                   f'<rect x="{px}" y="{py}" width="{PW}" height="{PH}" fill="none" stroke="#444"/>')
        for rule in args.rules:
            points = " ".join(f"{x(pos):.1f},{y(v):.1f}" for pos, v in curves[p][rule])
            out.append(f'<polyline points="{points}" fill="none" stroke="{RULE_COLORS[rule]}" stroke-width="1.5"/>')
    widths = ", ".join(str(max(1, (hi - lo) // args.points)) for lo, hi in bands(L, args.factor))
    out.append(f'<text x="{(left + W - right) / 2}" y="{H - 12}" text-anchor="middle">position in the window '
               f'(mean nll over seeds and over bins of {widths} positions, band by band)</text>'
               f'<text x="14" y="{(top + H - bottom) / 2}" transform="rotate(-90 14 {(top + H - bottom) / 2})" '
               f'text-anchor="middle">validation nll (nats/token)</text>')
    for k, rule in enumerate(args.rules):
        ly = top + 16 + 18 * k
        text = rule if rule == "none" else f"{rule} x{args.factor}"
        out.append(f'<line x1="{W - right + 12}" y1="{ly}" x2="{W - right + 32}" y2="{ly}" '
                   f'stroke="{RULE_COLORS[rule]}" stroke-width="2"/><text x="{W - right + 38}" y="{ly + 4}">'
                   f'{text}</text>')
    out.append("</svg>")
    path.write_text("\n".join(out) + "\n")


def main(argv):
    args = parse_args(argv)
    out, runs = Path(args.out), Path(args.runs)
    (out / "csv").mkdir(parents=True, exist_ok=True)
    runs.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    jobs = [(p, s) for p in args.fractions for s in args.seeds]
    missing = [(p, s) for p, s in jobs if not (runs / f"p{p:g}_s{s}" / "done").exists()]
    for k, (p, seed) in enumerate(missing):
        print(f"experiment_length: training {k + 1}/{len(missing)}: p = {p:g}, seed {seed} "
              f"({(time.time() - t0) / 60:.1f} min so far)", file=sys.stderr, flush=True)
        train_one(args, p, seed, runs / f"p{p:g}_s{seed}")

    bs = bands(args.train_len, args.factor)
    results = {p: {r: [[] for _ in bs] for r in args.rules} for p in args.fractions}
    curves, pairs = {}, {}
    for k, (p, seed) in enumerate(jobs):
        run_dir = runs / f"p{p:g}_s{seed}"
        stored = header_original_len(run_dir / "model.bin")
        if stored not in (0, args.train_len):
            sys.exit(f"experiment_length: {run_dir / 'model.bin'} was trained at {stored}, not --train-len "
                     f"{args.train_len}")
        print(f"experiment_length: scoring {k + 1}/{len(jobs)}: p = {p:g}, seed {seed}, rules "
              f"{' '.join(args.rules)} ({(time.time() - t0) / 60:.1f} min so far)", file=sys.stderr, flush=True)
        for rule in args.rules:
            sums, pairs[p] = score(args, run_dir, rule, out / "csv" / f"p{p:g}_s{seed}_{rule}.csv")
            for i, (lo, hi) in enumerate(bs):
                results[p][rule][i].append(band_mean(sums, lo, hi))
            curve = curves.setdefault(p, {}).setdefault(rule, [])
            curve.append(binned(sums, bs, args.points))
    for p in curves:  # mean over seeds, bin by bin
        for rule, per_seed in curves[p].items():
            curves[p][rule] = [(pts[0][0], statistics.mean(v for _, v in pts)) for pts in zip(*per_seed)]
    titles = {p: " (all rules coincide)" for p in args.fractions if len(args.rules) > 1
              and all(curves[p][r] == curves[p][args.rules[0]] for r in args.rules)}

    table = write_results(out / "results.md", results, pairs, args, "nll_by_position.svg")
    write_svg(out / "nll_by_position.svg", curves, args, pairs, titles)
    print(table)
    print(f"experiment_length: {len(jobs)} models x {len(args.rules)} rules, {(time.time() - t0) / 60:.1f} min; "
          f"wrote {out / 'results.md'} and {out / 'nll_by_position.svg'}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
