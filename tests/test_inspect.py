"""-m inspect: chunk norms and attention summaries against the NumPy reference; the CSV and SVG."""
import csv
import subprocess
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest

import hf_fixture
import reference
from conftest import ROOT, STORIES, TOK512, run
from test_prope_reference import SMALL, TEXT, export, tokens_of

CSV_COLUMNS = ["kind", "layer", "head", "pair", "frequency", "q_norm", "k_norm", "rotated", "bos", "current",
               "previous"]


def read_inspect_csv(path, config):
    L, H = config["num_hidden_layers"], config["num_attention_heads"]
    pairs = config["hidden_size"] // H // 2
    q, k, attn = np.zeros((L, H, pairs)), np.zeros((L, H, pairs)), np.zeros((L, H, 3))
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        l, h = int(row["layer"]), int(row["head"])
        if row["kind"] == "chunk":
            q[l, h, int(row["pair"])] = float(row["q_norm"])
            k[l, h, int(row["pair"])] = float(row["k_norm"])
        else:
            attn[l, h] = [float(row["bos"]), float(row["current"]), float(row["previous"])]
    return q, k, attn, rows


@pytest.mark.parametrize("p", [1.0, 0.5])
def test_inspect_numbers_equal_reference(tmp_path, p):
    config, tensors = hf_fixture.make_hf_checkpoint(tmp_path, **SMALL, seed=21)
    out = tmp_path / "model.bin"
    export(tmp_path, out)
    csv_path = tmp_path / "inspect.csv"
    r = run(out, "-z", TOK512, "-m", "inspect", "-p", TEXT, "--rope-fraction", p, "--csv", csv_path)
    assert r.returncode == 0, r.stderr
    q, k, attn, _ = read_inspect_csv(csv_path, config)
    expect = reference.inspect_stats(config, tensors, tokens_of(out), {"kind": "paper", "theta": 10000.0, "p": p})
    np.testing.assert_allclose(q, expect["qnorm"], rtol=1e-4)
    np.testing.assert_allclose(k, expect["knorm"], rtol=1e-4)
    np.testing.assert_allclose(attn, expect["attn"], rtol=1e-4, atol=1e-7)


def test_inspect_csv_has_documented_columns_and_svg_is_well_formed(tmp_path):
    csv_path, svg_path = tmp_path / "inspect.csv", tmp_path / "heatmap.svg"
    r = run(STORIES, "-z", TOK512, "-m", "inspect", "-p", "Once upon a time, there was a cat.",
            "--rope-fraction", 0.5, "--csv", csv_path)
    assert r.returncode == 0, r.stderr
    with open(csv_path, newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == CSV_COLUMNS
        rows = list(reader)
    chunks = [row for row in rows if row["kind"] == "chunk"]
    assert len(chunks) == 5 * 8 * 4 and len(rows) - len(chunks) == 5 * 8  # stories260K: 5 layers, 8 heads, 4 pairs
    assert [row["rotated"] for row in chunks[:4]] == ["1", "1", "0", "0"]  # p = 0.5: 2 of 4 pairs rotate
    assert float(chunks[0]["frequency"]) == 1.0
    # the terminal heatmap marks where the unrotated pairs begin
    assert "|" in r.stdout.decode() and "\u2588" in r.stdout.decode()
    s = subprocess.run([sys.executable, str(ROOT / "tools" / "inspect_svg.py"), str(csv_path), "-o", str(svg_path)],
                       capture_output=True, text=True)
    assert s.returncode == 0, s.stderr
    root = ET.parse(svg_path).getroot()
    assert root.tag.endswith("svg")
    rects = [e for e in root.iter() if e.tag.endswith("rect")]
    assert len(rects) >= 2 * len(chunks)  # a q cell and a k cell per chunk row


def test_inspect_needs_a_prompt():
    r = run(STORIES, "-z", TOK512, "-m", "inspect")
    assert r.returncode == 2 and b"needs a prompt" in r.stderr
