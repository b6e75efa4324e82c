"""Self-checks of tests/family_reference.py (the families' NumPy forward pass) and
tests/family_fixtures.py (the published configs and their shrunk checkpoints).

  1. The Llama path against ./run: checkpoints exported with today's export.py (a Llama
     one, float32 and bf16, and the Mistral fixture with a window wider than the text):
     run's `-m ppl` within 1e-4 relative, greedy tokens equal. This ties the reference to a
     known-good implementation.
  2. Properties from the papers and the modeling code: NoPE keys do not depend on position;
     partial_rotary_factor f is p-RoPE with theta' = theta^(1/f); Gemma's (1 + w) norm is a
     plain norm with w + 1; a sliding layer does not see tokens before its window; soft-cap
     bounds; longrope's short factors within the original length and long ones beyond;
     causality; the layer patterns of the real configs.
  3. Published numbers: longrope's attention factor for Phi-4-mini (llama.cpp's GGUF
     metadata phi3.rope.scaling.attn_factor = 1.190238) and Gemma 3's bf16 embedding
     scale (modeling_gemma3.py: sqrt(3072) = 55.4256 becomes 55.5).

Run with: /usr/bin/python3 -m pytest -q tests/test_family_reference.py (a few seconds).
"""
import copy
import math
import re

import numpy as np
import pytest

import conftest
import family_fixtures as FF
import family_reference as R
import hf_fixture
from conftest import TOK512, export, run

TEXT = ("Once upon a time, there was a little girl named Lily. She loved to play outside "
        "in the park with her dog. One day she saw a big red ball.")


def small(name, **kw):
    """(config, tensors) of model `name` shrunk, without writing files."""
    config = FF.shrink(name, **kw)
    return config, FF.make_weights(config, np.random.default_rng(FF.ISSUE_MODELS.index(name)
                                                                   if name in FF.ISSUE_MODELS else 0))


def with_layers(config, n):
    c = copy.deepcopy(config)
    t = R.text_config(c)
    t["num_hidden_layers"] = n
    for key in ("layer_types", "no_rope_layers"):
        if key in t:
            t[key] = t[key][:n]
    return c


def rel(a, b):
    return abs(a - b) / abs(b)


# =====================================================================================
# 1. The Llama path against ./run
# =====================================================================================


def run_nll(model):
    r = run(model, "-z", TOK512, "-m", "ppl", "-p", TEXT)
    assert r.returncode == 0, r.stderr.decode()
    lines = r.stdout.decode().splitlines()
    assert lines[-2].startswith("nll: "), lines
    return float(lines[-2].split()[1])


def run_greedy(model, n_prompt, n_new):
    r = run(model, "-z", TOK512, "-t", 0, "-n", n_prompt + n_new - 1, "-v", "-p", TEXT)
    assert r.returncode == 0, r.stderr.decode()
    return [int(i) for i in re.search(rb"^generated:(.*)$", r.stderr, re.M).group(1).split()]


def check_against_run(config, tensors, out):
    tokens = conftest.tokens_of(out, TEXT)
    expect = R.nll(R.forward(config, tensors, tokens), tokens)
    got = run_nll(out)
    assert rel(got, expect) <= 1e-4, f"run {got} vs reference {expect}"
    expect = R.greedy(config, tensors, tokens, 6)
    if 1 in expect:  # run stops when the model emits BOS (llama2.c), without printing it
        expect = expect[:expect.index(1)]
    assert len(expect) >= 3, "guard: too short a continuation to compare"
    assert run_greedy(out, len(tokens), 6) == expect
    return tokens


@pytest.mark.parametrize("dtype", ["F32", "BF16"])
def test_llama_path_matches_run_ppl_and_greedy_tokens(tmp_path, dtype):
    config, tensors = hf_fixture.make_hf_checkpoint(tmp_path, dim=64, hidden_dim=96, n_layers=2, n_heads=4,
                                                    n_kv_heads=2, vocab_size=512, seq_len=128, dtype=dtype,
                                                    seed=11, rope={"theta": 500000.0})
    out = tmp_path / "model.bin"
    export(tmp_path, out)
    check_against_run(config, tensors, out)


