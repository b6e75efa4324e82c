"""run.c's p-RoPE against the independent NumPy reference (tests/reference.py).

Each test writes a small random Hugging Face checkpoint (tests/hf_fixture.py),
exports it with export.py (which permutes q/k rows from HF's half-split pairs to
run.c's adjacent pairs), and compares run.c's nll and greedy tokens with the
reference's, computed in HF layout with the paper's half-split rotation.
"""
import re

import numpy as np
import pytest

import conftest
import hf_fixture
import reference
from conftest import TOK512, export, run

TEXT = ("Once upon a time, there was a little girl named Lily. She loved to play outside "
        "in the park with her dog. One day she saw a big red ball.")
FRACTIONS = [1.0, 0.75, 0.5, 0.25, 0.0]
THETAS = [10000.0, 500000.0]
SMALL = dict(dim=64, hidden_dim=96, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=512, seq_len=128)


def tokens_of(model, text=TEXT):
    return conftest.tokens_of(model, text)


def run_nll(model, *flags, text=TEXT):
    r = run(model, "-z", TOK512, "-m", "ppl", "-p", text, *flags)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.decode().splitlines()
    assert lines[-2].startswith("nll: ") and lines[-1].startswith("perplexity: ")
    return float(lines[-2].split()[1]), float(lines[-1].split()[1])


def run_greedy(model, n_new, *flags):
    tokens = tokens_of(model)
    r = run(model, "-z", TOK512, "-t", 0, "-n", len(tokens) + n_new - 1, "-v", "-p", TEXT, *flags)
    assert r.returncode == 0, r.stderr
    ids = re.search(rb"^generated:(.*)$", r.stderr, re.M).group(1).split()
    return [int(i) for i in ids]


def reference_nll(config, tensors, tokens, rope):
    return reference.nll(reference.forward(config, tensors, tokens, rope), tokens)


def assert_close(got, expect, rel=1e-4):
    assert abs(got - expect) <= rel * abs(expect), f"run.c {got} vs reference {expect}"


@pytest.fixture(scope="module")
def plain_model(tmp_path_factory):
    """A RoPE checkpoint (theta 10000, p = 1 in config.json), exported once."""
    d = tmp_path_factory.mktemp("hf_plain")
    config, tensors = hf_fixture.make_hf_checkpoint(d, **SMALL, seed=3)
    out = d / "model.bin"
    export(d, out)
    return config, tensors, out


@pytest.mark.parametrize("theta", THETAS)
@pytest.mark.parametrize("p", FRACTIONS)
def test_nll_matches_reference_with_rope_stored_in_file(tmp_path, plain_model, p, theta):
    config, tensors, _ = plain_model
    out = tmp_path / "model.bin"
    export(plain_model[2].parent, out,
           "--rope-theta", theta, "--rope-fraction", p)
    tokens = tokens_of(out)
    got, ppl = run_nll(out)
    expect = reference_nll(config, tensors, tokens, {"kind": "paper", "theta": theta, "p": p})
    assert_close(got, expect)
    assert_close(ppl, np.exp(expect))


@pytest.mark.parametrize("theta", THETAS)
@pytest.mark.parametrize("p", FRACTIONS)
def test_nll_matches_reference_with_rope_given_as_overrides(plain_model, p, theta):
    config, tensors, out = plain_model
    tokens = tokens_of(out)
    got, _ = run_nll(out, "--rope-theta", theta, "--rope-fraction", p)
    expect = reference_nll(config, tensors, tokens, {"kind": "paper", "theta": theta, "p": p})
    assert_close(got, expect)


@pytest.mark.parametrize("p", [1.0, 0.5, 0.0])
def test_greedy_continuation_matches_reference_token_for_token(plain_model, p):
    config, tensors, out = plain_model
    tokens = tokens_of(out)
    rope = {"kind": "paper", "theta": 10000.0, "p": p}
    assert run_greedy(out, 12, "--rope-fraction", p) == reference.greedy(config, tensors, tokens, 12, rope)


def test_different_fractions_give_different_predictions(plain_model):
    # guards the tests above against a runner that ignores p
    _, _, out = plain_model
    nlls = {p: run_nll(out, "--rope-fraction", p)[0] for p in FRACTIONS}
    assert len(set(round(v, 6) for v in nlls.values())) == len(FRACTIONS)


