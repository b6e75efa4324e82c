"""Self-checks of tests/gemma4_reference.py and tests/gemma4_fixtures.py: each pins one
behaviour of the published Gemma 4 decoder (see gemma4_reference's docstring), and each can
fail. NumPy only; a few seconds in all."""

import copy
import math

import numpy as np
import pytest

import gemma4_fixtures as F
import gemma4_reference as g4
import hf_fixture

TEXT = list(np.random.default_rng(7).integers(3, 512, 30))  # crosses the windows of 8


@pytest.fixture(scope="module")
def e2b(tmp_path_factory):
    d = tmp_path_factory.mktemp("e2b")
    return F.write_checkpoint(d, "gemma-4-E2B-it", "F32")


@pytest.fixture(scope="module")
def b31(tmp_path_factory):
    d = tmp_path_factory.mktemp("b31")
    return F.write_checkpoint(d, "gemma-4-31B-it", "F32")


def _edit(tensors, name_end, fn):
    out = dict(tensors)
    hits = [n for n in out if n.endswith(name_end)]
    assert len(hits) == 1, (name_end, hits)
    out[hits[0]] = fn(out[hits[0]])
    return out


# ---------------------------------------------------------------------------
# RoPE
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["gemma-4-E2B-it", "gemma-4-E4B", "gemma-4-31B"])
def test_proportional_rope_turns_64_of_256_pairs_at_full_rope_frequencies(name):
    c = F.REAL_CONFIGS[name]
    full = g4.layer_kinds(c).index("full_attention")
    inv = g4.inverse_frequencies(c, full)
    assert g4.head_dim(c, full) == 512 and inv.shape == (256,)
    assert np.count_nonzero(inv) == 64 and np.all(inv[64:] == 0)
    i = np.arange(64)
    np.testing.assert_allclose(inv[:64], 1e6 ** (-2 * i / 512), rtol=1e-15)
    # the unrotated dims are 64..255 and 320..511 (rotate_half pairs j, j + 256)
    x = np.random.default_rng(0).standard_normal((1, 1, 512))
    y = g4.apply_rope(x, [1000], inv)
    still = np.r_[64:256, 320:512]
    moved = np.r_[0:64, 256:320]
    assert np.array_equal(y[..., still], x[..., still])
    assert np.all(np.abs(y[..., moved] - x[..., moved]) > 0)


def test_sliding_layers_rotate_every_pair_at_theta_10000_over_256():
    c = F.REAL_CONFIGS["gemma-4-E2B-it"]
    inv = g4.inverse_frequencies(c, 0)
    assert g4.head_dim(c, 0) == 256 and inv.shape == (128,)
    np.testing.assert_allclose(inv, 1e4 ** (-2 * np.arange(128) / 256), rtol=1e-15)


@pytest.mark.parametrize("layer", [0, 4])  # E2B: sliding, full
def test_score_depends_only_on_offset(layer):
    c = F.REAL_CONFIGS["gemma-4-E2B-it"]
    hd, inv = g4.head_dim(c, layer), g4.inverse_frequencies(c, layer)
    rng = np.random.default_rng(layer)
    q, k = rng.standard_normal((2, 1, 1, hd))

    def score(m, n):
        return float(np.sum(g4.apply_rope(q, [m], inv) * g4.apply_rope(k, [n], inv)))

    for m, n in [(5, 2), (40, 0), (300, 299)]:
        for shift in (1, 17, 4096):
            assert score(m + shift, n + shift) == pytest.approx(score(m, n), rel=1e-9, abs=1e-9)
    assert abs(score(5, 2) - score(6, 2)) > 1e-6  # and it does depend on the offset


# ---------------------------------------------------------------------------
# Layer pattern, KV sharing
# ---------------------------------------------------------------------------

