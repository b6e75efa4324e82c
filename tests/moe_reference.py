"""Independent NumPy reference of the mixture-of-experts families (issue #43):
Qwen3-MoE (`qwen3_moe`), Mixtral (`mixtral`) and Gemma 4 26B-A4B (`gemma4` / `gemma4_text`
with enable_moe_block; its section is at the end of this file, with its sources).

Written from the published modeling code (read, not copied), apart from run.c and
export.py (neither was read):
  [Q]  huggingface/transformers src/transformers/models/qwen3_moe/modeling_qwen3_moe.py
       @ 00d4b3d2142cb4ced2f51b90614b5d26bc045015 (Qwen3MoeSparseMoeBlock,
       Qwen3MoeDecoderLayer, Qwen3MoeAttention, Qwen3MoeMLP) and modular_qwen3_moe.py
       @ 00eb1166685205e8b2c75ab33eee83dc77b18fca (the newer layout: Qwen3MoeTopKRouter =
       Qwen2MoeTopKRouter, Qwen3MoeExperts = Qwen2MoeExperts, fused 3D expert weights in
       memory; the checkpoint names are unchanged per expert, see moe_fixtures.py)
  [X]  transformers src/transformers/models/mixtral/modeling_mixtral.py (MixtralTopKRouter,
       MixtralExperts), read through the search index's copies (ids 66072208371 and others)

The attention, norms, RoPE and embedding are the dense families' and come from
tests/family_reference.py: Qwen3-MoE's attention is Qwen3's (q_norm / k_norm per head,
head_dim explicit), Mixtral's is Mistral's (one sliding window on every layer when
`sliding_window` is set; null in Mixtral-8x7B). The only new piece is the feed-forward
step of a sparse layer:

  router logits  z = W_gate x                      (E,), W_gate (E, hidden), no bias
  probabilities  p = softmax(z) over ALL E experts (torch: in float32; here float64)
  choice         the k largest p (k = num_experts_per_tok); ties: lowest index first
  weights        g = p[chosen]; g /= sum(g)  when the rule renormalizes:
                   Qwen3-MoE: only when norm_topk_prob ([Q]: "only diff with mixtral");
                   Mixtral: always ([X]: router_top_value /= sum) - equal to a softmax over
                   the k chosen logits, which is how the issue text puts it.
  output         sum_j g_j * down_j(silu(gate_j x) * up_j x)

Which layers are sparse ([Q] Qwen3MoeDecoderLayer.__init__): layer i is sparse when
i not in mlp_only_layers and num_experts > 0 and (i + 1) % decoder_sparse_step == 0;
else it has a dense MLP of width intermediate_size (mlp.gate_proj / up_proj / down_proj).
Mixtral: every layer sparse.

Ties: torch.topk on CPU (torch 1.13, Debian's python3-torch) does NOT return the lowest
index first for equal values: topk([.5,.5,.5,.5,.1,.5], 3) -> indices [3, 5, 0];
topk(zeros(128), 8) -> [84, 87, 86, 85, 82, 81, 88, 83]. transformers therefore has no
defined tie order; this reference takes the rule the issue sets for run.c, lowest index
first (a stable sort on -p). Exact ties do not occur with random float weights.

Arithmetic: float64 on the stored values (a bf16 file's values widened), as
family_reference.py; `dtype=np.float32` gives a float32 pass of the MoE step.

Tensor names (Hugging Face, as the published checkpoints store them):
  qwen3_moe  model.layers.N.mlp.gate.weight (E, hidden)
             model.layers.N.mlp.experts.E.{gate_proj,up_proj,down_proj}.weight
  mixtral    model.layers.N.block_sparse_moe.gate.weight (E, hidden)
             model.layers.N.block_sparse_moe.experts.E.{w1 (gate), w3 (up), w2 (down)}.weight
"""

import numpy as np

import family_reference as R

MOE_FAMILIES = ("qwen3_moe", "mixtral", "gemma4", "gemma4_text")
DENSE_FAMILY = {"qwen3_moe": "qwen3", "mixtral": "mistral"}


def family(config):
    f = config.get("model_type")
    if f not in MOE_FAMILIES:
        raise ValueError(f"moe_reference: unsupported model_type {f!r}")
    return f


def dense_config(config):
    """The config as the dense family's reference reads it (attention, norms, RoPE)."""
    c = dict(config)
    c["model_type"] = DENSE_FAMILY[family(config)]
    if c["model_type"] == "qwen3":
        # [Q] Qwen3MoeAttention passes sliding_window to the attention only as a kwarg
        # honoured by flash/sdpa paths; the published configs have use_sliding_window false
        # and sliding_window null: full causal attention (family_reference's qwen3 rule).
        pass
    return c