@pytest.mark.parametrize("variant", [
    dict(dtype="BF16", tied=True, sharded=False),
    dict(dtype="F32", tied=False, sharded=True),
    dict(dtype="F16", tied=False, sharded=False, n_kv_heads=1),
    dict(dtype="BF16", tied=True, sharded=True, n_kv_heads=4),
], ids=["bf16-tied", "f32-untied-sharded", "f16-untied-mqa", "bf16-tied-sharded-mha"])
def test_dtypes_tying_sharding_and_gqa_match_reference(tmp_path, variant):
    shape = dict(SMALL, **{k: v for k, v in variant.items() if k == "n_kv_heads"})
    opts = {k: v for k, v in variant.items() if k != "n_kv_heads"}
    config, tensors = hf_fixture.make_hf_checkpoint(tmp_path, **shape, **opts, seed=5,
                                                    rope={"type": "default", "theta": 500000.0})
    out = tmp_path / "model.bin"
    export(tmp_path, out)
    tokens = tokens_of(out)
    for p in (1.0, 0.5):
        got, _ = run_nll(out, "--rope-fraction", p)
        assert_close(got, reference_nll(config, tensors, tokens, {"kind": "paper", "theta": 500000.0, "p": p}))


@pytest.mark.parametrize("layout", ["v4", "v5"])
def test_proportional_rope_checkpoint_is_the_papers_prope(tmp_path, layout):
    # transformers' "proportional" rope_type (Gemma 4) scored by the paper's reference
    rope_cfg = {"type": "proportional", "theta": 1000000.0, "partial_rotary_factor": 0.25}
    if layout == "v4":
        rope_cfg["theta"] = 10000.0
    config, tensors = hf_fixture.make_hf_checkpoint(tmp_path, **SMALL, seed=7, layout=layout, rope=rope_cfg)
    rope = reference.rope_from_config(config)
    assert rope["kind"] == "paper" and rope["p"] == 0.25
    out = tmp_path / "model.bin"
    export(tmp_path, out)
    tokens = tokens_of(out)
    got, _ = run_nll(out)
    assert_close(got, reference_nll(config, tensors, tokens, rope))


@pytest.mark.parametrize("factor", [0.5, 0.25, 0.75])
def test_neox_partial_rotary_factor_converts_exactly(tmp_path, factor):
    # GPT-NeoX semantics (frequencies over the rotated dims) scored by a NeoX-style
    # reference; export stores it as p-RoPE with theta = base^(1/f), p = f
    config, tensors = hf_fixture.make_hf_checkpoint(
        tmp_path, **SMALL, seed=11, rope={"type": "default", "theta": 10000.0, "partial_rotary_factor": factor})
    rope = reference.rope_from_config(config)
    assert rope["kind"] == "neox"
    out = tmp_path / "model.bin"
    r = export(tmp_path, out)
    assert "partial_rotary_factor" in r.stderr  # the conversion is announced
    tokens = tokens_of(out)
    got, _ = run_nll(out)
    assert_close(got, reference_nll(config, tensors, tokens, rope))
    # and it is NOT the paper's p-RoPE with the same theta: the distinction matters
    wrong = reference_nll(config, tensors, tokens, {"kind": "paper", "theta": 10000.0, "p": factor})
    assert abs(got - wrong) > 1e-3


def test_rope_scale_factor_is_applied(tmp_path):
    rope_cfg = {"type": "proportional", "theta": 10000.0, "partial_rotary_factor": 0.5, "factor": 4.0}
    config, tensors = hf_fixture.make_hf_checkpoint(tmp_path, **SMALL, seed=13, layout="v5", rope=rope_cfg)
    out = tmp_path / "model.bin"
    export(tmp_path, out)
    got, _ = run_nll(out)
    assert_close(got, reference_nll(config, tensors, tokens_of(out), reference.rope_from_config(config)))


def test_perplexity_windows_cover_long_text(tmp_path):
    # seq_len 16: the text is scored in windows of 15 tokens, each after a fresh BOS
    config, tensors = hf_fixture.make_hf_checkpoint(tmp_path, **dict(SMALL, seq_len=16), seed=17)
    out = tmp_path / "model.bin"
    export(tmp_path, out)
    tokens = tokens_of(out)
    text_tokens = tokens[1:]
    rope = {"kind": "paper", "theta": 10000.0, "p": 1.0}
    total = 0.0
    for start in range(0, len(text_tokens), 15):
        window = [1] + text_tokens[start:start + 15]
        total += reference_nll(config, tensors, window, rope) * (len(window) - 1)
    r = run(out, "-z", TOK512, "-m", "ppl", "-p", TEXT)
    lines = r.stdout.decode().splitlines()
    assert f"windows: {-(-len(text_tokens) // 15)}" in lines
    assert_close(float(lines[-2].split()[1]), total / len(text_tokens))