def test_kv_source_map_of_published_configs():
    e2b = F.REAL_CONFIGS["gemma-4-E2B-it"]
    src = g4.kv_sources(e2b)
    assert src[:15] == list(range(15))
    assert all(src[i] == (14 if i % 5 == 4 else 13) for i in range(15, 35))
    assert [g4.intermediate_size(e2b, i) for i in (14, 15, 34)] == [6144, 12288, 12288]
    e4b = F.REAL_CONFIGS["gemma-4-E4B"]
    src = g4.kv_sources(e4b)
    assert src[:24] == list(range(24))
    assert all(src[i] == (23 if i % 6 == 5 else 22) for i in range(24, 42))
    assert g4.intermediate_size(e4b, 41) == 10240  # no double-wide MLP on E4B
    b31 = F.REAL_CONFIGS["gemma-4-31B"]
    assert g4.kv_sources(b31) == list(range(60))
    full = [i for i, k in enumerate(g4.layer_kinds(b31)) if k == "full_attention"]
    assert full == list(range(5, 60, 6))
    assert [g4.kv_heads(b31, i) for i in (0, 5)] == [16, 4]
    assert [g4.head_dim(b31, i) for i in (0, 5)] == [256, 512]
    assert g4.text_config(b31)["sliding_window"] == 1024


def test_last_layer_is_forced_to_full_attention():
    t = copy.deepcopy(F.REAL_CONFIGS["gemma-4-E2B"]["text_config"])
    t["layer_types"] = ["sliding_attention"] * 35
    assert g4.layer_kinds(t)[-1] == "full_attention"
    del t["layer_types"]
    kinds = g4.layer_kinds(t)
    assert [i for i, k in enumerate(kinds) if k == "full_attention"] == [5, 11, 17, 23, 29, 34]


def test_shared_layer_reads_its_source_layers_keys(e2b):
    config, tensors = e2b
    src = g4.kv_sources(config)
    shared = [i for i in range(len(src)) if src[i] != i]
    kinds = g4.layer_kinds(config)
    assert {kinds[i] for i in shared} == {"sliding_attention", "full_attention"}
    trace = {}
    base = g4.forward(config, tensors, TEXT, trace)
    for i in shared:
        assert trace[i]["k"] is trace[src[i]]["k"] and trace[i]["v"] is trace[src[i]]["v"]
        assert trace[i]["k_raw"] is None
    # changing a source's k_proj changes what its shared layers attend over (not by a
    # scale factor: k_norm would undo that)
    s = src[shared[0]]
    t2 = {}
    noise = np.random.default_rng(3).standard_normal
    g4.forward(config, _edit(tensors, f"layers.{s}.self_attn.k_proj.weight",
                             lambda a: a + 0.3 * noise(a.shape)), TEXT, t2)
    for i in shared:
        if src[i] == s:
            assert not np.allclose(t2[i]["k"], trace[i]["k"])
    # a shared layer's own k/v weights change nothing
    edited = tensors
    for i in shared:
        for n in ("k_proj", "v_proj", "k_norm"):
            edited = _edit(edited, f"layers.{i}.self_attn.{n}.weight", lambda a: -3.0 * a + 1.0)
    assert np.array_equal(g4.forward(config, edited, TEXT), base)
    stripped = {n: a for n, a in tensors.items()
                if not any(f"layers.{i}.self_attn.{m}" in n for i in shared
                           for m in ("k_proj", "v_proj", "k_norm"))}
    assert np.array_equal(g4.forward(config, stripped, TEXT), base)


def test_shared_layers_have_double_wide_mlps_in_the_e2b_fixture(e2b):
    config, tensors = e2b
    c = g4.text_config(config)
    for i in range(c["num_hidden_layers"]):
        gate = tensors[f"model.language_model.layers.{i}.mlp.gate_proj.weight"]
        assert gate.shape[0] == c["intermediate_size"] * (2 if g4.is_shared(c, i) else 1)


# ---------------------------------------------------------------------------
# k = v
# ---------------------------------------------------------------------------

def test_k_equals_v_before_the_norms_on_31b_full_layers(b31):
    config, tensors = b31
    c = g4.text_config(config)
    full = [i for i, k in enumerate(c["layer_types"]) if k == "full_attention"]
    assert all(f"model.language_model.layers.{i}.self_attn.v_proj.weight" not in tensors
               for i in full)
    trace = {}
    g4.forward(config, tensors, TEXT, trace)
    for i in full:
        t = trace[i]
        assert t["v_raw"] is t["k_raw"]
        assert t["k_raw"].shape[1] == c["num_global_key_value_heads"]
        np.testing.assert_allclose(t["v"], g4.rms_norm(t["k_raw"], None, c["rms_norm_eps"]),
                                   rtol=1e-14)
        assert not np.allclose(t["k"], t["v"])  # k_norm's weight and RoPE act on k only
    # sliding layers keep their own v_proj and kv head count
    t0 = trace[0]
    assert t0["v_raw"] is not t0["k_raw"] and t0["k_raw"].shape[1] == c["num_key_value_heads"]


