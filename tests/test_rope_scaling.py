"""RoPE scaling rules (linear, ntk, yarn, llama3) in run.c and export.py against the
independent NumPy reference (tests/scaling_reference.py, tests/reference.py).

The interface is /work/notes/scaling_spec.md: the ROPE header's bytes 52..83, run's
--rope-scaling / --rope-factor / --rope-original-len / -c flags, `-m rope`'s table and
`-m ppl --csv`.  Four groups of tests:

  1. the reference itself, against hand-derived values and transformers' documented
     behaviour (these need neither run.c nor export.py);
  2. `run CHECKPOINT -m rope`: the attention factor and every pair's omega and
     wavelength, for many head sizes, thetas, factors, original lengths and p, with
     the rule in the header or on the command line;
  3. `run -m ppl` on Hugging Face checkpoints with rope_scaling / rope_parameters,
     exported by export.py, scored over a text longer than the original length, and
     the same rules, longer contexts (-c) and per-token CSV rows on a plain checkpoint;
  4. bad flags (exit 2) and bad header fields (exit 1), one error line each.
"""
import csv
import math
import re
import struct
import subprocess

import numpy as np
import pytest

import conftest
import hf_fixture
import reference
import scaling_reference as S
from conftest import RUN_BIN, STORIES, TOK512, export, run
from ropefile import header_bytes, random_weights, write_random_checkpoint

RTOL = 2e-6          # omegas and wavelengths: float32 in run.c against float64 here
NLL_REL = 1e-4       # nll: as tests/test_prope_reference.py
TEXT = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park "
        "with her dog Max. One day she saw a big red ball under a tree. She ran to get it, but Max got "
        "there first. They played with the ball all day long. When the sun went down, Lily and Max "
        "went home.")  # 113 tokens after BOS with tok512


# =====================================================================================
# 1. The reference against hand-derived values
# =====================================================================================

def test_reference_none_is_plain_rope_and_p_zeroes_the_slow_pairs():
    omega, af = S.scaled_omegas(10000.0, 1.0, 8, "none", original_len=64)
    np.testing.assert_allclose(omega, [1.0, 0.1, 0.01, 0.001], rtol=1e-14)
    assert af == 1.0
    omega, _ = S.scaled_omegas(10000.0, 0.5, 8, "linear", factor=4.0, original_len=64)
    np.testing.assert_allclose(omega, [0.25, 0.025, 0.0, 0.0], rtol=1e-14)
    np.testing.assert_array_equal(S.wavelengths([1.0, 0.0]), [2 * math.pi, np.inf])


@pytest.mark.parametrize("hs,theta,p", [(16, 10000.0, 1.0), (64, 500000.0, 0.5), (128, 10000.0, 0.25)])
def test_reference_yarn_with_factor_one_is_plain_rope(hs, theta, p):
    omega, af = S.scaled_omegas(theta, p, hs, "yarn", factor=1.0, original_len=4096)
    np.testing.assert_allclose(omega, S.base_omegas(theta, p, hs), rtol=1e-13)
    assert af == 1.0  # get_mscale(1) = 1


@pytest.mark.parametrize("rule", ["linear", "ntk", "yarn", "llama3"])
def test_reference_rules_with_factor_one_change_nothing(rule):
    omega, af = S.scaled_omegas(500000.0, 0.75, 32, rule, factor=1.0, original_len=64)
    np.testing.assert_allclose(omega, S.base_omegas(500000.0, 0.75, 32), rtol=1e-13)
    assert af == 1.0


def test_reference_linear_divides_every_rotated_frequency():
    base = S.base_omegas(10000.0, 0.75, 16)
    omega, af = S.scaled_omegas(10000.0, 0.75, 16, "linear", factor=8.0)
    np.testing.assert_allclose(omega, base / 8.0, rtol=1e-15)
    assert af == 1.0 and np.count_nonzero(omega) == 6


def test_reference_ntk_keeps_the_fastest_pair_and_divides_the_slowest_by_the_factor():
    # theta' = theta s^(d/(d-2)): omega_0 = 1, and the last pair (2i = d-2) gets
    # theta'^(-(d-2)/d) = theta^(-(d-2)/d) / s, i.e. exactly linear scaling there.
    for hs in (8, 16, 128):
        omega, af = S.scaled_omegas(10000.0, 1.0, hs, "ntk", factor=4.0)
        base = S.base_omegas(10000.0, 1.0, hs)
        assert omega[0] == 1.0 and af == 1.0
        assert omega[-1] == pytest.approx(base[-1] / 4.0, rel=1e-12)
        assert np.all(omega[1:-1] < base[1:-1]) and np.all(omega[1:-1] > base[1:-1] / 4.0)
    # hs = 8, theta = 10000, s = 4: theta' = 10000 * 4^(4/3) = 63496.04; omega_1 = theta'^(-1/4)
    omega, _ = S.scaled_omegas(10000.0, 1.0, 8, "ntk", factor=4.0)
    assert omega[1] == pytest.approx(63496.0420 ** -0.25, rel=1e-8)


def test_reference_yarn_hand_example():
    # hs 16, theta 10000, L 32, s 4, betas 32/1:
    #   corr(32) = 16 ln(32/(64 pi)) / (2 ln 10^4) = -1.596 -> floor -2 -> low 0
    #   corr(1)  = 16 ln(32/(2 pi))  / (2 ln 10^4) =  1.414 -> ceil 2   -> high 2
    #   ramp = [0, 0.5, 1, 1, ...]: pair 0 kept, pair 1 half-way, pairs 2..7 divided by 4
    assert S.yarn_correction_range(32, 1, 16, 10000.0, 32) == (0, 2)
    omega, af = S.scaled_omegas(10000.0, 1.0, 16, "yarn", factor=4.0, original_len=32)
    base = S.base_omegas(10000.0, 1.0, 16)
    assert omega[0] == base[0] == 1.0
    assert omega[1] == pytest.approx(0.625 * 10 ** -0.5, rel=1e-14)  # 0.5 w/4 + 0.5 w
    np.testing.assert_allclose(omega[2:], base[2:] / 4.0, rtol=1e-14)
    assert af == pytest.approx(0.1 * math.log(4.0) + 1.0, rel=1e-15) == pytest.approx(1.1386294361)
    assert S.yarn_bands(10000.0, 1.0, 16, 4.0, 32) == ["kept", "blended"] + ["interpolated"] * 6


def test_reference_yarn_betas_and_attention_factor():
    # beta_fast 8, beta_slow 2 (hs 16, L 32): corr(8) = -0.392 -> 0, corr(2) = 0.812 -> 1
    assert S.yarn_correction_range(8, 2, 16, 10000.0, 32) == (0, 1)
    omega, af = S.scaled_omegas(10000.0, 1.0, 16, "yarn", factor=4.0, original_len=32,
                                beta_fast=8.0, beta_slow=2.0, attention_factor=1.5)
    base = S.base_omegas(10000.0, 1.0, 16)
    assert omega[0] == 1.0 and af == 1.5
    np.testing.assert_allclose(omega[1:], base[1:] / 4.0, rtol=1e-14)
    # 0 means the default, as in the header (and transformers' `beta or default`)
    np.testing.assert_array_equal(
        S.scaled_omegas(10000.0, 1.0, 16, "yarn", factor=4.0, original_len=32, beta_fast=0, beta_slow=0)[0],
        S.scaled_omegas(10000.0, 1.0, 16, "yarn", factor=4.0, original_len=32, beta_fast=32, beta_slow=1)[0])


