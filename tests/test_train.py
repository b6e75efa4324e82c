"""train.py: a short training run is scored by run -m ppl as train.py scores it, its header
carries the requested rotation, and its forward pass is the NumPy reference's.

Needs PyTorch and the bible-kjv package (.ci/run installs both); skipped without them.
"""
import csv
import re
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest

import reference
from conftest import ROOT, run

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(shutil.which("bible") is None, reason="bible-kjv is not installed")
sys.path.insert(0, str(ROOT))
import train  # noqa: E402

TINY = ["--steps", 30, "--dim", 32, "--layers", 2, "--heads", 2, "--vocab", 384, "--seq-len", 32,
        "--eval-every", 10, "--val-chars", 4000]


@pytest.fixture(scope="session")
def cache(tmp_path_factory):
    """One corpus and tokenizer for every run here."""
    return tmp_path_factory.mktemp("train_cache")


def train_tiny(out, cache, *flags):
    cmd = [sys.executable, str(ROOT / "train.py"), "--out", str(out), "--cache", str(cache)] + [str(f) for f in
                                                                                                TINY + list(flags)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def read_log(out):
    with open(out / "log.csv") as f:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]


def ppl_nll(out):
    r = run(out / "model.bin", "-z", out / "tokenizer.bin", "-m", "ppl", "-f", out / "val.txt")
    assert r.returncode == 0, r.stderr
    return float(re.search(rb"^nll: (\S+)$", r.stdout, re.M).group(1))


@pytest.mark.parametrize("p", [1.0, 0.25, 0.0])
def test_short_run_learns_and_run_scores_val_as_train_py_does(tmp_path, cache, p):
    r = train_tiny(tmp_path, cache, "--rope-fraction", p)
    assert r.returncode == 0, r.stderr[-2000:]
    assert re.search(r"^step 30/30 \| loss \S+ \| \S+ tok/s \| \S+ left$", r.stderr, re.M)  # the progress line
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("val_nll: ")
    val_nll = float(last.split()[1])
    log = read_log(tmp_path)
    assert [row["step"] for row in log] == [0, 10, 20, 30]
    assert log[-1]["val_loss"] < log[0]["val_loss"] - 0.5  # from about log(384) = 5.95 down
    assert log[-1]["train_loss"] < log[1]["train_loss"]
    got = ppl_nll(tmp_path)
    assert abs(got - val_nll) <= 1e-4 * abs(val_nll), f"run -m ppl {got} vs train.py {val_nll}"


def test_header_carries_theta_and_p_and_inspect_marks_the_pair(tmp_path, cache):
    r = train_tiny(tmp_path, cache, "--rope-fraction", 0.25, "--rope-theta", 500000, "--steps", 2)
    assert r.returncode == 0, r.stderr[-2000:]
    head = (tmp_path / "model.bin").read_bytes()[:64]
    magic, version, dim, hidden, layers, heads, kv, vocab, seq_len, shared = struct.unpack("<Ii7ii", head[:40])
    eps, theta, p, scale = struct.unpack("<4f", head[40:56])
    assert (magic, version, dim, layers, heads, vocab, seq_len) == (0x45504F52, 1, 32, 2, 2, 384, 128)
    assert theta == 500000.0 and p == 0.25 and scale == 1.0
    # no scaling rule (rope_factor 1 above, rope_scaling 0); rope_original_len is the training window
    # --seq-len 32, while the header's seq_len is --max-seq-len (4x: 128)
    rule, original_len = struct.unpack("<2i", head[56:64])
    assert (rule, original_len) == (0, 32)
    assert not any((tmp_path / "model.bin").read_bytes()[64:256])  # the other rule fields and the reserved bytes
    # head size 16: 8 pairs, p = 0.25 rotates the first 2
    r = run(tmp_path / "model.bin", "-z", tmp_path / "tokenizer.bin", "-m", "inspect", "-p", "And God said")
    assert r.returncode == 0, r.stderr
    rows = re.findall(r"^L\d+\s+H\d+\s+q (\S+)\s+k (\S+)$", r.stdout.decode(), re.M)
    assert len(rows) == 4
    assert all(q.index("|") == 2 and k.index("|") == 2 and len(q) == 9 for q, k in rows)
    assert b"theta 500000, fraction 0.25 (2 of 8 pairs rotate)" in r.stderr


