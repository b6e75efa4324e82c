"""Independent NumPy reference of the mixture-of-experts families (issue #43):
Qwen3-MoE (`qwen3_moe`) and Mixtral (`mixtral`). Gemma 4 26B-A4B (`gemma4` with
enable_moe_block) is NOT here yet (see tests/data/moe/NOTES.md).

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

MOE_FAMILIES = ("qwen3_moe", "mixtral")
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


def n_experts(config):
    return config["num_experts"] if family(config) == "qwen3_moe" else config["num_local_experts"]


def top_k(config):
    return config["num_experts_per_tok"]


def renormalizes(config):
    """Whether the chosen weights are divided by their sum ([Q] norm_topk_prob; [X] always)."""
    if family(config) == "mixtral":
        return True
    # configuration_qwen3_moe.py default norm_topk_prob=False; Qwen3-30B-A3B sets true
    return bool(config.get("norm_topk_prob", False))


def sparse_layers(config):
    """True where layer i has the MoE block ([Q] Qwen3MoeDecoderLayer.__init__)."""
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
    family(config)
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
    w = R.strip_prefix(tensors)
    for _ in range(steps):
        toks.append(int(np.argmax(forward(config, w, toks)[-1])))
    return toks[len(prompt):]