def test_reference_yarn_equal_bounds_get_the_0_001_guard():
    # L 4 (hs 16): corr(1) = 16 ln(4/(2 pi)) / (2 ln 10^4) = -0.39 -> ceil 0; low 0 too.
    # high = 0 + 0.001: ramp = [0, 1, 1, ...] (i / 0.001 clamped), no division by zero.
    assert S.yarn_correction_range(32, 1, 16, 10000.0, 4) == (0, 0)
    np.testing.assert_array_equal(S.yarn_ramp(0, 0, 4), [0.0, 1.0, 1.0, 1.0])
    omega, _ = S.scaled_omegas(10000.0, 1.0, 16, "yarn", factor=2.0, original_len=4)
    assert omega[0] == 1.0
    np.testing.assert_allclose(omega[1:], S.base_omegas(10000.0, 1.0, 16)[1:] / 2.0, rtol=1e-14)


def test_reference_yarn_ramp_runs_over_pairs_with_bounds_in_dims_as_transformers_does():
    # transformers clamps low only from below and high only to dim - 1, and ramps over the
    # dim/2 pair indices.  hs 8, theta 10, L 100000: corr(32) = 10.8 -> low 10,
    # corr(1) = 16.8 -> 17 -> high 7; ramp (i - 10)/(7 - 10) >= 1 for i = 0..3: all divided.
    assert S.yarn_correction_range(32, 1, 8, 10.0, 100000) == (10, 7)
    omega, _ = S.scaled_omegas(10.0, 1.0, 8, "yarn", factor=4.0, original_len=100000)
    np.testing.assert_allclose(omega, S.base_omegas(10.0, 1.0, 8) / 4.0, rtol=1e-14)
    # p < 1 clamps high to d_r - 1: hs 16, p 0.25 (d_r 4), L 8192: low 3, high min(7, 3) = 3
    assert S.yarn_correction_range(32, 1, 4, 10000.0 ** (4 / 16), 8192) == (3, 3)
    omega, _ = S.scaled_omegas(10000.0, 0.25, 16, "yarn", factor=8.0, original_len=8192)
    np.testing.assert_allclose(omega, S.base_omegas(10000.0, 0.25, 16), rtol=1e-13)  # both pairs kept