def hf_tensors(model, cfg):
    """The model's weights under Hugging Face names, float64, with each head's q and k rows
    reordered from run.c's adjacent pairs (2i, 2i+1) to HF's half-split pairs (i, i + hd/2)."""
    hd = cfg.dim // cfg.heads
    half_split = np.concatenate([np.arange(0, hd, 2), np.arange(1, hd, 2)])

    def heads_reordered(w, n):
        return w.reshape(n, hd, -1)[:, half_split, :].reshape(n * hd, -1)

    def t(x):
        return x.detach().numpy().astype(np.float64)

    W = {"model.embed_tokens.weight": t(model.embedding.weight), "model.norm.weight": t(model.rms_final)}
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        W[p + "input_layernorm.weight"] = t(layer.rms_att)
        W[p + "self_attn.q_proj.weight"] = heads_reordered(t(layer.wq.weight), cfg.heads)
        W[p + "self_attn.k_proj.weight"] = heads_reordered(t(layer.wk.weight), cfg.kv_heads)
        W[p + "self_attn.v_proj.weight"] = t(layer.wv.weight)
        W[p + "self_attn.o_proj.weight"] = t(layer.wo.weight)
        W[p + "post_attention_layernorm.weight"] = t(layer.rms_ffn)
        W[p + "mlp.gate_proj.weight"] = t(layer.w1.weight)
        W[p + "mlp.down_proj.weight"] = t(layer.w2.weight)
        W[p + "mlp.up_proj.weight"] = t(layer.w3.weight)
    return W


@pytest.mark.parametrize("p,theta", [(1.0, 10000.0), (0.5, 10000.0), (0.25, 500.0), (0.0, 10000.0)])
def test_train_forward_equals_numpy_reference(p, theta):
    cfg = train.parse_args(["--out", "unused", "--dim", "64", "--heads", "4", "--kv-heads", "2", "--layers", "2",
                            "--vocab", "512", "--rope-fraction", str(p), "--rope-theta", str(theta),
                            "--seq-len", "40"])
    torch.manual_seed(1)
    model = train.build_model(cfg)
    with torch.no_grad():  # norms away from 1 and weights large enough that rotation matters
        for param in model.parameters():
            if param.dim() == 1:
                param.copy_(1 + 0.2 * torch.randn_like(param))
            else:
                param.mul_(8.0)
    tokens = np.random.default_rng(2).integers(0, 512, size=40)
    with torch.no_grad():
        got = model(torch.tensor(tokens)[None])[0].double().numpy()
    config = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
              "rms_norm_eps": 1e-5, "tie_word_embeddings": True}
    expect = reference.forward(config, hf_tensors(model, cfg), tokens, {"kind": "paper", "theta": theta, "p": p})
    assert np.abs(got - expect).max() <= 1e-4 * np.abs(expect).max()
    # guards the comparison against a forward pass that ignores position
    nope = reference.forward(config, hf_tensors(model, cfg), tokens, {"kind": "paper", "theta": theta, "p": 0.0})
    assert p == 0.0 or np.abs(nope - expect).max() > 1e-2 * np.abs(expect).max()


@pytest.mark.parametrize("flags,message", [
    (["--rope-fraction", "2"], "--rope-fraction must be in [0, 1]"),
    (["--rope-theta", "0"], "--rope-theta must be a finite number > 0"),
    (["--dim", "30", "--heads", "4"], "--dim 30 must split into 4 heads of an even size"),
    (["--heads", "4", "--kv-heads", "3"], "--heads 4 must be a multiple of --kv-heads 3"),
    (["--vocab", "100"], "--vocab must be in [384, 32000]"),
    (["--steps", "0"], "--steps must be >= 1"),
    (["--seq-len", "64", "--max-seq-len", "32"], "--max-seq-len 32 is shorter than --seq-len 64"),
    (["--steps", "many"], "invalid int value: 'many'"),
])
def test_bad_flags_give_one_line_and_exit_2(tmp_path, flags, message):
    r = subprocess.run([sys.executable, str(ROOT / "train.py"), "--out", str(tmp_path / "o")] + flags,
                       capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and message in r.stderr, r.stderr
    assert not (tmp_path / "o").exists()
