"""Self-checks of tests/reference.py and tests/hf_fixture.py.

These test mathematical properties that hold for any correct
implementation, so they do not depend on run.c or export.py.
Run:  /usr/bin/python3 -m pytest -q tests/test_reference_selfcheck.py
"""

import json
import os
import struct
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_fixture as F  # noqa: E402
import reference as R  # noqa: E402

THETA = 10000.0


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf")
    config, tensors = F.make_hf_checkpoint(str(d), seed=3)
    rng = np.random.default_rng(0)
    tokens = [1] + [int(t) for t in rng.integers(0, config["vocab_size"], 31)]
    return config, tensors, tokens


# ---------------------------------------------------------------------------
# Rotary embedding
# ---------------------------------------------------------------------------

def rotation_matrix_rope(x, pos, theta):
    """Plain RoPE written with explicit 2x2 rotation matrices on pairs (i, i+hd/2)."""
    hd = x.shape[-1]
    out = np.empty_like(x)
    for i in range(hd // 2):
        a = pos * theta ** (-2.0 * i / hd)
        rot = np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]])
        out[i], out[i + hd // 2] = rot @ np.array([x[i], x[i + hd // 2]])
    return out


def test_p1_equals_explicit_rotation_matrices():
    rng = np.random.default_rng(1)
    hd, T = 16, 7
    x = rng.normal(size=(T, hd))
    positions = np.array([0, 1, 2, 5, 17, 100, 1000])
    got = R.apply_rope(x, positions, {"kind": "paper", "theta": THETA, "p": 1.0})
    want = np.stack([rotation_matrix_rope(x[t], positions[t], THETA) for t in range(T)])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_rope_angles_count_and_untouched_pairs():
    assert R.paper_rope_angles(16, 0.75) == 6
    assert R.paper_rope_angles(16, 0.25) == 2
    assert R.paper_rope_angles(64, 0.0) == 0
    assert R.paper_rope_angles(64, 1.0) == 32
    assert R.paper_rope_angles(16, 0.4375) == 3  # floor(3.5), not round
    assert R.paper_rope_angles(16, 0.8) == 6     # floor(6.4)
    rng = np.random.default_rng(2)
    hd = 16
    x = rng.normal(size=(5, hd))
    pos = np.arange(5) + 3
    y = R.apply_rope(x, pos, {"kind": "paper", "theta": THETA, "p": 0.75})
    assert np.all(np.isfinite(y))
    # pairs 6, 7 (dims 6, 7, 14, 15) are not rotated; pairs 0..5 are
    keep = [6, 7, 14, 15]
    np.testing.assert_array_equal(y[:, keep], x[:, keep])
    assert not np.allclose(y[:, :6], x[:, :6])
    # p = 0 is the identity, exactly
    np.testing.assert_array_equal(R.apply_rope(x, pos, {"kind": "paper", "theta": THETA, "p": 0.0}), x)


@pytest.mark.parametrize("rope", [
    {"kind": "paper", "theta": THETA, "p": 1.0},
    {"kind": "paper", "theta": 500.0, "p": 0.5, "scale": 2.0},
    {"kind": "neox", "base": THETA, "factor": 0.5},
])
def test_score_depends_only_on_relative_position(rope):
    rng = np.random.default_rng(3)
    q, k = rng.normal(size=(1, 16)), rng.normal(size=(1, 16))

    def score(m, n):
        return float(R.apply_rope(q, [m], rope)[0] @ R.apply_rope(k, [n], rope)[0])

    for m, n in [(5, 2), (40, 0), (3, 9)]:
        for shift in (1, 17, 250):
            assert score(m + shift, n + shift) == pytest.approx(score(m, n), abs=1e-10)
    assert score(5, 2) != pytest.approx(score(6, 2), abs=1e-6)


def neox_to_paper_permutation(hd, r):
    """Index map such that neox dims `perm` are in paper (half-split) order.

    paper pair i   <-> neox pair (i, i + r/2)            for i < r/2
    paper pair i   <-> neox non-rotated dims, in order   for i >= r/2
    """
    h, rest = r // 2, (hd - r) // 2
    return np.concatenate([np.arange(0, h), np.arange(r, r + rest),
                           np.arange(h, r), np.arange(r + rest, hd)])


@pytest.mark.parametrize("f", [0.25, 0.5, 0.75, 1.0])
def test_neox_equals_paper_with_rescaled_theta(f):
    """NeoX(base B, factor f) == p-RoPE(theta = B**(1/f), p = f) up to a dim permutation.

    NeoX frequency B**(-2i/(f hd)) = (B**(1/f))**(-2i/hd).
    """
    hd, B = 16, THETA
    rng = np.random.default_rng(4)
    x = rng.normal(size=(3, 9, hd))
    pos = np.arange(9) * 7
    perm = neox_to_paper_permutation(hd, int(hd * f))
    neox = R.apply_rope(x, pos, {"kind": "neox", "base": B, "factor": f})
    paper = R.apply_rope(x[..., perm], pos, {"kind": "paper", "theta": B ** (1 / f), "p": f})
    np.testing.assert_allclose(neox[..., perm], paper, rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------
# Whole model
# ---------------------------------------------------------------------------

def test_attention_against_loops():
    """Grouped-query causal attention written with explicit loops."""
    rng = np.random.default_rng(7)
    H, KV, T, hd = 4, 2, 5, 8
    q, k, v = rng.normal(size=(H, T, hd)), rng.normal(size=(KV, T, hd)), rng.normal(size=(KV, T, hd))
    out, P = R.causal_attention(q, k, v)
    for h in range(H):
        kv = h // (H // KV)
        for t in range(T):
            s = np.array([q[h, t] @ k[kv, j] / np.sqrt(hd) for j in range(t + 1)])
            w = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
            np.testing.assert_allclose(P[h, t, : t + 1], w, rtol=1e-12)
            np.testing.assert_array_equal(P[h, t, t + 1:], 0.0)
            np.testing.assert_allclose(out[h, t], w @ v[kv, : t + 1], rtol=1e-12)


def test_p0_logits_invariant_to_position_shift(model):
    config, tensors, tokens = model
    nope = {"kind": "paper", "theta": THETA, "p": 0.0}
    a = R.forward(config, tensors, tokens, nope)
    b = R.forward(config, tensors, tokens, nope, start_pos=37)
    np.testing.assert_array_equal(a, b)


def test_rope_logits_invariant_to_position_shift_but_depend_on_order(model):
    """Full RoPE only sees relative positions too; but it does see them."""
    config, tensors, tokens = model
    rope = {"kind": "paper", "theta": THETA, "p": 1.0}
    a = R.forward(config, tensors, tokens, rope)
    b = R.forward(config, tensors, tokens, rope, start_pos=1000)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-9)
    nope = R.forward(config, tensors, tokens, {"kind": "paper", "theta": THETA, "p": 0.0})
    assert np.abs(a - nope).max() > 1e-2


def test_logits_scale_and_nll(model):
    config, tensors, tokens = model
    logits = R.forward(config, tensors, tokens, R.rope_from_config(config))
    assert logits.shape == (len(tokens), config["vocab_size"])
    assert 1.0 < logits.std() < 3.0
    # nll against a direct log-softmax
    ls = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    want = -np.mean([ls[t, tokens[t + 1]] for t in range(len(tokens) - 1)])
    assert R.nll(logits, tokens) == pytest.approx(want, rel=1e-12)
    assert abs(R.nll(logits, tokens) - np.log(config["vocab_size"])) > 0.1


def test_causality_and_greedy(model):
    config, tensors, tokens = model
    rope = {"kind": "paper", "theta": THETA, "p": 0.5}
    full = R.forward(config, tensors, tokens, rope)
    prefix = R.forward(config, tensors, tokens[:10], rope)
    np.testing.assert_allclose(full[:10], prefix, rtol=0, atol=1e-12)
    new = R.greedy(config, tensors, tokens[:5], 4, rope)
    seq = tokens[:5] + new
    logits = R.forward(config, tensors, seq, rope)
    assert new == [int(np.argmax(logits[t])) for t in range(4, 8)]


def test_inspect_stats(model):
    config, tensors, tokens = model
    _, L, H, KV, hd, _ = R.dims(config)
    s1 = R.inspect_stats(config, tensors, tokens, {"kind": "paper", "theta": THETA, "p": 1.0})
    assert s1["qnorm"].shape == s1["knorm"].shape == (L, H, hd // 2)
    assert s1["attn"].shape == (L, H, 3)
    assert np.all((s1["attn"] >= 0) & (s1["attn"] <= 1))
    # layer 0 sees the same input for any rope, so its q/k norms match
    s0 = R.inspect_stats(config, tensors, tokens, {"kind": "paper", "theta": THETA, "p": 0.0})
    np.testing.assert_allclose(s0["qnorm"][0], s1["qnorm"][0], rtol=1e-12)
    # query heads of one group read the same kv head
    group = H // KV
    np.testing.assert_array_equal(s1["knorm"][:, 0], s1["knorm"][:, group - 1])
    # direct computation for layer 0, head 0
    W, eps = tensors, config["rms_norm_eps"]
    x = W["model.embed_tokens.weight"][tokens]
    n = R.rmsnorm(x, W["model.layers.0.input_layernorm.weight"], eps)
    q = (n @ W["model.layers.0.self_attn.q_proj.weight"].T)[:, :hd]
    want = np.sqrt(q[:, : hd // 2] ** 2 + q[:, hd // 2:] ** 2).mean(0)
    np.testing.assert_allclose(s1["qnorm"][0, 0], want, rtol=1e-12)


# ---------------------------------------------------------------------------
# Fixture: number formats, file format, config
# ---------------------------------------------------------------------------

def test_bf16_round_to_nearest_even():
    one = 1.0
    ulp = 2.0 ** -7  # bf16 spacing in [1, 2)
    cases = {
        one + ulp / 2: one,                          # tie, 1.0 is even -> down
        one + 3 * ulp / 2: one + 2 * ulp,            # tie, 1+ulp is odd -> up
        one + ulp / 2 + 2.0 ** -20: one + ulp,       # just above the tie -> up
        one + ulp / 2 - 2.0 ** -20: one,             # just below the tie -> down
        -(one + 3 * ulp / 2): -(one + 2 * ulp),      # sign symmetric
    }
    for x, want in cases.items():
        assert F.round_to_dtype(np.array([x]), "BF16")[0] == want, x
    # brute force: result is the nearer of the two bf16 neighbours (ties -> even)
    rng = np.random.default_rng(5)
    x = rng.normal(size=2000).astype(np.float32)
    u = x.view(np.uint32)
    lo = (u & 0xFFFF0000).view(np.float32).astype(np.float64)
    hi = ((u & 0xFFFF0000) + 0x10000).view(np.float32).astype(np.float64)
    xd = x.astype(np.float64)
    d_lo, d_hi = np.abs(xd - lo), np.abs(hi - xd)
    lo_even = ((u >> 16) & 1) == 0
    want = np.where(d_lo < d_hi, lo, np.where(d_hi < d_lo, hi, np.where(lo_even, lo, hi)))
    np.testing.assert_array_equal(F.round_to_dtype(x, "BF16"), want)
    # F16 goes through numpy's (round-to-nearest-even) float16
    np.testing.assert_array_equal(F.round_to_dtype(xd, "F16"), xd.astype(np.float16).astype(np.float64))


@pytest.mark.parametrize("dtype,sharded,tied", [("F32", False, True), ("BF16", True, False),
                                                ("F16", False, False)])
def test_safetensors_files(tmp_path, dtype, sharded, tied):
    config, tensors = F.make_hf_checkpoint(str(tmp_path), dtype=dtype, sharded=sharded,
                                           tied=tied, n_layers=1, vocab_size=64)
    assert ("lm_head.weight" in tensors) == (not tied)
    files = sorted(p.name for p in tmp_path.iterdir())
    if sharded:
        assert files == ["config.json", "model-00001-of-00002.safetensors",
                         "model-00002-of-00002.safetensors", "model.safetensors.index.json"]
        index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
        assert set(index["weight_map"]) == set(tensors)
    else:
        assert files == ["config.json", "model.safetensors"]
    for fn in files:
        if fn.endswith(".safetensors"):
            raw = (tmp_path / fn).read_bytes()
            (n,) = struct.unpack("<Q", raw[:8])
            assert n % 8 == 0
            header = json.loads(raw[8:8 + n])
            assert header["__metadata__"] == {"format": "pt"}
            ends = sorted(v["data_offsets"] for k, v in header.items() if k != "__metadata__")
            assert ends[0][0] == 0 and ends[-1][1] == len(raw) - 8 - n
            assert all(a[1] == b[0] for a, b in zip(ends, ends[1:]))
            assert all(v["dtype"] == dtype for k, v in header.items() if k != "__metadata__")
    config2, tensors2 = F.load_hf_checkpoint(str(tmp_path))
    assert config2 == config and set(tensors2) == set(tensors)
    for k in tensors:
        np.testing.assert_array_equal(tensors2[k], tensors[k])
    hd = config["hidden_size"] // config["num_attention_heads"]
    assert tensors["model.layers.0.self_attn.k_proj.weight"].shape == (
        config["num_key_value_heads"] * hd, config["hidden_size"])


@pytest.mark.parametrize("layout", ["v4", "v5"])
def test_rope_from_config(tmp_path, layout):
    def cfg(rope):
        return F.make_config(dim=64, hidden_dim=96, n_layers=1, n_heads=4, n_kv_heads=2,
                             vocab_size=64, seq_len=128, dtype="F32", tied=True,
                             rms_norm_eps=1e-5, rope=rope, layout=layout)

    assert R.rope_from_config(cfg({"type": "default", "theta": 500.0})) == \
        {"kind": "paper", "theta": 500.0, "p": 1.0, "scale": 1.0}
    assert R.rope_from_config(cfg({"type": "default", "partial_rotary_factor": 0.25})) == \
        {"kind": "neox", "base": THETA, "factor": 0.25}
    assert R.rope_from_config(cfg({"type": "proportional", "theta": 1e6,
                                   "partial_rotary_factor": 0.25, "factor": 8.0})) == \
        {"kind": "paper", "theta": 1e6, "p": 0.25, "scale": 8.0}
    assert R.rope_from_config(cfg({"type": "proportional", "partial_rotary_factor": 0.5})) == \
        {"kind": "paper", "theta": THETA, "p": 0.5, "scale": 1.0}
    for bad in ({"type": "linear", "factor": 2.0}, {"type": "yarn"}, {"type": "llama3"},
                {"type": "dynamic", "factor": 2.0}):
        with pytest.raises(ValueError):
            R.rope_from_config(cfg(bad))
    c = cfg({"type": "proportional", "partial_rotary_factor": 0.5})
    if layout == "v4":
        assert c["rope_theta"] == THETA and c["partial_rotary_factor"] == 0.5
        assert c["rope_scaling"] == {"rope_type": "proportional"}
        assert cfg({"type": "default"})["rope_scaling"] is None
    else:
        assert "rope_theta" not in c and "rope_scaling" not in c
        assert c["rope_parameters"] == {"rope_type": "proportional", "rope_theta": THETA,
                                        "partial_rotary_factor": 0.5}


def test_proportional_scale_equals_position_division():
    """p-RoPE with scale s at position m equals scale 1 at position m / s."""
    rng = np.random.default_rng(6)
    x = rng.normal(size=(4, 16))
    pos = np.array([0, 3, 8, 50])
    a = R.apply_rope(x, pos, {"kind": "paper", "theta": THETA, "p": 0.5, "scale": 4.0})
    b = R.apply_rope(x, pos / 4.0, {"kind": "paper", "theta": THETA, "p": 0.5})
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)