@pytest.mark.parametrize("dtype", ["F32", "BF16"])
def test_mistral_fixture_with_a_window_wider_than_the_text_matches_run(tmp_path, dtype):
    # today's export.py drops the window (with a warning); wider than the text it changes nothing
    config, tensors = FF.write_checkpoint(tmp_path, "Mistral-7B-v0.1", dtype, window=512)
    assert config["sliding_window"] == 512 and "lm_head.weight" in tensors
    out = tmp_path / "model.bin"
    export(tmp_path, out)
    tokens = check_against_run(config, tensors, out)
    assert len(tokens) > 16
    # guard: the issue's small window changes the answer, so matching run here says nothing about it
    narrow = dict(config, sliding_window=8)
    wide_nll = R.nll(R.forward(config, tensors, tokens), tokens)
    assert rel(R.nll(R.forward(narrow, tensors, tokens), tokens), wide_nll) > 1e-3


# =====================================================================================
# 2. Properties
# =====================================================================================


def test_nope_layer_keys_do_not_depend_on_position():
    config, tensors = small("SmolLM3-3B")
    late = [9, 10, 11, 12, 5, 6, 7]  # tokens 5, 6, 7 at positions 4..6 instead of 0..2
    for flags, same in (([0, 1, 1, 1], True), ([1, 1, 1, 0], False)):
        c = dict(config, no_rope_layers=flags)
        k0 = R.layer_keys(c, tensors, [5, 6, 7])
        k4 = R.layer_keys(c, tensors, late)[4:]
        assert np.allclose(k0, k4, rtol=0, atol=1e-12) == same, flags


def test_smollm3_every_fourth_layer_is_nope():
    real = FF.REAL_CONFIGS["SmolLM3-3B"]
    assert [i for i, r in enumerate(R.rotating_layers(real)) if not r] == list(range(3, 36, 4))
    assert R.rotating_layers(FF.shrink("SmolLM3-3B")) == [True, True, True, False]
    # the default pattern when no_rope_layers is absent (configuration_smollm3.py)
    bare = {k: v for k, v in real.items() if k != "no_rope_layers"}
    assert R.rotating_layers(bare) == R.rotating_layers(real)
    # a NoPE layer's plan has no rotation at all
    assert R.Plan(FF.shrink("SmolLM3-3B"), 10).rope[3] is None


