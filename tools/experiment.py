#!/usr/bin/env python3
"""The paper's central experiment, tiny: train RoPE, p-RoPE and NoPE models alike and compare.

    python3 tools/experiment.py            (make experiment)

Trains p in {0, 0.25, 0.5, 0.75, 1} with the same budget and seeds (train.py),
scores each model's held-out text with `run -m ppl` at the training length L and at
4L, and writes to --out:
    results.md     a Markdown table: mean and spread (min..max) over seeds
    val_loss.svg   validation loss against step, one line per p (mean over seeds)
    inspect_p*.svg `run -m inspect` of each p's first seed, drawn by tools/inspect_svg.py
    runs/          the trained models (a finished run is not trained again)
Standard library only; train.py needs PyTorch.
"""
import argparse
import csv
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COLORS = {0.0: "#888888", 0.25: "#1f77b4", 0.5: "#2ca02c", 0.75: "#ff7f0e", 1.0: "#d62728"}
SEQ_LEN_OFFSET = 32  # the header's seq_len: after magic, version and six int32 sizes
INSPECT_TEXT = ("And it came to pass, when the king had heard the words of the book of the law, that he rent his "
                "clothes. And the king commanded Hilkiah the priest, and Ahikam the son of Shaphan, saying,")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(ROOT / "experiment"))
    p.add_argument("--fractions", type=float, nargs="+", default=[0.0, 0.25, 0.5, 0.75, 1.0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--run", default=str(ROOT / "run"), help="the run binary")
    p.add_argument("--train-args", default="", help="more train.py flags, e.g. '--steps 20 --dim 32'")
    return p.parse_args(argv)


def label(p):
    return {0.0: "0 (NoPE)", 1.0: "1 (RoPE)"}.get(p, f"{p:g}")


def train_one(args, p, seed, run_dir):
    """Trains one model unless run_dir already holds a finished one."""
    if (run_dir / "model.bin").exists() and (run_dir / "done").exists():
        return
    cmd = [sys.executable, str(ROOT / "train.py"), "--out", str(run_dir), "--rope-fraction", str(p),
           "--seed", str(seed)] + args.train_args.split()
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    if r.returncode != 0:
        sys.exit(f"experiment: train.py failed for p={p} seed={seed}: {cmd}")
    (run_dir / "done").write_text(r.stdout)


def header_seq_len(model):
    with open(model, "rb") as f:
        f.seek(SEQ_LEN_OFFSET)
        return struct.unpack("<i", f.read(4))[0]


def ppl_nll(args, model, run_dir, seq_len):
    """run -m ppl on val.txt with windows of seq_len positions (a copy of the model with
    that seq_len in its header: the weights do not depend on it)."""
    if seq_len != header_seq_len(model):
        copy = run_dir / f"model_seq{seq_len}.bin"
        data = bytearray(model.read_bytes())
        data[SEQ_LEN_OFFSET:SEQ_LEN_OFFSET + 4] = struct.pack("<i", seq_len)
        copy.write_bytes(bytes(data))
        model = copy
    r = subprocess.run([args.run, str(model), "-z", str(run_dir / "tokenizer.bin"), "-m", "ppl", "-f",
                        str(run_dir / "val.txt")], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"experiment: run -m ppl failed: {r.stderr.strip()}")
    if model.name.startswith("model_seq"):
        model.unlink()
    return float(r.stdout.split("nll: ")[1].split()[0])


def read_log(run_dir):
    with open(run_dir / "log.csv") as f:
        return [(int(row["step"]), float(row["val_loss"])) for row in csv.DictReader(f)]


def spread(values):
    """'mean (min..max)' over seeds."""
    return f"{statistics.mean(values):.3f} ({min(values):.3f}..{max(values):.3f})"


def write_table(path, results, train_len):
    lines = ["| p | pairs rotating | val nll at L = %d (training length) | val nll at 4L = %d |" % (train_len,
                                                                                              4 * train_len),
             "|---|---:|---:|---:|"]
    for p, r in results.items():
        lines.append(f"| {label(p)} | {r['pairs']} | {spread(r['nll_L'])} | {spread(r['nll_4L'])} |")
    path.write_text("\n".join(lines) + "\n")
    return "\n".join(lines)


def write_plot(path, curves):
    """val loss against step, one polyline per p: a hand-written SVG."""
    W, H, left, right, top, bottom = 640, 400, 60, 150, 20, 50
    steps = [s for c in curves.values() for s, _ in c]
    losses = [v for c in curves.values() for _, v in c if _ > 0]
    x0, x1 = 0, max(steps)
    y0, y1 = min(losses) - 0.05, max(losses) + 0.05

    def x(s):
        return left + (s - x0) / (x1 - x0) * (W - left - right)

    def y(v):
        return top + (y1 - v) / (y1 - y0) * (H - top - bottom)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" '
           f'font-size="12"><rect width="{W}" height="{H}" fill="white"/>']
    for i in range(6):  # grid and axis labels
        v = y0 + (y1 - y0) * i / 5
        out.append(f'<line x1="{left}" y1="{y(v):.1f}" x2="{W - right}" y2="{y(v):.1f}" stroke="#eee"/>'
                   f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.2f}</text>')
        s = x0 + (x1 - x0) * i / 5
        out.append(f'<text x="{x(s):.1f}" y="{H - bottom + 16}" text-anchor="middle">{s:.0f}</text>')
    out.append(f'<text x="{(left + W - right) / 2}" y="{H - 12}" text-anchor="middle">step</text>'
               f'<text x="14" y="{(top + H - bottom) / 2}" transform="rotate(-90 14 {(top + H - bottom) / 2})" '
               f'text-anchor="middle">validation loss (nats/token, at L)</text>'
               f'<rect x="{left}" y="{top}" width="{W - left - right}" height="{H - top - bottom}" fill="none" '
               f'stroke="#444"/>')
    for k, (p, curve) in enumerate(curves.items()):
        points = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in curve if s > 0)  # step 0 is the untrained model
        color = COLORS.get(p, "#000")
        out.append(f'<polyline points="{points}" fill="none" stroke="{color}" stroke-width="2"/>')
        ly = top + 16 + 18 * k
        out.append(f'<line x1="{W - right + 12}" y1="{ly}" x2="{W - right + 32}" y2="{ly}" stroke="{color}" '
                   f'stroke-width="2"/><text x="{W - right + 38}" y="{ly + 4}">p = {label(p)}</text>')
    out.append("</svg>")
    path.write_text("\n".join(out) + "\n")