@pytest.mark.parametrize("f", [0.25, 0.5, 0.75])
@pytest.mark.parametrize("rule", ["linear", "yarn", "llama3"])
def test_reference_p_rope_equals_transformers_partial_rotary_factor(rule, f):
    # the spec's p < 1 composition: d_r = 2 rope_angles, b = theta^(d_r/hs) is transformers'
    # partial_rotary_factor f with base B when theta = B^(1/f)
    hs, B = 32, 10000.0
    kw = dict(factor=4.0, original_len=64, beta_fast=0.0, beta_slow=0.0, attention_factor=0.0,
              low_freq_factor=0.0, high_freq_factor=0.0)
    ours, af = S.scaled_omegas(B ** (1 / f), f, hs, rule, **kw)
    theirs, af2 = S._transformers_rule(B, int(hs * f), rule, **kw)
    np.testing.assert_allclose(ours[: int(hs * f) // 2], theirs, rtol=1e-12)
    assert not ours[int(hs * f) // 2:].any() and af == af2


def test_reference_llama3_three_bands_llama_3_1():
    # Llama 3.1: hs 128, theta 500000, L 8192, s 8, low 1, high 4.
    # wavelen_i = 2 pi 500000^(i/64) < 2048 <=> i < 64 ln(2048/2pi)/ln(500000) = 28.2 -> kept
    #           > 8192                <=> i > 64 ln(8192/2pi)/ln(500000) = 34.98 -> divided by 8
    bands = S.llama3_bands(500000.0, 1.0, 128, 8192)
    assert bands == ["kept"] * 29 + ["blended"] * 6 + ["interpolated"] * 29
    omega, af = S.scaled_omegas(500000.0, 1.0, 128, "llama3", factor=8.0, original_len=8192)
    base = S.base_omegas(500000.0, 1.0, 128)
    assert af == 1.0
    np.testing.assert_array_equal(omega[:29], base[:29])
    np.testing.assert_allclose(omega[35:], base[35:] / 8.0, rtol=1e-15)
    for i in range(29, 35):  # smooth = (L / wavelen - 1) / 3; (1 - smooth) w/8 + smooth w
        smooth = (8192 / (2 * math.pi / base[i]) - 1.0) / 3.0
        assert 0 < smooth < 1
        assert omega[i] == pytest.approx((1 - smooth) * base[i] / 8 + smooth * base[i], rel=1e-14)
    # hand value, pair 32: w = 500000^-0.5 = 1.41421e-3, wavelen 4442.88, smooth = 0.2812826,
    # omega = ((1 - smooth)/8 + smooth) w = 5.248462e-4
    assert omega[32] == pytest.approx(5.248462e-4, rel=1e-6)


def test_reference_llama3_is_continuous_at_both_band_edges():
    # at wavelen = L/low the blend gives w/s, at wavelen = L/high it gives w: no jump
    # pair 0 has omega 1, wavelength 2 pi: put it on each edge by choosing L
    lo, hi, s = 1.0, 4.0, 8.0
    for L, want in ((2 * math.pi * lo, 1 / s), (2 * math.pi * hi, 1.0)):
        omega, _ = S._transformers_rule(10000.0, 8, "llama3", s, L, 0, 0, 0, lo, hi)
        assert omega[0] == pytest.approx(want, rel=1e-12)
        for eps in (1e-9, -1e-9):  # and just inside / outside the band
            near, _ = S._transformers_rule(10000.0, 8, "llama3", s, L * (1 + eps), 0, 0, 0, lo, hi)
            assert near[0] == pytest.approx(want, rel=1e-6)


def test_reference_llama3_factors_move_the_bands():
    # hs 32, theta 10000, L 32: wavelengths 2 pi 10^(i/4) = 6.28, 11.2, 19.9, 35.3, ...
    # low 1, high 4: thresholds 32 and 8
    assert S.llama3_bands(10000.0, 1.0, 32, 32)[:4] == ["kept", "blended", "blended", "interpolated"]
    # low 2, high 8: thresholds 16 and 4 -> 6.28 and 11.2 blended, 19.9 divided
    assert S.llama3_bands(10000.0, 1.0, 32, 32, 2.0, 8.0)[:3] == ["blended", "blended", "interpolated"]
    assert S.llama3_bands(10000.0, 0.25, 32, 32)[4:] == ["unrotated"] * 12


def test_reference_get_mscale():
    assert S.get_mscale(1.0) == 1.0 and S.get_mscale(0.5) == 1.0
    assert S.get_mscale(math.e) == pytest.approx(1.1)
    assert S.get_mscale(40.0, 0.707) == pytest.approx(0.0707 * math.log(40) + 1)


def test_reference_rejects_what_the_spec_rejects():
    for bad in (dict(rule="yarn", factor=0.5), dict(rule="ntk", factor=0.99), dict(rule="llama3", factor=0.5),
                dict(rule="linear", factor=0.0), dict(rule="linear", factor=float("nan")),
                dict(rule="none", factor=2.0), dict(rule="linear", factor=2.0, beta_fast=4.0),
                dict(rule="llama3", factor=2.0, low_freq_factor=4.0, high_freq_factor=4.0),
                dict(rule="yarn", factor=2.0, low_freq_factor=1.0), dict(rule="dynamic", factor=2.0),
                dict(rule="yarn", factor=2.0, original_len=0)):
        kw = dict(dict(original_len=64), **bad)
        with pytest.raises(ValueError):
            S.scaled_omegas(10000.0, 1.0, 16, **kw)
    S.scaled_omegas(10000.0, 1.0, 16, "linear", factor=0.5)  # linear may compress


# --- the forward pass with per-pair frequencies ---------------------------------------

def test_forward_freqs_kind_equals_paper_kind():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(3, 7, 16))
    pos = np.arange(7) * 5
    for p, s in ((1.0, 1.0), (0.5, 4.0), (0.0, 1.0)):
        paper = reference.apply_rope(x, pos, {"kind": "paper", "theta": 500.0, "p": p, "scale": s})
        rule = "linear" if s != 1 else "none"
        freqs = reference.apply_rope(x, pos, S.rope_dict(500.0, p, 16, rule, factor=s))
        np.testing.assert_allclose(freqs, paper, rtol=0, atol=1e-12)


def test_forward_attention_factor_scales_rotated_pairs_only():
    rng = np.random.default_rng(2)
    q, k = rng.normal(size=(1, 16)), rng.normal(size=(1, 16))
    omega = S.base_omegas(10000.0, 0.5, 16)  # pairs 0..3 rotate, 4..7 do not
    rot = [0, 1, 2, 3, 8, 9, 10, 11]
    still = [4, 5, 6, 7, 12, 13, 14, 15]
    plain = {"kind": "freqs", "omega": omega}
    scaled = {"kind": "freqs", "omega": omega, "attention_factor": 1.5}
    for m, n in ((0, 0), (9, 3), (100, 40)):
        a, b = reference.apply_rope(q, [m], plain)[0], reference.apply_rope(k, [n], plain)[0]
        c, d = reference.apply_rope(q, [m], scaled)[0], reference.apply_rope(k, [n], scaled)[0]
        np.testing.assert_allclose(c[rot], 1.5 * a[rot], rtol=1e-13)
        np.testing.assert_array_equal(c[still], q[0, still])
        assert c @ d == pytest.approx(2.25 * (a[rot] @ b[rot]) + a[still] @ b[still], rel=1e-12)


def test_forward_neox_with_omega_and_attention_factor():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(5, 16))
    pos = np.arange(5) * 3
    neox = {"kind": "neox", "base": 10000.0, "factor": 0.5}
    omega = reference.rope_frequencies(16, neox)
    same = dict(neox, omega=omega, attention_factor=1.0)
    np.testing.assert_allclose(reference.apply_rope(x, pos, same), reference.apply_rope(x, pos, neox),
                               rtol=0, atol=1e-13)
    scaled = dict(neox, omega=omega / 2, attention_factor=2.0)
    y = reference.apply_rope(x, pos, scaled)
    np.testing.assert_array_equal(y[:, 8:], x[:, 8:])
    np.testing.assert_allclose(y[:, :8], 2.0 * reference.apply_rope(x, pos / 2, neox)[:, :8], rtol=1e-12)


def test_token_nll_mean_is_nll():
    rng = np.random.default_rng(4)
    logits, tokens = rng.normal(size=(9, 20)), rng.integers(0, 20, 9)
    assert reference.token_nll(logits, tokens).mean() == pytest.approx(reference.nll(logits, tokens), rel=1e-14)


# --- config.json -> rule, as transformers reads it ------------------------------------

def hf_config(rope, layout="v4", seq_len=128, **extra):
    c = hf_fixture.make_config(dim=64, hidden_dim=96, n_layers=1, n_heads=2, n_kv_heads=1, vocab_size=64,
                               seq_len=seq_len, dtype="F32", tied=True, rms_norm_eps=1e-5, rope=rope,
                               layout=layout)
    c.update(extra)
    return c


@pytest.mark.parametrize("layout", ["v4", "v5"])
def test_config_linear_llama3_yarn(layout):
    c = S.scaling_from_config(hf_config({"type": "linear", "theta": 500000.0, "factor": 4.0}, layout))
    assert (c["rule"], c["factor"], c["theta"], c["p"], c["layout"]) == ("linear", 4.0, 500000.0, 1.0, "paper")
    c = S.scaling_from_config(hf_config({"type": "llama3", "factor": 8.0, "low_freq_factor": 2.0,
                                         "high_freq_factor": 8.0, "original_max_position_embeddings": 32},
                                        layout))
    assert (c["rule"], c["factor"], c["original_len"], c["low_freq_factor"], c["high_freq_factor"]) == \
        ("llama3", 8.0, 32, 2.0, 8.0)
    c = S.scaling_from_config(hf_config({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
                                        layout))
    assert (c["rule"], c["factor"], c["original_len"], c["beta_fast"], c["beta_slow"]) == \
        ("yarn", 4.0, 32, 32.0, 1.0)
    assert c["attention_factor"] == pytest.approx(0.1 * math.log(4) + 1)
    # no original_max_position_embeddings: max_position_embeddings is the original length
    cfg = hf_config({"type": "yarn", "factor": 4.0}, layout, seq_len=96)
    cfg.get("rope_scaling", cfg.get("rope_parameters")).pop("original_max_position_embeddings")
    assert S.scaling_from_config(cfg)["original_len"] == 96
    # the pre-4.45 key "type"
    if layout == "v4":
        c = S.scaling_from_config(hf_config({"type": "yarn", "factor": 2.0, "type_key": "type"}, layout))
        assert c["rule"] == "yarn" and c["factor"] == 2.0


def test_config_yarn_explicit_factor_wins_over_the_length_ratio():
    # transformers >= 4.56 and 5.x: factor as given (they only warn when
    # max_position_embeddings / original_max_position_embeddings differs);
    # only a missing factor (5.x) falls back to the ratio.
    cfg = hf_config({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}, "v5", seq_len=256)
    assert S.scaling_from_config(cfg)["factor"] == 4.0
    del cfg["rope_parameters"]["factor"]
    c = S.scaling_from_config(cfg)
    assert c["factor"] == 8.0 and c["attention_factor"] == pytest.approx(0.1 * math.log(8) + 1)


def test_config_yarn_attention_factor_mscale_and_truncate():
    base = {"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 32}
    c = S.scaling_from_config(hf_config(dict(base, attention_factor=1.25, beta_fast=8.0, beta_slow=2.0)))
    assert (c["attention_factor"], c["beta_fast"], c["beta_slow"]) == (1.25, 8.0, 2.0)
    # DeepSeek style: mscale and mscale_all_dim both set -> ratio of the two get_mscale
    c = S.scaling_from_config(hf_config(dict(base, mscale=1.0, mscale_all_dim=0.707)))
    assert c["attention_factor"] == pytest.approx((0.1 * math.log(40) + 1) / (0.0707 * math.log(40) + 1))
    c = S.scaling_from_config(hf_config(dict(base, mscale=0.707, mscale_all_dim=0.707)))
    assert c["attention_factor"] == pytest.approx(1.0)
    c = S.scaling_from_config(hf_config(dict(base, mscale=0.707)))  # one alone: ignored
    assert c["attention_factor"] == pytest.approx(0.1 * math.log(40) + 1)
    # beta 0 means the default (`or 32`), an explicit attention_factor wins over mscale
    c = S.scaling_from_config(hf_config(dict(base, beta_fast=0, attention_factor=2.0, mscale=1.0,
                                             mscale_all_dim=0.5)))
    assert (c["beta_fast"], c["attention_factor"]) == (32.0, 2.0)
    assert S.scaling_from_config(hf_config(dict(base, truncate=False)))["truncate"] is False


def test_config_top_level_original_length_wins_in_transformers_5():
    cfg = hf_config({"type": "llama3", "factor": 8.0, "original_max_position_embeddings": 32}, "v5",
                    original_max_position_embeddings=64)
    assert S.scaling_from_config(cfg)["original_len"] == 64


def test_config_partial_rotary_factor_is_neox_with_theta_rescaled():
    cfg = hf_config({"type": "yarn", "theta": 10000.0, "partial_rotary_factor": 0.5, "factor": 4.0,
                     "original_max_position_embeddings": 32})
    c = S.scaling_from_config(cfg)
    assert (c["layout"], c["rotary_dim"], c["base"], c["p"]) == ("neox", 16, 10000.0, 0.5)
    assert c["theta"] == pytest.approx(1e8)
    rope = S.rope_for_forward(c)
    assert rope["kind"] == "neox" and len(rope["omega"]) == 8


@pytest.mark.parametrize("rope", [{"type": "dynamic", "factor": 2.0},
                                  {"type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}])
def test_config_other_rope_types_are_refused(rope):
    with pytest.raises(ValueError):
        S.scaling_from_config(hf_config(rope))


def test_config_default_and_proportional_agree_with_rope_from_config():
    for rope in ({"type": "default", "theta": 500.0}, {"type": "proportional", "partial_rotary_factor": 0.25,
                                                        "factor": 8.0}):
        cfg = hf_config(rope, "v5")
        old = reference.rope_from_config(cfg)
        new = S.rope_for_forward(S.scaling_from_config(cfg))
        np.testing.assert_allclose(reference.rope_frequencies(32, new), reference.rope_frequencies(32, old),
                                   rtol=1e-14)


# =====================================================================================
# 2. run -m rope
# =====================================================================================

HEAD_SIZES = [8, 16, 32, 64, 128]
FRACTIONS = [1.0, 0.5, 0.25]
# (theta, factor, original length): every theta, factor and length appears
COMBOS = [(10000.0, 2.0, 64), (500000.0, 4.0, 512), (10000.0, 8.0, 4096), (500000.0, 32.0, 8192)]
# per-rule parameters written to the header (0 = default), cycled over COMBOS
HEADER_EXTRAS = {
    "none": [{}],
    "linear": [{}, {"attention_factor": 1.25}],
    "ntk": [{}],
    "yarn": [{}, {"beta_fast": 16.0, "beta_slow": 2.0}, {"attention_factor": 1.5},
             {"beta_fast": 8.0, "beta_slow": 0.5, "attention_factor": 0.75}],
    "llama3": [{}, {"low_freq_factor": 2.0, "high_freq_factor": 8.0}, {"low_freq_factor": 1.0,
                                                                       "high_freq_factor": 2.0}],
}
HEADER_SEQ_LEN = 64
_WEIGHTS = {}


def tiny_model(path, hs, seq_len=HEADER_SEQ_LEN, vocab_size=32, **header):
    """A one-layer, one-head model of head size hs (small: -m rope reads only the header)."""
    key = (hs, vocab_size)
    if key not in _WEIGHTS:
        _WEIGHTS[key] = b"".join(np.ascontiguousarray(t, dtype="<f4").tobytes()
                                 for _, t in random_weights(hs, 8, 1, 1, 1, vocab_size, True, seed=hs))
    path.write_bytes(header_bytes(hs, 8, 1, 1, 1, vocab_size, seq_len, True, **header) + _WEIGHTS[key])
    return path


def parse_rope_table(text):
    """-m rope's stdout -> (attention factor string, [(i, omega string, wavelength string)], notes)."""
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines and lines[0].startswith("attention_factor:"), text
    af = lines[0].split(":", 1)[1].strip()
    assert lines[1] == "pair omega wavelength", text  # the columns' names
    rows, notes = [], []
    for line in lines[2:]:
        if line[0].isdigit():
            assert not notes, f"a pair line after the notes:\n{text}"
            f = line.split()
            assert len(f) == 3, line
            rows.append((int(f[0]), f[1], f[2]))
        else:
            notes.append(line)
    return af, rows, notes


def printed_tolerance(s, value):
    """Half a unit in the last printed digit of s, at least RTOL * |value|."""
    mant = s.lower().split("e")[0]
    exp = int(s.lower().split("e")[1]) if "e" in s.lower() else 0
    decimals = len(mant.split(".")[1]) if "." in mant else 0
    return max(0.5 * 10.0 ** (exp - decimals), RTOL * abs(value))


def rope_table(model, *flags, cwd=None):
    prefix = getattr(conftest, "RUN_PREFIX", [])  # an emulator for a cross build, as conftest.run uses
    r = subprocess.run([*prefix, RUN_BIN, str(model), "-m", "rope", *map(str, flags)], capture_output=True,
                       stdin=subprocess.DEVNULL, timeout=60, cwd=cwd)
    assert r.returncode == 0, f"{flags}: exit {r.returncode}\n{r.stderr.decode()}"
    return parse_rope_table(r.stdout.decode())


def table_mismatches(table, omega_ref, af_ref, what):
    """Every difference between a parsed -m rope table and the reference, as strings."""
    af, rows, notes = table
    bad = []
    if abs(float(af) - af_ref) > printed_tolerance(af, af_ref):
        bad.append(f"{what}: attention_factor {af}, reference {af_ref:.9g}")
    if [r[0] for r in rows] != list(range(len(omega_ref))):
        return bad + [f"{what}: pair indices {[r[0] for r in rows]}, want 0..{len(omega_ref) - 1}"]
    wl_ref = S.wavelengths(omega_ref)
    for (i, om, wl), o_ref, w_ref in zip(rows, omega_ref, wl_ref):
        if o_ref == 0:
            if float(om) != 0 or wl != "inf":
                bad.append(f"{what}: pair {i} does not rotate, got omega {om} wavelength {wl}")
            continue
        if not float(om) == pytest.approx(o_ref, rel=RTOL, abs=0):
            bad.append(f"{what}: pair {i} omega {om}, reference {o_ref:.9g} (rel {float(om) / o_ref - 1:.2e})")
        if wl == "inf" or not float(wl) == pytest.approx(w_ref, rel=RTOL, abs=0):
            bad.append(f"{what}: pair {i} wavelength {wl}, reference {w_ref:.9g}")
    if not notes:
        bad.append(f"{what}: no note lines after the table")
    bad += [f"{what}: note line {n!r} does not start with a letter" for n in notes if not n[0].isalpha()]
    return bad


def cases(rule):
    """(theta, p, factor, original length, header extras) for one rule, all combos x fractions."""
    extras = HEADER_EXTRAS[rule]
    for k, (theta, factor, L) in enumerate(COMBOS):
        for p in FRACTIONS:
            yield theta, p, 1.0 if rule == "none" else factor, L, extras[k % len(extras)]


@pytest.mark.parametrize("hs", HEAD_SIZES)
@pytest.mark.parametrize("rule", S.RULES)
def test_rope_table_matches_reference_rule_in_header(tmp_path, rule, hs):
    bad = []
    for n, (theta, p, factor, L, extra) in enumerate(cases(rule)):
        model = tiny_model(tmp_path / f"m{n}.bin", hs, rope_theta=theta, rope_fraction=p,
                           **S.header_fields(rule, factor, L, **extra))
        omega, af = S.scaled_omegas(theta, p, hs, rule, factor=factor, original_len=L, **extra)
        bad += table_mismatches(rope_table(model), omega, af,
                                f"header {rule} x{factor:g} L {L} theta {theta:g} p {p} {extra}")
    assert not bad, "\n".join(bad[:40])


@pytest.mark.parametrize("hs", HEAD_SIZES)
@pytest.mark.parametrize("rule", S.RULES)
def test_rope_table_matches_reference_rule_on_command_line(tmp_path, rule, hs):
    model = tiny_model(tmp_path / "plain.bin", hs)  # none, theta 10000, p 1
    bad = []
    for theta, p, factor, L, _ in cases(rule):
        flags = ["--rope-theta", theta, "--rope-fraction", p, "--rope-scaling", rule, "--rope-original-len", L]
        if rule != "none":  # run refuses a factor with none: it would have no effect
            flags += ["--rope-factor", factor]
        omega, af = S.scaled_omegas(theta, p, hs, rule, factor=factor, original_len=L)
        bad += table_mismatches(rope_table(model, *flags), omega, af, " ".join(map(str, flags)))
    assert not bad, "\n".join(bad[:40])


def test_rope_table_rule_zero_with_a_factor_is_linear(tmp_path):
    # older files: rope_scaling 0 and rope_factor 4 meant "divide every frequency by 4"
    model = tiny_model(tmp_path / "old.bin", 16, rope_fraction=0.75, rope_scale=4.0)
    omega, af = S.scaled_omegas(10000.0, 0.75, 16, "linear", factor=4.0)
    assert not table_mismatches(rope_table(model), omega, af, "old linear")


def test_rope_table_original_length_defaults_to_seq_len(tmp_path):
    # header rope_original_len 0: the rule is relative to the header's seq_len (64)
    model = tiny_model(tmp_path / "m.bin", 32, **S.header_fields("yarn", 4.0, 0))
    omega, af = S.scaled_omegas(10000.0, 1.0, 32, "yarn", factor=4.0, original_len=HEADER_SEQ_LEN)
    assert not table_mismatches(rope_table(model), omega, af, "yarn L=seq_len")
    other, _ = S.scaled_omegas(10000.0, 1.0, 32, "yarn", factor=4.0, original_len=4096)
    assert not np.allclose(omega, other)  # guard: the length matters here
    # and a longer context (-c) does not move it
    assert not table_mismatches(rope_table(model, "-c", 1024), omega, af, "yarn -c 1024")
    # --rope-original-len does
    assert not table_mismatches(rope_table(model, "--rope-original-len", 4096), other, af, "yarn L 4096")


def test_rope_table_factor_flag_keeps_the_files_rule_and_parameters(tmp_path):
    extra = {"beta_fast": 16.0, "beta_slow": 2.0, "attention_factor": 1.5}
    model = tiny_model(tmp_path / "y.bin", 64, **S.header_fields("yarn", 4.0, 512, **extra))
    omega, af = S.scaled_omegas(10000.0, 1.0, 64, "yarn", factor=16.0, original_len=512, **extra)
    assert not table_mismatches(rope_table(model, "--rope-factor", 16), omega, af, "yarn x16 from the flag")
    # a file with no rule becomes linear
    plain = tiny_model(tmp_path / "p.bin", 64)
    omega, af = S.scaled_omegas(10000.0, 1.0, 64, "linear", factor=3.0)
    assert not table_mismatches(rope_table(plain, "--rope-factor", 3), omega, af, "none -> linear x3")


def test_rope_table_changing_the_rule_resets_its_parameters(tmp_path):
    yarn = tiny_model(tmp_path / "y.bin", 64, **S.header_fields("yarn", 4.0, 512, beta_fast=16.0,
                                                                   beta_slow=2.0, attention_factor=1.5))
    omega, af = S.scaled_omegas(10000.0, 1.0, 64, "llama3", factor=4.0, original_len=512)
    assert not table_mismatches(rope_table(yarn, "--rope-scaling", "llama3"), omega, af, "yarn -> llama3")
    llama = tiny_model(tmp_path / "l.bin", 64, **S.header_fields("llama3", 8.0, 512, low_freq_factor=2.0,
                                                                    high_freq_factor=8.0))
    omega, af = S.scaled_omegas(10000.0, 1.0, 64, "yarn", factor=8.0, original_len=512)
    assert not table_mismatches(rope_table(llama, "--rope-scaling", "yarn"), omega, af, "llama3 -> yarn")
    omega, af = S.scaled_omegas(10000.0, 1.0, 64, "none", original_len=512)
    assert not table_mismatches(rope_table(llama, "--rope-scaling", "none"), omega, af, "llama3 -> none")


def test_rope_table_yarn_bounds_outside_the_pairs_follow_transformers(tmp_path):
    # low (10) above high (7): transformers' ramp is >= 1 on every pair, all divided
    model = tiny_model(tmp_path / "m.bin", 8, rope_theta=10.0, **S.header_fields("yarn", 4.0, 100000))
    omega, af = S.scaled_omegas(10.0, 1.0, 8, "yarn", factor=4.0, original_len=100000)
    assert not table_mismatches(rope_table(model), omega, af, "yarn low > high")
    # equal bounds (L 4): the 0.001 guard
    model = tiny_model(tmp_path / "e.bin", 16, **S.header_fields("yarn", 2.0, 4))
    omega, af = S.scaled_omegas(10000.0, 1.0, 16, "yarn", factor=2.0, original_len=4)
    assert not table_mismatches(rope_table(model), omega, af, "yarn low == high")


def test_rope_mode_needs_only_the_checkpoint(tmp_path):
    model = tiny_model(tmp_path / "m.bin", 16, **S.header_fields("llama3", 8.0, 32))
    elsewhere = tmp_path / "empty"
    elsewhere.mkdir()  # no tokenizer.bin here
    omega, af = S.scaled_omegas(10000.0, 1.0, 16, "llama3", factor=8.0, original_len=32)
    assert not table_mismatches(rope_table(model, cwd=elsewhere), omega, af, "no tokenizer")


def test_startup_line_names_the_rule(tmp_path):
    model = tiny_model(tmp_path / "m.bin", 16, vocab_size=512, **S.header_fields("yarn", 8.0, 64))
    r = run(model, "-z", TOK512, "-t", 0, "-n", 3, "-p", "Once")
    assert r.returncode == 0, r.stderr
    line = [x for x in r.stderr.decode().splitlines() if x.startswith("run: ")][0]
    assert re.search(r"\byarn x8\b.*\boriginal (length )?64\b", line), line


# =====================================================================================
# 3. -m ppl against the reference forward pass
# =====================================================================================

HF = dict(dim=64, hidden_dim=96, n_layers=2, n_heads=2, n_kv_heads=1, vocab_size=512)  # head size 32


def tokens_of(model, text=TEXT):
    return conftest.tokens_of(model, text)


def run_nll(model, *flags, text=TEXT):
    r = run(model, "-z", TOK512, "-m", "ppl", "-p", text, *flags)
    assert r.returncode == 0, r.stderr.decode()
    lines = r.stdout.decode().splitlines()
    assert lines[-2].startswith("nll: ") and lines[-1].startswith("perplexity: "), lines
    return float(lines[-2].split()[1])


def ref_nll(config, tensors, tokens, rope):
    return reference.nll(reference.forward(config, tensors, tokens, rope), tokens)


def assert_close(got, expect, rel=NLL_REL, what=""):
    assert abs(got - expect) <= rel * abs(expect), f"{what}: run.c {got} vs reference {expect}"


def plain_rope(config):
    """The config's rotary embedding with its scaling rule taken away (same theta and p)."""
    params = S.scaling_from_config(config)
    params.update(rule="none", factor=1.0, attention_factor=1.0, beta_fast=None, beta_slow=None,
                  low_freq_factor=None, high_freq_factor=None)
    return S.rope_for_forward(params)


HF_CASES = {
    "linear-v4": dict(layout="v4", seq_len=256, rope={"type": "linear", "factor": 2.0}),
    "linear-v5-theta500k": dict(layout="v5", seq_len=256, rope={"type": "linear", "theta": 500000.0,
                                                                "factor": 4.0}),
    "yarn-v4-defaults": dict(layout="v4", seq_len=128, rope={"type": "yarn", "factor": 4.0,
                                                             "original_max_position_embeddings": 32}),
    "yarn-v5-betas-attention-factor": dict(
        layout="v5", seq_len=128, rope={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
                                        "beta_fast": 8.0, "beta_slow": 2.0, "attention_factor": 1.5}),
    "yarn-v4-old-type-key-factor-8": dict(
        layout="v4", seq_len=512, rope={"type": "yarn", "type_key": "type", "factor": 8.0,
                                        "original_max_position_embeddings": 64, "theta": 500000.0}),
    "yarn-v4-partial-rotary-factor": dict(
        layout="v4", seq_len=128, rope={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
                                        "partial_rotary_factor": 0.5}),
    # factor 4 although max_position_embeddings / original = 8: transformers uses 4
    "yarn-v4-factor-differs-from-length-ratio": dict(
        layout="v4", seq_len=256, rope={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}),
    "llama3-v4": dict(layout="v4", seq_len=256, rope={"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                      "high_freq_factor": 4.0,
                                                      "original_max_position_embeddings": 32}),
    "llama3-v5-factors-2-8": dict(layout="v5", seq_len=256, rope={"type": "llama3", "theta": 500000.0,
                                                                  "factor": 4.0, "low_freq_factor": 2.0,
                                                                  "high_freq_factor": 8.0,
                                                                  "original_max_position_embeddings": 48}),
}


@pytest.mark.parametrize("name", list(HF_CASES))
def test_ppl_of_exported_scaled_checkpoint_matches_reference(tmp_path, name):
    case = HF_CASES[name]
    config, tensors = hf_fixture.make_hf_checkpoint(tmp_path, **HF, seq_len=case["seq_len"], seed=21,
                                                    layout=case["layout"], rope=case["rope"])
    params = S.scaling_from_config(config)
    rope = S.rope_for_forward(params)
    out = tmp_path / "model.bin"
    export(tmp_path, out)
    tokens = tokens_of(out)
    assert len(tokens) - 1 > (params["original_len"] or 64) and len(tokens) <= case["seq_len"]
    expect = ref_nll(config, tensors, tokens, rope)
    # guard: the rule changes the answer, so matching it means applying it
    assert abs(expect - ref_nll(config, tensors, tokens, plain_rope(config))) > 1e-3
    assert_close(run_nll(out), expect, what=name)


def test_ppl_of_exported_yarn_with_mscale_matches_reference_or_is_refused(tmp_path):
    # DeepSeek-style: attention factor = get_mscale(s, mscale) / get_mscale(s, mscale_all_dim)
    rope = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "mscale": 1.0,
            "mscale_all_dim": 0.5}
    config, tensors = hf_fixture.make_hf_checkpoint(tmp_path, **HF, seq_len=128, seed=22, rope=rope)
    out = tmp_path / "model.bin"
    r = export(tmp_path, out, check=False)
    if r.returncode != 0:  # refusing, with a reason, beats exporting it subtly wrong
        assert "mscale" in r.stderr, r.stderr
        return
    params = S.scaling_from_config(config)
    assert params["attention_factor"] == pytest.approx((0.1 * math.log(4) + 1) / (0.05 * math.log(4) + 1))
    tokens = tokens_of(out)
    assert_close(run_nll(out), ref_nll(config, tensors, tokens, S.rope_for_forward(params)), what="mscale")


def test_exported_yarn_without_truncation_matches_reference_or_is_refused(tmp_path):
    # gpt-oss style "truncate": false (no floor/ceil of the correction range) has no header
    # field; the nll differs from the truncated rule's by ~2e-2 here, so it cannot pass by accident
    rope = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "beta_fast": 8.0,
            "beta_slow": 2.0, "truncate": False}
    config, tensors = hf_fixture.make_hf_checkpoint(tmp_path, **HF, seq_len=128, seed=21, layout="v5", rope=rope)
    out = tmp_path / "model.bin"
    r = export(tmp_path, out, check=False)
    if r.returncode != 0:
        assert "truncate" in r.stderr, r.stderr
        return
    params = S.scaling_from_config(config)
    assert params["truncate"] is False
    tokens = tokens_of(out)
    assert_close(run_nll(out), ref_nll(config, tensors, tokens, S.rope_for_forward(params)), what="truncate")


def exported_plain_hf(tmp_path_factory, name, seq_len, seed):
    """(config, tensors, ROPE file, TEXT's tokens) of an HF checkpoint without rope_scaling."""
    d = tmp_path_factory.mktemp(name)
    config, tensors = hf_fixture.make_hf_checkpoint(d, **HF, seq_len=seq_len, seed=seed)
    out = d / "model.bin"
    export(d, out)
    return config, tensors, out, tokens_of(out)


@pytest.fixture(scope="module")
def plain_hf(tmp_path_factory):
    """A RoPE checkpoint without rope_scaling, max_position_embeddings 256, exported once."""
    return exported_plain_hf(tmp_path_factory, "hf_plain_scaling", 256, 23)


CLI_RULES = [
    ("linear", dict(factor=2.0), []),
    ("ntk", dict(factor=4.0), []),
    ("yarn", dict(factor=4.0, original_len=32), ["--rope-original-len", 32]),
    ("llama3", dict(factor=8.0, original_len=32), ["--rope-original-len", 32]),
    ("yarn-p-0.5-theta-500k", dict(factor=8.0, original_len=16), ["--rope-original-len", 16]),
]


@pytest.mark.parametrize("name,kw,more", CLI_RULES, ids=[c[0] for c in CLI_RULES])
def test_ppl_with_rule_on_command_line_matches_reference(plain_hf, name, kw, more):
    config, tensors, out, tokens = plain_hf
    rule = name.split("-")[0]
    theta, p = (500000.0, 0.5) if "p-0.5" in name else (10000.0, 1.0)
    rope = S.rope_dict(theta, p, 32, rule, **kw)
    flags = ["--rope-scaling", rule, "--rope-factor", kw["factor"], *more]
    if p != 1.0:
        flags += ["--rope-theta", theta, "--rope-fraction", p]
    expect = ref_nll(config, tensors, tokens, rope)
    assert abs(expect - ref_nll(config, tensors, tokens, S.rope_dict(theta, p, 32))) > 1e-3
    assert_close(run_nll(out, *flags), expect, what=name)


@pytest.fixture(scope="module")
def short_hf(tmp_path_factory):
    """A plain checkpoint whose header seq_len (max_position_embeddings) is 32 < the text's 113 tokens."""
    return exported_plain_hf(tmp_path_factory, "hf_short", 32, 24)


def test_context_flag_longer_than_seq_len_scores_one_window(short_hf):
    config, tensors, out, tokens = short_hf
    r = run(out, "-z", TOK512, "-m", "ppl", "-p", TEXT, "-c", 128)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.decode().splitlines()
    assert "windows: 1" in lines, lines
    assert_close(float(lines[-2].split()[1]), ref_nll(config, tensors, tokens, S.rope_dict(10000.0, 1.0, 32)),
                 what="-c 128 plain")


def test_context_flag_with_yarn_keeps_the_seq_len_as_original_length(short_hf):
    # no original length in the header (or the exporter's 32): yarn over 113 tokens relative to L = 32
    config, tensors, out, tokens = short_hf
    rope = S.rope_dict(10000.0, 1.0, 32, "yarn", factor=4.0, original_len=32)
    got = run_nll(out, "-c", 128, "--rope-scaling", "yarn", "--rope-factor", 4)
    assert_close(got, ref_nll(config, tensors, tokens, rope), what="-c 128 yarn")
    # and the same with the length spelled out, and with --context
    assert_close(run_nll(out, "--context", 128, "--rope-scaling", "yarn", "--rope-factor", 4,
                         "--rope-original-len", 32), ref_nll(config, tensors, tokens, rope), what="--context")


def windows_of(tokens, n):
    """-m ppl's windows for a context of n: BOS + the next n-1 text tokens each."""
    text = tokens[1:]
    return [[tokens[0]] + text[i:i + n - 1] for i in range(0, len(text), n - 1)]


def test_ppl_csv_rows_are_per_token_nll_at_window_positions(plain_hf, tmp_path):
    config, tensors, out, tokens = plain_hf
    rope = S.rope_dict(10000.0, 1.0, 32, "yarn", factor=4.0, original_len=16)
    path = tmp_path / "nll.csv"
    r = run(out, "-z", TOK512, "-m", "ppl", "-p", TEXT, "-c", 40, "--rope-scaling", "yarn", "--rope-factor", 4,
            "--rope-original-len", 16, "--csv", path)
    assert r.returncode == 0, r.stderr
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["position", "nll"]
    want_pos, want_nll = [], []
    for w in windows_of(tokens, 40):
        want_nll += list(reference.token_nll(reference.forward(config, tensors, w, rope), w))
        want_pos += list(range(len(w) - 1))
    assert [int(r[0]) for r in rows[1:]] == want_pos
    got = np.array([float(r[1]) for r in rows[1:]])
    np.testing.assert_allclose(got, want_nll, rtol=1e-4, atol=1e-4)
    # the summary line is their mean
    nll_line = [x for x in r.stdout.decode().splitlines() if x.startswith("nll: ")][0]
    assert float(nll_line.split()[1]) == pytest.approx(got.mean(), rel=1e-5)


def test_ppl_csv_with_one_window_and_the_files_rule(tmp_path):
    rope_cfg = {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32}
    config, tensors = hf_fixture.make_hf_checkpoint(tmp_path, **HF, seq_len=256, seed=25, rope=rope_cfg)
    out = tmp_path / "model.bin"
    export(tmp_path, out)
    tokens = tokens_of(out)
    path = tmp_path / "nll.csv"
    r = run(out, "-z", TOK512, "-m", "ppl", "-p", TEXT, "--csv", path)
    assert r.returncode == 0, r.stderr
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    want = reference.token_nll(reference.forward(config, tensors, tokens,
                                                 S.rope_for_forward(S.scaling_from_config(config))), tokens)
    assert [int(r[0]) for r in rows[1:]] == list(range(len(tokens) - 1))
    np.testing.assert_allclose([float(r[1]) for r in rows[1:]], want, rtol=1e-4, atol=1e-4)


# =====================================================================================
# 4. Bad values: one error line
# =====================================================================================

def one_error_line(r, code, argv, names=()):
    err = r.stderr.decode("utf-8", "replace")
    context = f"\nargv: {[str(a)[:60] for a in argv]}\nexit: {r.returncode}\nstderr:\n{err[-2000:]}"
    assert r.returncode == code, context
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("run: error:"), "want exactly one error line" + context
    if names:
        assert any(n in lines[0] for n in names), f"the error line should name one of {names}" + context
    if code == 2:
        assert r.stdout == b"", context


def story(*a):
    return [STORIES, "-z", TOK512, *a]


BAD_FLAGS = [
    ("rope-scaling-bogus", story("--rope-scaling", "bogus"), ("--rope-scaling", "bogus")),
    ("rope-scaling-dynamic", story("--rope-scaling", "dynamic"), ("--rope-scaling", "dynamic")),
    ("rope-scaling-missing-value", story("--rope-scaling"), ("--rope-scaling",)),
    ("rope-factor-zero", story("--rope-factor", "0"), ("--rope-factor",)),
    ("rope-factor-negative", story("--rope-factor", "-1"), ("--rope-factor",)),
    ("rope-factor-nan", story("--rope-factor", "nan"), ("--rope-factor",)),
    ("rope-factor-inf", story("--rope-factor", "inf"), ("--rope-factor",)),
    ("rope-factor-abc", story("--rope-factor", "abc"), ("--rope-factor",)),
    ("rope-factor-missing-value", story("--rope-factor"), ("--rope-factor",)),
    ("yarn-factor-below-one", story("--rope-scaling", "yarn", "--rope-factor", "0.5"), ("--rope-factor", "yarn")),
    ("ntk-factor-below-one", story("--rope-scaling", "ntk", "--rope-factor", "0.5"), ("--rope-factor", "ntk")),
    ("llama3-factor-below-one", story("--rope-factor", "0.9", "--rope-scaling", "llama3"),
     ("--rope-factor", "llama3")),
    ("rope-original-len-zero", story("--rope-original-len", "0"), ("--rope-original-len",)),
    ("rope-original-len-negative", story("--rope-original-len", "-5"), ("--rope-original-len",)),
    ("rope-original-len-abc", story("--rope-original-len", "abc"), ("--rope-original-len",)),
    ("rope-original-len-fraction", story("--rope-original-len", "1.5"), ("--rope-original-len",)),
    ("rope-original-len-too-large", story("--rope-original-len", "1048577"), ("--rope-original-len",)),
    ("c-zero", story("-c", "0"), ("-c", "--context")),
    ("c-negative", story("-c", "-1"), ("-c", "--context")),
    ("c-huge", story("-c", "99999999999"), ("-c", "--context")),
    ("c-abc", story("-c", "abc"), ("-c", "--context")),
    ("c-too-large", story("-c", "1048577"), ("-c", "--context")),
    ("c-missing-value", story("-c"), ("-c", "--context")),
    ("context-zero", story("--context", "0"), ("-c", "--context")),
]


@pytest.mark.parametrize("argv,names", [r[1:] for r in BAD_FLAGS], ids=[r[0] for r in BAD_FLAGS])
def test_bad_scaling_flag_exits_2_with_one_line(argv, names):
    one_error_line(run(*argv), 2, argv, names)


def test_context_whose_kv_cache_exceeds_64_gib_exits_2(tmp_path):
    # 72 layers x kv_dim 128 x 2 (k, v) x 4 bytes x 1048576 positions = 72 GiB
    model = write_random_checkpoint(tmp_path / "deep.bin", dim=128, hidden_dim=8, n_layers=72, n_heads=1,
                                    n_kv_heads=1, vocab_size=512, seq_len=16)
    argv = [model, "-z", TOK512, "-t", "0", "-n", "2", "-p", "Once", "-c", "1048576"]
    one_error_line(run(*argv), 2, argv)


def bad_header_model(tmp_path, edits=(), **header):
    model = write_random_checkpoint(tmp_path / "bad.bin", dim=16, hidden_dim=16, n_layers=1, n_heads=2,
                                    n_kv_heads=1, vocab_size=512, seq_len=32, **header)
    data = bytearray(model.read_bytes())
    for offset, fmt, value in edits:
        struct.pack_into(fmt, data, offset, value)
    model.write_bytes(bytes(data))
    return model


NAN, INF = float("nan"), float("inf")
BAD_HEADERS = [
    ("rule-7", dict(rope_scaling=7)),
    ("rule-negative", dict(rope_scaling=-1)),
    ("original-len-negative", dict(S.header_fields("yarn", 4.0, -5))),
    ("factor-nan", dict(S.header_fields("linear", NAN))),
    ("factor-inf", dict(S.header_fields("linear", INF))),
    ("factor-zero-linear", dict(S.header_fields("linear", 0.0))),
    ("factor-negative-none", dict(rope_scale=-2.0)),
    ("yarn-factor-below-one", dict(S.header_fields("yarn", 0.5))),
    ("ntk-factor-below-one", dict(S.header_fields("ntk", 0.5))),
    ("beta-fast-with-linear", dict(S.header_fields("linear", 2.0, beta_fast=16.0))),
    ("beta-slow-with-llama3", dict(S.header_fields("llama3", 8.0, beta_slow=2.0))),
    ("beta-fast-with-none", dict(yarn_beta_fast=32.0)),
    ("llama3-factor-with-yarn", dict(S.header_fields("yarn", 4.0, low_freq_factor=1.0))),
    ("llama3-factor-with-ntk", dict(S.header_fields("ntk", 4.0, high_freq_factor=4.0))),
    ("llama3-high-equals-low", dict(S.header_fields("llama3", 8.0, low_freq_factor=2.0, high_freq_factor=2.0))),
    ("llama3-high-below-low", dict(S.header_fields("llama3", 8.0, low_freq_factor=4.0, high_freq_factor=1.0))),
    ("llama3-high-below-default-low", dict(S.header_fields("llama3", 8.0, high_freq_factor=0.5))),
    ("yarn-beta-negative", dict(S.header_fields("yarn", 4.0, beta_fast=-32.0))),
    ("yarn-beta-nan", dict(S.header_fields("yarn", 4.0, beta_slow=NAN))),
    ("attention-factor-negative", dict(S.header_fields("yarn", 4.0, attention_factor=-1.0))),
    ("attention-factor-nan", dict(S.header_fields("linear", 2.0, attention_factor=NAN))),
    ("attention-factor-inf", dict(S.header_fields("yarn", 4.0, attention_factor=INF))),
    ("llama3-low-nan", dict(S.header_fields("llama3", 8.0, low_freq_factor=NAN))),
    ("reserved-byte-84", dict(edits=[(84, "<B", 1)])),
    ("reserved-byte-128", dict(edits=[(128, "<B", 0x80)])),
    ("reserved-byte-255", dict(edits=[(255, "<B", 1)])),
]


@pytest.mark.parametrize("fields", [r[1] for r in BAD_HEADERS], ids=[r[0] for r in BAD_HEADERS])
def test_bad_scaling_header_field_exits_1_with_one_line(tmp_path, fields):
    model = bad_header_model(tmp_path, **fields)
    argv = [model, "-z", TOK512, "-t", "0", "-n", "4", "-p", "Once"]
    one_error_line(run(*argv), 1, argv, names=("bad.bin",))


def test_bad_header_also_fails_rope_mode(tmp_path):
    model = bad_header_model(tmp_path, **S.header_fields("llama3", 8.0, low_freq_factor=2.0, high_freq_factor=2.0))
    one_error_line(run(model, "-m", "rope"), 1, [model, "-m", "rope"])


def test_good_scaling_headers_load(tmp_path):
    # the controls for the table above: each rule with its own fields set is accepted
    for n, fields in enumerate([S.header_fields("ntk", 1.0),
                                S.header_fields("yarn", 4.0, 16, beta_fast=16.0, beta_slow=2.0, attention_factor=1.1),
                                S.header_fields("llama3", 8.0, 16, low_freq_factor=2.0, high_freq_factor=8.0),
                                S.header_fields("linear", 2.0, attention_factor=0.9)]):
        model = write_random_checkpoint(tmp_path / f"ok{n}.bin", dim=16, hidden_dim=16, n_layers=1, n_heads=2,
                                        n_kv_heads=1, vocab_size=512, seq_len=32, **fields)
        r = run(model, "-z", TOK512, "-t", "0", "-n", "4", "-p", "Once")
        assert r.returncode == 0 and b"run: error" not in r.stderr, (fields, r.stderr)


def test_factor_below_one_is_refused_for_every_rule_even_linear(tmp_path):
    # every rule stretches positions: a factor below 1 (which would compress them) is
    # refused in the header (exit 1) and on the command line (exit 2)
    model = tiny_model(tmp_path / "c.bin", 16, **S.header_fields("linear", 0.5))
    argv = [model, "-m", "rope"]
    one_error_line(run(*argv), 1, argv, ("rope_factor 0.5",))
    plain = tiny_model(tmp_path / "p.bin", 16)
    argv = [plain, "-m", "rope", "--rope-scaling", "linear", "--rope-factor", "0.5"]
    one_error_line(run(*argv), 2, argv, ("--rope-factor",))