# ---------------------------------------------------------------------------
# Layer scalars, norms, per-layer inputs, embedding
# ---------------------------------------------------------------------------

def test_layer_scalar_multiplies_the_whole_residual_stream(e2b):
    config, tensors = e2b
    L = g4.text_config(config)["num_hidden_layers"]
    t1, t2 = {}, {}
    g4.forward(config, _edit(tensors, "layers.2.layer_scalar", lambda a: np.ones(1)), TEXT, t1)
    g4.forward(config, _edit(tensors, "layers.2.layer_scalar", lambda a: np.full(1, 2.0)), TEXT, t2)
    np.testing.assert_allclose(t2[2]["out"], 2 * t1[2]["out"], rtol=1e-13)
    zero = g4.forward(config, _edit(tensors, f"layers.{L - 1}.layer_scalar",
                                    lambda a: np.zeros(1)), TEXT)
    assert np.all(zero == 0)  # nothing survives the last layer's scalar 0


def test_norms_use_the_weight_as_stored(e2b):
    config, tensors = e2b
    assert np.all(g4.forward(config, _edit(tensors, "language_model.norm.weight", np.zeros_like),
                             TEXT) == 0)  # Gemma 3's (1 + w) would leave logits


def test_per_layer_inputs_feed_every_layer(e2b):
    config, tensors = e2b
    c = g4.text_config(config)
    base = g4.forward(config, tensors, TEXT)
    # a token's row in embed_tokens_per_layer matters...
    tok = int(TEXT[3])
    e = _edit(tensors, "embed_tokens_per_layer.weight", lambda a: a + np.eye(a.shape[0])[tok][:, None])
    assert not np.allclose(g4.forward(config, e, TEXT)[3:], base[3:])
    assert np.array_equal(g4.forward(config, e, TEXT)[:3], base[:3]) or tok in TEXT[:3]
    # ...and nothing of it is left once every layer's per_layer_projection is zero
    z = tensors
    for i in range(c["num_hidden_layers"]):
        z = _edit(z, f"layers.{i}.per_layer_projection.weight", np.zeros_like)
    a = g4.forward(config, z, TEXT)
    b = g4.forward(config, _edit(z, "embed_tokens_per_layer.weight", lambda x: 5 * x), TEXT)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)
    # the combination: (RMSNorm(proj(e) * H^-0.5) + table * sqrt(P)) * 2^-0.5
    trace = {}
    g4.forward(config, tensors, TEXT, trace)
    w = g4.strip_prefix(tensors)
    H, L, P = c["hidden_size"], c["num_hidden_layers"], c["hidden_size_per_layer_input"]
    proj = (trace["embed"] @ w["per_layer_model_projection.weight"].T * H ** -0.5).reshape(-1, L, P)
    proj = proj / np.sqrt(np.mean(proj ** 2, -1, keepdims=True) + 1e-6) * w["per_layer_projection_norm.weight"]
    table = w["embed_tokens_per_layer.weight"][TEXT].reshape(-1, L, P) * g4.round_to(math.sqrt(P), "F32")
    np.testing.assert_allclose(trace["per_layer_inputs"], (proj + table) / math.sqrt(2), rtol=1e-12)


def test_embedding_scale_is_rounded_to_the_weights_dtype(tmp_path):
    config, tensors = F.write_checkpoint(tmp_path, "gemma-4-31B", "BF16")
    trace = {}
    g4.forward(config, tensors, TEXT[:4], trace)
    emb = tensors["model.language_model.embed_tokens.weight"][TEXT[:4]]
    assert g4.round_to(math.sqrt(96), "BF16") == 9.8125
    np.testing.assert_array_equal(trace["embed"], emb * 9.8125)


def test_final_logits_are_soft_capped_at_30(e2b):
    config, tensors = e2b
    big = g4.forward(config, _edit(tensors, "language_model.norm.weight", lambda a: 10 * a), TEXT)
    assert 25 < np.abs(big).max() < 30
    raw = g4.forward(dict(g4.text_config(config), final_logit_softcapping=None),
                     _edit(tensors, "language_model.norm.weight", lambda a: 10 * a), TEXT)
    assert np.abs(raw).max() > 40
    np.testing.assert_allclose(big, 30 * np.tanh(raw / 30), rtol=1e-13)


