"""The decode matmul's reading orders (run.c, "Making it fast", section 2).

Each order reads the weight rows in another pattern but computes every row as the same dot()
chain, so forcing any of them (RUN_READ_ORDER) must give the same tokens and text, bit for bit,
in float32 and bf16 files, on one thread and two; decode's first tokens try them, a layer each,
on a model whose matrices are too large for a cache, and the tokens of that trial are the same
too; -v says which order decode kept, and a tiny model is not tried.
(That each order equals the plain matmul on odd sizes is tests/test_rope.c's.)
"""
import os
import re
import subprocess

import pytest

from conftest import RUN_BIN, RUN_PREFIX, STORIES, TOK512
import ropefile

ORDERS = ["quarters-prefetch", "quarters", "adjacent", "rows"]
# 6 layers of dim 264 (33 vectors a row), hidden 708 (88 vectors and a tail of 4): about 18 MB of
# float32 matrices and 9 MB of bf16, both above the 8 MB (8 << 20 bytes) below which run does not time
DIMS = dict(dim=264, hidden_dim=708, n_layers=6, n_heads=4, n_kv_heads=2, vocab_size=512, seq_len=64)
ARGS = ["-z", TOK512, "-t", 1, "-s", 7, "-n", 24, "-v", "-p", "Once upon a time"]
TEXT = "Once upon a time there was a girl who liked to run in the park with her dog"


def run_with(model, *args, order=None, threads=1):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    env.pop("RUN_READ_ORDER", None)
    if order is not None:
        env["RUN_READ_ORDER"] = order
    cmd = RUN_PREFIX + [RUN_BIN, str(model)] + [str(a) for a in args]
    return subprocess.run(cmd, capture_output=True, timeout=300, env=env, stdin=subprocess.DEVNULL)


def generated(r):
    assert r.returncode == 0, r.stderr.decode()
    return r.stdout, re.search(rb"^generated:(.*)$", r.stderr, re.M).group(1).split()


def read_order_line(r):
    return re.search(rb"^run: decode read order: (\S+) \((.*)\)$", r.stderr, re.M)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("read_order")
    tensors = ropefile.random_weights(**{k: DIMS[k] for k in ("dim", "hidden_dim", "n_layers", "n_heads",
                                                               "n_kv_heads", "vocab_size")}, seed=3)
    bf16, _ = ropefile.as_16bit(tensors, "bf16")
    return {"f32": ropefile.write_checkpoint(d / "f32.bin", tensors, DIMS, "f32"),
            "bf16": ropefile.write_checkpoint(d / "bf16.bin", bf16, DIMS, "bf16")}


def scores(model, tmp_path, order, threads):
    """-m ppl's per-position nll as CSV (nine digits: every bit of the float32 values), which the
    whole forward pass and every logit feed."""
    csv = tmp_path / f"{order}-{threads}.csv"
    r = run_with(model, "-z", TOK512, "-m", "ppl", "-p", TEXT, "--csv", csv, order=order, threads=threads)
    assert r.returncode == 0, r.stderr.decode()
    return r.stdout, csv.read_bytes()


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("weights", ["f32", "bf16"])
def test_every_forced_read_order_generates_and_scores_the_same(models, tmp_path, weights, threads):
    outputs = {o: generated(run_with(models[weights], *ARGS, order=o, threads=threads)) for o in ORDERS}
    nll = {o: scores(models[weights], tmp_path, o, threads) for o in ORDERS}
    assert len(outputs[ORDERS[0]][1]) > 10 and nll[ORDERS[0]][1].count(b"\n") > 10
    for o in ORDERS[1:]:
        assert outputs[o] == outputs[ORDERS[0]], o
        assert nll[o] == nll[ORDERS[0]], o


def test_forced_read_order_is_said_with_v(models):
    r = run_with(models["f32"], *ARGS, order="adjacent")
    m = read_order_line(r)
    assert m and m.group(1) == b"adjacent" and m.group(2) == b"RUN_READ_ORDER"


@pytest.mark.parametrize("weights", ["f32", "bf16"])
def test_tried_read_order_is_named_and_generates_the_same_tokens(models, weights):
    # 6 layers and 19 decoded tokens: the trial's 64 layers end in the 11th token
    r = run_with(models[weights], *ARGS, threads=2)
    m = read_order_line(r)
    assert m, r.stderr.decode()
    assert m.group(1).decode() in ORDERS
    assert m.group(2).startswith(b"tried on decode's first 64 layers, lower quartile ms:")
    for o in ORDERS:  # every order was timed, in milliseconds per layer
        assert re.search(rb" " + o.encode() + rb" \d+\.\d{3}\b", m.group(2)), o
    assert generated(r) == generated(run_with(models[weights], *ARGS, order="rows", threads=2))


def test_decode_shorter_than_the_trial_keeps_the_default_and_says_so(models):
    # a 5-token prompt, then 3 tokens decoded: 3 x 6 layers of the trial's 64
    args = ARGS[:ARGS.index("-n")] + ["-n", 8] + ARGS[ARGS.index("-n") + 2:]
    r = run_with(models["f32"], *args)
    m = read_order_line(r)
    assert m and m.group(1) == b"quarters-prefetch", r.stderr.decode()
    assert m.group(2) == b"the default: decode ended 18 layers into the trial of 64"
    assert generated(r) == generated(run_with(models["f32"], *args, order="adjacent"))


def test_tiny_model_is_not_tried():
    r = run_with(STORIES, "-z", TOK512, "-t", 0, "-n", 4, "-v", "-p", "Once")
    m = read_order_line(r)
    assert m and m.group(1) == b"quarters-prefetch" and m.group(2).startswith(b"not tried")


def test_unknown_read_order_is_a_command_line_error():
    r = run_with(STORIES, "-z", TOK512, "-n", 4, order="diagonal")
    assert r.returncode == 2
    lines = r.stderr.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith("run: error: unknown RUN_READ_ORDER 'diagonal'")
    assert r.stdout == b""