@pytest.mark.parametrize("hd,f", [(128, 0.75), (128, 0.5), (16, 0.25), (96, 1.0)])
def test_partial_rotary_is_p_rope_with_theta_to_the_one_over_f(hd, f):
    theta = 10000.0
    config = {"model_type": "phi3", "hidden_size": hd, "num_attention_heads": 1, "num_hidden_layers": 1,
              "max_position_embeddings": 64, "rope_theta": theta, "partial_rotary_factor": f}
    inv, af = R.inverse_frequencies(config, R.rope_settings(config)["full_attention"], 10)
    r = int(hd * f)
    i = np.arange(r // 2)
    # the rotated dims' frequencies theta^(-2i/(f hd)) = (theta^(1/f))^(-2i/hd)
    np.testing.assert_allclose(inv, (theta ** (1 / f)) ** (-2.0 * i / hd), rtol=1e-12)
    assert af == 1.0
    # the same rotation as the paper's p-RoPE in half-split pairs (i, i + hd/2) with p = f:
    # move NeoX's dims [0, r/2) and [r/2, r) to [0, r/2) and [hd/2, hd/2 + r/2)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(7, 1, hd))
    pos = np.arange(3, 10)
    neox = R.rotate(x, pos, inv)
    order = np.concatenate([np.arange(r // 2), np.arange(r, r + (hd - r) // 2),
                            np.arange(r // 2, r), np.arange(r + (hd - r) // 2, hd)])
    paper_inv = np.zeros(hd // 2)
    paper_inv[: r // 2] = (theta ** (1 / f)) ** (-2.0 * i / hd)  # pairs past p * hd / 2: not rotated
    paper = R.rotate(x[..., order], pos, paper_inv)
    np.testing.assert_allclose(paper, neox[..., order], rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["Gemma-2B", "Gemma-2-2B", "Gemma-3-1B"])
def test_gemma_one_plus_w_norm_equals_plain_norm_with_w_plus_one(name):
    config, tensors = small(name)
    tokens = list(range(3, 23))
    folded = {n: a + 1.0 if n.endswith("norm.weight") else a for n, a in tensors.items()}
    expect = R.forward(config, tensors, tokens)
    np.testing.assert_allclose(R.forward(config, folded, tokens, folded_norms=True), expect, rtol=1e-11, atol=1e-11)
    # guard: the +1 matters (the weights are near 0, so x * w alone would be far off)
    assert not np.allclose(R.forward(config, tensors, tokens, folded_norms=True), expect, atol=1e-3)


def changed_positions(config, tensors, tokens, j):
    """Positions whose logits change when token j changes."""
    other = list(tokens)
    other[j] = (other[j] + 1) % 512
    a, b = R.forward(config, tensors, tokens), R.forward(config, tensors, other)
    return [t for t in range(len(tokens)) if not np.allclose(a[t], b[t], rtol=0, atol=1e-12)]


@pytest.mark.parametrize("name,window", [("Mistral-7B-v0.1", 8), ("Gemma-2-2B", 8), ("Phi-3-mini-4k", 7),
                                         ("Gemma-3-270M", 8)])
def test_sliding_window_hides_tokens_before_the_window(name, window):
    # one layer: Gemma 2's and Gemma 3's first layer is a sliding one
    config, tensors = small(name)
    config = with_layers(config, 1)
    assert R.layer_windows(R.text_config(config)) == [window]
    # softer attention, so that every key in the window visibly contributes
    tensors = {n: a * 0.2 if n.endswith(("q_proj.weight", "qkv_proj.weight")) else a for n, a in tensors.items()}
    tokens = [int(t) for t in np.random.default_rng(1).integers(3, 500, size=24)]
    j = 4
    # query t sees keys t - W + 1 .. t: token j reaches positions j .. j + W - 1 only
    assert changed_positions(config, tensors, tokens, j) == list(range(j, j + window))


def test_unused_and_global_windows_see_every_earlier_token():
    # Qwen2.5's window is off (use_sliding_window false), though the fixture made it 8
    config, tensors = small("Qwen2.5-0.5B")
    assert config["sliding_window"] == 8 and not config["use_sliding_window"]
    tokens = list(range(3, 27))
    assert changed_positions(config, tensors, tokens, 2) == list(range(2, 24))
    # Phi-4-mini's window is beyond its length
    config, tensors = small("Phi-4-mini")
    assert changed_positions(with_layers(config, 1), tensors, tokens, 2) == list(range(2, 24))


@pytest.mark.parametrize("name", FF.ISSUE_MODELS)
def test_later_tokens_do_not_change_earlier_logits(name):
    config, tensors = small(name)
    tokens = list(range(5, 25))
    assert changed_positions(config, tensors, tokens, 15)[0] == 15


def test_soft_caps_bound_the_logits_and_change_the_answer():
    x = np.linspace(-1000, 1000, 2001)
    y = R.softcap(x, 30.0)
    assert np.all(np.abs(y) <= 30.0) and np.all(np.diff(y) >= 0) and np.allclose(R.softcap(-x, 30.0), -y)
    np.testing.assert_allclose(R.softcap(np.array([1e-3]), 30.0), 1e-3, rtol=1e-6)
    config, tensors = small("Gemma-2-2B")
    tokens = list(range(3, 40))
    logits = R.forward(config, tensors, tokens)
    assert np.abs(logits).max() < 30.0
    expect = R.nll(logits, tokens)
    # the fixture's weights make both caps bite: without either the answer moves by > 1e-3
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        uncapped = dict(config, **{key: None})
        assert rel(R.nll(R.forward(uncapped, tensors, tokens), tokens), expect) > 1e-3, key


def test_longrope_uses_short_factors_within_the_original_length_and_long_beyond():
    config, tensors = small("Phi-4-mini")
    original = config["original_max_position_embeddings"]
    assert (original, config["max_position_embeddings"]) == (32, 1024)
    params = R.rope_settings(config)["full_attention"]
    base = 10000.0 ** -(np.arange(0, 96, 2) / 96)
    inv_short, af = R.inverse_frequencies(config, params, original)
    inv_long, af_long = R.inverse_frequencies(config, params, original + 1)
    np.testing.assert_allclose(inv_short, base / np.array(FF.PHI4_SHORT_FACTOR), rtol=1e-12)
    np.testing.assert_allclose(inv_long, base / np.array(FF.PHI4_LONG_FACTOR), rtol=1e-12)
    assert af == af_long == pytest.approx(math.sqrt(2.0))  # s = 1024 / 32 = 32 = original
    assert R.longrope_factors_in_use(config, original) == "short"
    assert R.longrope_factors_in_use(config, original + 1) == "long"

    def poisoned(which):
        c = copy.deepcopy(config)
        c["rope_scaling"][which] = [7.0] * 48
        return c

    short_text, long_text = list(range(3, 3 + original)), list(range(3, 3 + original + 8))
    for tokens, unused in ((short_text, "long_factor"), (long_text, "short_factor")):
        np.testing.assert_array_equal(R.forward(poisoned(unused), tensors, tokens), R.forward(config, tensors, tokens))
        other = "short_factor" if unused == "long_factor" else "long_factor"
        assert not np.allclose(R.forward(poisoned(other), tensors, tokens), R.forward(config, tensors, tokens))
    # llama.cpp's choice by the context in use: a short text in a long context uses the long factors
    as_long = copy.deepcopy(config)
    as_long["rope_scaling"]["short_factor"] = FF.PHI4_LONG_FACTOR
    np.testing.assert_array_equal(R.forward(config, tensors, short_text, context=64),
                                  R.forward(as_long, tensors, short_text))


def test_gemma3_two_rope_settings_and_both_config_spellings():
    config, tensors = small("Gemma-3-1B")
    plan = R.Plan(config, 10)
    i = np.arange(128)
    for layer in range(6):
        theta = 1e6 if layer == 5 else 1e4
        np.testing.assert_allclose(plan.rope[layer][0], theta ** (-2.0 * i / 256), rtol=1e-12)
    # Gemma 3 4B: linear x8 on the global layers only
    plan4 = R.Plan(FF.shrink("gemma-3-4b-text"), 10)
    np.testing.assert_allclose(plan4.rope[5][0], 1e6 ** (-2.0 * i / 256) / 8, rtol=1e-12)
    np.testing.assert_allclose(plan4.rope[0][0], 1e4 ** (-2.0 * i / 256), rtol=1e-12)
    # transformers 5's rope_parameters per layer type gives the same model
    v5 = {k: v for k, v in config.items() if k not in ("rope_theta", "rope_local_base_freq", "rope_scaling")}
    v5["rope_parameters"] = {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
    tokens = list(range(3, 20))
    np.testing.assert_array_equal(R.forward(v5, tensors, tokens), R.forward(config, tensors, tokens))


def test_layer_patterns_of_the_real_configs():
    C = FF.REAL_CONFIGS

    def full(name):
        return [i for i, t in enumerate(R.layer_types(R.text_config(C[name]))) if t == "full_attention"]

    assert full("Gemma-3-270M") == [5, 11, 17] and full("Gemma-3-1B") == [5, 11, 17, 23]
    assert full("gemma-3-4b-text") == [5, 11, 17, 23, 29]
    assert full("Gemma-2-2B") == list(range(1, 26, 2))
    assert R.layer_windows(C["Gemma-2-2B"])[:2] == [4096, None]
    assert set(R.layer_windows(C["Mistral-7B-v0.1"])) == {4096}
    assert set(R.layer_windows(C["Phi-3-mini-4k"])) == {2047}
    assert set(R.layer_windows(C["Qwen2.5-0.5B"])) == {None}
    assert set(R.layer_windows(C["Phi-4-mini"])) == {262144}  # beyond its 131072 positions
    for name in ("Qwen3-0.6B", "Gemma-2B", "SmolLM3-3B"):
        assert set(R.layer_windows(C[name])) == {None}, name


@pytest.mark.parametrize("name", FF.ISSUE_MODELS)
def test_shrunk_fixture_keeps_head_size_gqa_ratio_and_layer_kinds(tmp_path, name):
    real = R.text_config(FF.REAL_CONFIGS[name])
    config, tensors = FF.write_checkpoint(tmp_path, name, "BF16")
    c = R.text_config(config)
    assert R.head_dim(c) == R.head_dim(real)
    ratio = real["num_attention_heads"] // real["num_key_value_heads"]
    assert c["num_attention_heads"] // c["num_key_value_heads"] == ratio
    assert set(R.layer_types(c)) == set(R.layer_types(real))
    assert set(R.rotating_layers(c)) == set(R.rotating_layers(real))
    assert c["vocab_size"] == 512 and c["num_hidden_layers"] < real["num_hidden_layers"]
    # what the file holds is what the reference was given: bf16 values, read back exactly
    loaded_config, loaded = hf_fixture.load_hf_checkpoint(tmp_path)
    assert loaded_config == config and loaded.keys() == tensors.keys()
    for n in tensors:
        np.testing.assert_array_equal(loaded[n], tensors[n])
        assert np.array_equal(hf_fixture.round_to_dtype(loaded[n], "BF16"), loaded[n])
    logits = R.forward(loaded_config, loaded, list(range(3, 23)))
    assert logits.shape == (20, 512) and np.all(np.isfinite(logits))


# =====================================================================================
# 3. Published numbers
# =====================================================================================


def test_longrope_attention_factor_of_phi4_mini_is_the_published_value():
    # llama.cpp's GGUF of Phi-4-mini-instruct: phi3.rope.scaling.attn_factor f32 = 1.190238
    config = FF.REAL_CONFIGS["Phi-4-mini"]
    af = R.longrope_attention_factor(config, R.rope_settings(config)["full_attention"])
    assert af == pytest.approx(1.190238, abs=5e-7)
    assert af == pytest.approx(math.sqrt(1 + math.log(32) / math.log(4096)), rel=1e-15)
    # an explicit factor wins over the length ratio, an explicit attention_factor over both
    p = dict(R.rope_settings(config)["full_attention"], factor=4.0)
    assert R.longrope_attention_factor(config, p) == pytest.approx(math.sqrt(1 + math.log(4) / math.log(4096)))
    assert R.longrope_attention_factor(config, dict(p, attention_factor=1.5)) == 1.5


def test_gemma_embedding_scale_rounds_to_the_models_dtype():
    # modeling_gemma3.py: "sqrt(3072)=55.4256 to become 55.5" in bfloat16
    assert R.round_to(math.sqrt(3072), "BF16") == 55.5
    assert R.embed_scale(FF.REAL_CONFIGS["Gemma-2B"]) == 45.25  # sqrt(2048) = 45.2548 in bf16
    assert R.embed_scale(FF.REAL_CONFIGS["Gemma-2-2B"]) == float(np.float32(math.sqrt(2304)))  # a float32 model
    assert R.embed_scale(FF.shrink("Gemma-3-1B", dtype="BF16")) == 9.8125  # sqrt(96) = 9.798
    assert R.embed_scale(FF.shrink("Gemma-3-1B", dtype="F32")) == float(np.float32(math.sqrt(96)))
    assert R.embed_scale(FF.REAL_CONFIGS["Qwen3-0.6B"]) == 1.0


def test_layer_settings_name_each_layers_rotation_and_window():
    smol = R.layer_settings(FF.shrink("SmolLM3-3B"), 64)
    assert [s["rotates"] for s in smol] == [True, True, True, False] and smol[3]["inv_freq"] is None
    assert smol[0]["theta"] == 5e6 and smol[0]["rotated_pairs"] == 64 and smol[0]["window"] is None
    gemma3 = R.layer_settings(FF.shrink("Gemma-3-1B"), 64)
    assert [(s["theta"], s["window"]) for s in gemma3] == [(1e4, 8)] * 5 + [(1e6, None)]
    phi4 = FF.shrink("Phi-4-mini")
    short, long = R.layer_settings(phi4, 32)[0], R.layer_settings(phi4, 33)[0]
    assert short["rotated_pairs"] == long["rotated_pairs"] == 48 and short["rope_type"] == "longrope"
    assert short["attention_factor"] == long["attention_factor"] == pytest.approx(math.sqrt(2))
    np.testing.assert_allclose(short["inv_freq"] / long["inv_freq"], FF.PHI4_LONG_FACTOR, rtol=1e-12)