def _g4(config):
    return config.get("text_config", config)


def n_experts(config):
    f = family(config)
    if f in ("gemma4", "gemma4_text"):
        return int(_g4(config)["num_experts"])
    return config["num_experts"] if f == "qwen3_moe" else config["num_local_experts"]


def top_k(config):
    if family(config) in ("gemma4", "gemma4_text"):
        return int(_g4(config)["top_k_experts"])
    return config["num_experts_per_tok"]


def renormalizes(config):
    """Whether the chosen weights are divided by their sum ([Q] norm_topk_prob; [X] always)."""
    if family(config) in ("mixtral", "gemma4", "gemma4_text"):
        return True  # Gemma 4: [G] Gemma4TextRouter divides by the sum, then per_expert_scale
    # configuration_qwen3_moe.py default norm_topk_prob=False; Qwen3-30B-A3B sets true
    return bool(config.get("norm_topk_prob", False))


def sparse_layers(config):
    """True where layer i has the MoE block ([Q] Qwen3MoeDecoderLayer.__init__)."""
    if family(config) in ("gemma4", "gemma4_text"):  # every layer: dense MLP and experts
        c = _g4(config)
        return [bool(c.get("enable_moe_block"))] * c["num_hidden_layers"]
    n = config["num_hidden_layers"]
    if family(config) == "mixtral":
        return [True] * n
    only = set(config.get("mlp_only_layers") or [])
    step = config.get("decoder_sparse_step", 1)
    E = config.get("num_experts", 0)
    return [i not in only and E > 0 and (i + 1) % step == 0 for i in range(n)]


def softmax(z):
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def topk_lowest_index(p, k):
    """Indices (T, k) of the k largest values of each row, larger first, equal values in
    increasing index order (a stable sort of -p)."""
    return np.argsort(-p, axis=-1, kind="stable")[..., :k]


def route(router_logits, k, renormalize):
    """(indices (T, k), weights (T, k), probs (T, E)) for router logits (T, E):
    softmax over all experts, top-k, divided by their sum when `renormalize`."""
    p = softmax(np.asarray(router_logits))
    idx = topk_lowest_index(p, k)
    g = np.take_along_axis(p, idx, axis=-1)
    if renormalize:
        g = g / g.sum(axis=-1, keepdims=True)
    return idx, g, p


def expert_names(config, layer, e):
    """(router, gate, up, down) tensor names of expert e of a layer."""
    p = f"model.layers.{layer}."
    if family(config) == "mixtral":
        b = p + f"block_sparse_moe.experts.{e}."
        return (p + "block_sparse_moe.gate.weight", b + "w1.weight", b + "w3.weight", b + "w2.weight")
    b = p + f"mlp.experts.{e}."
    return (p + "mlp.gate.weight", b + "gate_proj.weight", b + "up_proj.weight", b + "down_proj.weight")


def silu(x):
    return x / (1.0 + np.exp(-x))


def expert(w, names, x):
    _, g, u, d = names
    return (silu(x @ w[g].T) * (x @ w[u].T)) @ w[d].T


def moe_block(config, w, layer, x, trace=None, dtype=np.float64):
    """The sparse feed-forward of `layer` on x (T, hidden) (already normed)."""
    x = np.asarray(x, dtype=dtype)
    E, k = n_experts(config), top_k(config)
    router = np.asarray(w[expert_names(config, layer, 0)[0]], dtype=dtype)
    if router.shape[0] != E:
        raise ValueError(f"moe_reference: layer {layer} router has {router.shape[0]} rows for {E} experts")
    z = x @ router.T
    idx, g, p = route(z, k, renormalizes(config))
    out = np.zeros_like(x)
    for e in range(E):
        rows, slot = np.nonzero(idx == e)
        if len(rows) == 0:
            continue
        names = expert_names(config, layer, e)
        we = {n: np.asarray(w[n], dtype=dtype) for n in names[1:]}
        y = expert(we, names, x[rows])
        out[rows] += g[rows, slot][:, None] * y
    if trace is not None:
        trace.append({"layer": layer, "logits": z, "probs": p, "experts": idx, "weights": g})
    return out