def main(argv):
    args = parse_args(argv)
    out = Path(args.out)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    jobs = [(p, s) for p in args.fractions for s in args.seeds]
    t0 = time.time()
    for k, (p, seed) in enumerate(jobs):
        elapsed = time.time() - t0
        eta = f", about {elapsed / k * (len(jobs) - k) / 60:.0f} min left" if k else ""
        print(f"experiment: training {k + 1}/{len(jobs)}: p = {p:g}, seed {seed} ({elapsed / 60:.1f} min so far{eta})",
              file=sys.stderr, flush=True)
        train_one(args, p, seed, out / "runs" / f"p{p:g}_s{seed}")

    results, curves = {}, {}
    for p in args.fractions:
        r = results[p] = {"nll_L": [], "nll_4L": []}
        logs = []
        for seed in args.seeds:
            run_dir = out / "runs" / f"p{p:g}_s{seed}"
            model = run_dir / "model.bin"
            max_len = header_seq_len(model)
            r["nll_4L"].append(ppl_nll(args, model, run_dir, max_len))
            r["nll_L"].append(ppl_nll(args, model, run_dir, max_len // 4))
            logs.append(read_log(run_dir))
        rope_line = (out / "runs" / f"p{p:g}_s{args.seeds[0]}" / "done").read_text().splitlines()[0]
        r["pairs"] = rope_line.split("(")[1].split(" rotate")[0]  # "4 of 16 pairs"
        curves[p] = [(step, statistics.mean(log[i][1] for log in logs)) for i, (step, _) in enumerate(logs[0])]
        # the frequency-usage picture of the first seed's model
        first = out / "runs" / f"p{p:g}_s{args.seeds[0]}"
        csv_path = out / f"inspect_p{p:g}.csv"
        r_inspect = subprocess.run([args.run, str(first / "model.bin"), "-z", str(first / "tokenizer.bin"), "-m",
                                    "inspect", "-p", INSPECT_TEXT, "--csv", str(csv_path)], capture_output=True,
                                   text=True)
        if r_inspect.returncode != 0:
            sys.exit(f"experiment: run -m inspect failed: {r_inspect.stderr.strip()}")
        (out / f"inspect_p{p:g}.txt").write_text(r_inspect.stdout)
        subprocess.run([sys.executable, str(ROOT / "tools" / "inspect_svg.py"), str(csv_path), "-o",
                        str(out / f"inspect_p{p:g}.svg")], check=True, capture_output=True)

    train_len = header_seq_len(out / "runs" / f"p{args.fractions[0]:g}_s{args.seeds[0]}" / "model.bin") // 4
    table = write_table(out / "results.md", results, train_len)
    write_plot(out / "val_loss.svg", curves)
    print(table)
    print(f"experiment: {len(jobs)} runs, {(time.time() - t0) / 60:.1f} min; wrote {out / 'results.md'}, "
          f"{out / 'val_loss.svg'} and inspect_p*.svg", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