# ---------------------------------------------------------------------------
# Sliding window
# ---------------------------------------------------------------------------

def test_sliding_window_masks_keys_beyond_the_window():
    m = g4.attention_mask(12, 4)
    for t in range(12):
        assert [s for s in range(12) if m[t, s]] == list(range(max(0, t - 3), t + 1))
    assert g4.attention_mask(12, None)[11].all()


@pytest.mark.parametrize("layer,reach", [(0, 8), (5, 30)])  # 31B fixture: sliding, full
def test_a_token_reaches_window_positions_on_sliding_layers_only(b31, layer, reach):
    config, tensors = b31
    c = g4.text_config(config)
    w = g4.strip_prefix(tensors)
    x = np.random.default_rng(1).standard_normal((30, c["hidden_size"]))
    y = x.copy()
    y[0] += 1.0
    pos = np.arange(30)
    a = g4.attention(c, w, layer, x, pos, {})
    b = g4.attention(c, w, layer, y, pos, {})
    changed = np.any(np.abs(a - b) > 1e-12, axis=-1)
    assert changed[:reach].all() and not changed[reach:].any()


# ---------------------------------------------------------------------------
# A second, loop-by-loop attention
# ---------------------------------------------------------------------------

def _loop_attention(c, w, layer, x, sources_kv=None):
    """Gemma 4 attention for one layer written with explicit loops from the formulas."""
    kind = c["layer_types"][layer]
    full = kind == "full_attention"
    hd = c["global_head_dim"] if full else c["head_dim"]
    nh = c["num_attention_heads"]
    keqv = bool(c.get("attention_k_eq_v")) and full
    nkv = c["num_global_key_value_heads"] if keqv else c["num_key_value_heads"]
    eps = c["rms_norm_eps"]
    rope = c["rope_parameters"][kind]
    theta = rope["rope_theta"]
    frac = rope.get("partial_rotary_factor", 1.0) if rope["rope_type"] == "proportional" else 1.0
    turning = int(frac * hd / 2)
    p = f"layers.{layer}.self_attn."
    T = x.shape[0]

    def norm(vec, weight):
        ms = sum(float(t) ** 2 for t in vec) / len(vec)
        return [vec[j] / math.sqrt(ms + eps) * (1.0 if weight is None else weight[j])
                for j in range(len(vec))]

    def rot(vec, pos):
        out = list(vec)
        for j in range(hd // 2):
            f = theta ** (-2.0 * j / hd) if j < turning else 0.0
            cs, sn = math.cos(pos * f), math.sin(pos * f)
            a, b = vec[j], vec[j + hd // 2]
            out[j], out[j + hd // 2] = a * cs - b * sn, b * cs + a * sn
        return out

    def head_rows(mat, h, t):
        return [float(np.dot(mat[h * hd + j], x[t])) for j in range(hd)]

    Q = [[rot(norm(head_rows(w[p + "q_proj.weight"], h, t), w[p + "q_norm.weight"]), t)
          for h in range(nh)] for t in range(T)]
    K, Vv = [], []
    for t in range(T):
        kk, vv = [], []
        for g in range(nkv):
            kraw = head_rows(w[p + "k_proj.weight"], g, t)
            vraw = kraw if keqv else head_rows(w[p + "v_proj.weight"], g, t)
            kk.append(rot(norm(kraw, w[p + "k_norm.weight"]), t))
            vv.append(norm(vraw, None))
        K.append(kk)
        Vv.append(vv)
    out = np.zeros((T, nh * hd))
    for t in range(T):
        for h in range(nh):
            g = h // (nh // nkv)
            keys = [s for s in range(t + 1) if not (kind == "sliding_attention"
                                                    and t - s >= c["sliding_window"])]
            sc = [sum(Q[t][h][j] * K[s][g][j] for j in range(hd)) for s in keys]
            m = max(sc)
            e = [math.exp(v - m) for v in sc]
            z = sum(e)
            for j in range(hd):
                out[t, h * hd + j] = sum(e[n] / z * Vv[s][g][j] for n, s in enumerate(keys))
    return out @ w[p + "o_proj.weight"].T


@pytest.mark.parametrize("which,layer", [("b31", 0), ("b31", 5), ("e2b", 1), ("e2b", 4)])
def test_reference_attention_matches_a_loop_by_loop_attention(request, which, layer):
    config, tensors = request.getfixturevalue(which)
    c = g4.text_config(config)
    w = g4.strip_prefix(tensors)
    T = 12  # crosses the window of 8
    x = np.random.default_rng(layer).standard_normal((T, c["hidden_size"]))
    ref = g4.attention(c, w, layer, x, np.arange(T), {})
    np.testing.assert_allclose(ref, _loop_attention(c, w, layer, x), rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------------------
# Fixtures, configs, helpers
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["gemma-4-E2B-it", "gemma-4-E4B", "gemma-4-31B"])
def test_shrunk_checkpoint_keeps_the_structure_and_reads_back(tmp_path, name):
    config, tensors = F.write_checkpoint(tmp_path, name, "BF16")
    c = g4.text_config(config)
    real = g4.text_config(F.REAL_CONFIGS[name])
    assert set(c["layer_types"]) == {"sliding_attention", "full_attention"}
    assert c["global_head_dim"] // c["head_dim"] == real["global_head_dim"] // real["head_dim"]
    assert c["rope_parameters"] == real["rope_parameters"]
    assert bool(c["hidden_size_per_layer_input"]) == bool(real["hidden_size_per_layer_input"])
    assert c["attention_k_eq_v"] == real["attention_k_eq_v"]
    shared = [i for i, s in enumerate(g4.kv_sources(c)) if s != i]
    assert bool(shared) == bool(real["num_kv_shared_layers"])
    if shared:
        assert {c["layer_types"][i] for i in shared} == {"sliding_attention", "full_attention"}
    assert c["sliding_window"] < len(TEXT)
    cfg2, t2 = hf_fixture.load_hf_checkpoint(tmp_path)
    assert set(t2) == set(tensors)
    for n in tensors:
        np.testing.assert_array_equal(t2[n], tensors[n])
    logits = g4.forward(cfg2, t2, TEXT)
    assert logits.shape == (len(TEXT), 512) and np.isfinite(logits).all()
    assert 0 < g4.nll(logits, TEXT) < 20
    assert g4.perplexity(cfg2, t2, TEXT) == pytest.approx(math.exp(g4.nll(logits, TEXT)))


def test_text_only_and_multimodal_checkpoints_give_the_same_logits(tmp_path):
    mm = F.shrink("gemma-4-E4B")
    txt = F.shrink("gemma-4-E4B", text_only=True)
    _, a = F.write_checkpoint(tmp_path / "mm", "gemma-4-E4B", config=mm)
    _, b = F.write_checkpoint(tmp_path / "txt", "gemma-4-E4B", config=txt)
    assert all(n.startswith("model.language_model.") for n in a)
    assert all(n.startswith("model.") and "language_model" not in n for n in b)
    np.testing.assert_array_equal(g4.forward(mm, a, TEXT), g4.forward(txt, b, TEXT))


def test_greedy_extends_with_the_argmax(e2b):
    config, tensors = e2b
    out = g4.greedy(config, tensors, TEXT[:6], 3)
    assert out[0] == int(np.argmax(g4.forward(config, tensors, TEXT[:6])[-1]))
    assert out[1] == int(np.argmax(g4.forward(config, tensors, TEXT[:6] + out[:1])[-1]))


def test_mixture_of_experts_is_refused():
    t = dict(F.REAL_CONFIGS["gemma-4-31B"]["text_config"], enable_moe_block=True)
    with pytest.raises(NotImplementedError):
        g4.text_config(t)


def test_against_transformers_when_importable(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    if not hasattr(transformers, "Gemma4ForCausalLM"):
        pytest.skip("this transformers has no Gemma 4")
    config, tensors = F.write_checkpoint(tmp_path, "gemma-4-E2B-it", "F32",
                                         config=F.shrink("gemma-4-E2B-it", text_only=True))
    cfg = transformers.Gemma4TextConfig(**{k: v for k, v in config.items()
                                           if k not in ("architectures", "dtype")})
    model = transformers.Gemma4ForCausalLM(cfg).to(torch.float64).eval()
    sd = {n: torch.tensor(a) for n, a in tensors.items()}
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    model.load_state_dict(sd, strict=False)
    with torch.no_grad():
        hf = model(torch.tensor([TEXT])).logits[0].numpy()
    np.testing.assert_allclose(g4.forward(config, tensors, TEXT), hf, rtol=1e-6, atol=1e-6)