def forward(config, tensors, tokens, trace=None, return_hidden=False):
    """Logits (T, vocab) for tokens at positions 0..T-1. trace: a list that receives, per
    sparse layer, {"layer", "logits", "probs", "experts" (T, k), "weights" (T, k)}."""
    if family(config) in ("gemma4", "gemma4_text"):
        return gemma4_forward(config, tensors, tokens, trace)
    dc = dense_config(config)
    w = R.strip_prefix(tensors)
    tokens = np.asarray(tokens)
    T = len(tokens)
    plan = R.Plan(dc, T)
    positions = np.arange(T)
    sparse = sparse_layers(config)
    x = w["model.embed_tokens.weight"][tokens]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = R.attention(plan, w, p, R.rms_norm(x, w[p + "input_layernorm.weight"], plan.eps), i, positions)
        x = x + h
        y = R.rms_norm(x, w[p + "post_attention_layernorm.weight"], plan.eps)
        x = x + (moe_block(config, w, i, y, trace) if sparse[i] else R.mlp(plan, w, p, y))
    x = R.rms_norm(x, w["model.norm.weight"], plan.eps)
    if return_hidden:
        return x
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return x @ head.T


def nll(logits, tokens):
    return R.nll(logits, tokens)


def greedy(config, tensors, prompt, steps):
    """The `steps` argmax tokens that follow prompt (a full forward pass per step)."""
    toks = list(prompt)
    w = tensors
    for _ in range(steps):
        toks.append(int(np.argmax(forward(config, w, toks)[-1])))
    return toks[len(prompt):]


# ---------------------------------------------------------------------------
# Gemma 4 26B-A4B (gemma4 with enable_moe_block)
# ---------------------------------------------------------------------------
#
# [G] huggingface/transformers src/transformers/models/gemma4/modular_gemma4.py (search index
#     id 51764282975: Gemma4TextRouter, Gemma4TextExperts(MixtralExperts),
#     Gemma4TextDecoderLayer.__init__/forward with enable_moe_block; read, not copied).
# Everything but the feed-forward step is tests/gemma4_reference.py's (attention with k = v on
# full layers, norms, RoPE, soft-cap, layer_scalar). The feed-forward step of a layer, with
# r the residual after attention (all norms Gemma4RMSNorm: x * rsqrt(mean x^2 + eps) * w):
#
#   h1 = post_feedforward_layernorm_1(mlp(pre_feedforward_layernorm(r)))   dense, width intermediate_size
#   router (on r itself, NOT a normed input):
#        u = rmsnorm_noweight(r) * router.scale * hidden^-0.5 ;  z = router.proj u   (E,)
#        p = softmax(z) over all E ; top_k_experts largest ; g = p[chosen] / sum(p[chosen])
#        g_j *= router.per_expert_scale[chosen_j]       (after the renormalization: the
#        weights then need not sum to 1)
#   h2 = post_feedforward_layernorm_2( sum_j g_j expert_j(pre_feedforward_layernorm_2(r)) )
#        expert_e(y) = down_proj[e] (act(gate) * up),  [gate | up] = gate_up_proj[e] y,
#        gate_up_proj (E, 2 I, hidden), gate rows first (MixtralExperts chunk(2)); down_proj
#        (E, hidden, I); act = hidden_activation (gelu tanh)
#   x = r + post_feedforward_layernorm(h1 + h2)
#
# The issue text says "extra norms around both branches": the code has post_1 on the dense
# branch, pre_2 and post_2 on the expert branch, then the usual post_feedforward_layernorm on
# their sum. The router's input is the un-normed residual, as the issue says.

import math  # noqa: E402

import gemma4_reference as G  # noqa: E402


def gemma4_text(config):
    """(resolved text config, with enable_moe_block kept) for gemma4_reference's helpers."""
    inner = dict(config["text_config"]) if "text_config" in config else dict(config)
    moe = bool(inner.get("enable_moe_block"))
    outer = dict(config)
    if "text_config" in config:
        outer["text_config"] = dict(inner, enable_moe_block=False)
    else:
        outer = dict(inner, enable_moe_block=False)
    c = G.text_config(outer)  # gemma4_reference refuses enable_moe_block; the MoE step is ours
    c["enable_moe_block"] = moe
    return c


def gemma4_route(c, w, layer, r):
    """(indices (T, k), weights (T, k) after per_expert_scale, probs (T, E), logits) of the
    Gemma 4 router on the residual r (T, hidden)."""
    p = f"layers.{layer}.router."
    H = c["hidden_size"]
    u = G.rms_norm(r, None, c["rms_norm_eps"]) * w[p + "scale"] * H ** -0.5
    z = u @ w[p + "proj.weight"].T
    idx, g, probs = route(z, int(c["top_k_experts"]), renormalize=True)
    g = g * w[p + "per_expert_scale"][idx]
    return idx, g, probs, z


def gemma4_experts(c, w, layer, y, idx, g):
    """sum over each token's chosen experts of g * expert_e(y), fused gate_up_proj."""
    act = G.ACTIVATIONS[c.get("hidden_activation") or "gelu_pytorch_tanh"]
    gu = w[f"layers.{layer}.experts.gate_up_proj"]
    dn = w[f"layers.{layer}.experts.down_proj"]
    I = int(c["moe_intermediate_size"])
    if gu.shape != (int(c["num_experts"]), 2 * I, c["hidden_size"]):
        raise ValueError(f"gate_up_proj shape {gu.shape}")
    out = np.zeros_like(y)
    for e in range(gu.shape[0]):
        rows, slot = np.nonzero(idx == e)
        if len(rows) == 0:
            continue
        h = y[rows] @ gu[e].T
        out[rows] += g[rows, slot][:, None] * ((act(h[:, :I]) * h[:, I:]) @ dn[e].T)
    return out


def gemma4_decoder_layer(c, w, layer, x, positions, shared_kv, pl, trace):
    eps = c["rms_norm_eps"]
    p = f"layers.{layer}."
    nw = lambda name: w[p + name + ".weight"]  # noqa: E731
    h = G.attention(c, w, layer, G.rms_norm(x, nw("input_layernorm"), eps), positions, shared_kv)
    x = x + G.rms_norm(h, nw("post_attention_layernorm"), eps)
    r = x
    h = G.mlp(c, w, layer, G.rms_norm(r, nw("pre_feedforward_layernorm"), eps))
    if c.get("enable_moe_block"):
        h1 = G.rms_norm(h, nw("post_feedforward_layernorm_1"), eps)
        idx, g, probs, z = gemma4_route(c, w, layer, r)
        y = gemma4_experts(c, w, layer, G.rms_norm(r, nw("pre_feedforward_layernorm_2"), eps), idx, g)
        h = h1 + G.rms_norm(y, nw("post_feedforward_layernorm_2"), eps)
        if trace is not None:
            trace.append({"layer": layer, "logits": z, "probs": probs, "experts": idx, "weights": g})
    x = r + G.rms_norm(h, nw("post_feedforward_layernorm"), eps)
    if pl is not None:
        act = G.ACTIVATIONS[c.get("hidden_activation") or "gelu_pytorch_tanh"]
        gg = act(G._linear(w, p + "per_layer_input_gate", x)) * pl[:, layer, :]
        x = x + G.rms_norm(G._linear(w, p + "per_layer_projection", gg), nw("post_per_layer_input_norm"), eps)
    scalar = w.get(p + "layer_scalar")
    return x * (1.0 if scalar is None else float(np.asarray(scalar).reshape(-1)[0]))


def gemma4_forward(config, tensors, tokens, trace=None):
    """Logits (T, vocab) of Gemma 4 with or without enable_moe_block; trace as forward()."""
    c = gemma4_text(config)
    w = G.strip_prefix(tensors)
    tokens = np.asarray(tokens)
    e = w["embed_tokens.weight"][tokens] * G.round_to(math.sqrt(c["hidden_size"]), G.model_dtype(c))
    pl = G.per_layer_inputs(c, w, tokens, e)
    positions = np.arange(len(tokens))
    shared_kv = {}
    x = e
    for i in range(c["num_hidden_layers"]):
        x = gemma4_decoder_layer(c, w, i, x, positions, shared_kv, pl, trace)
    x = G.rms_norm(x, w["norm.weight"], c["rms_norm_eps"])
    head = w["embed_tokens.weight"] if c.get("tie_word_embeddings", True) or "lm_head.weight" not in w \
        else w["lm_head.weight"]
    return G.softcap(x @ head.T, c.get("final_logit_softcapping"))


def routing_margin(trace):
    """The smallest gap, over the traced layers and tokens, between the k-th and (k+1)-th
    router logit (the choice is made on the logits: softmax is monotone): how far the choice
    is from a tie. A float32 runner, whose logits differ from this float64 reference by
    ~1e-6 of their size, can choose differently only when the gap is about that small."""
    gaps = []
    for d in trace:
        k = d["experts"].shape[1]
        zs = np.sort(d["logits"], axis=-1)[:, ::-1]
        gaps.append(float((zs[:, k - 1] - zs[:, k]).min()))
    return min(gaps)
