"""NumPy float64 reference forward pass of a Llama model with RoPE / p-RoPE.

Written from the equations only, as an independent check of the C runner.
All arrays use the Hugging Face layout: weight matrices are (out, in) and a
query/key head of size hd pairs dimension i with dimension i + hd/2
("rotate_half" layout), i = 0 being the highest frequency.

Two rotary-embedding families are supported (the `rope` dict):

  {"kind": "paper", "theta": T, "p": p, "scale": s}
      p-RoPE of Barbero et al. (ICLR 2025, "Round and Round We Go!"):
      the first floor(p*hd/2) pairs (the highest frequencies) rotate with
      timescale T**(2i/hd); the remaining pairs have infinite timescale,
      i.e. are not rotated at all.  Positions are divided by s.
      p = 1 is ordinary RoPE, p = 0 is NoPE.

  {"kind": "neox", "base": B, "factor": f}
      GPT-NeoX / HF `partial_rotary_factor`: only the first
      rotary_dim = int(hd*f) dimensions rotate, with frequencies
      B**(-2i/rotary_dim), pairing i with i + rotary_dim/2.
      Optional "omega" (rotary_dim/2 frequencies replacing B**(-2i/rotary_dim))
      and "attention_factor" (see below), for the scaling rules.

  {"kind": "freqs", "omega": w, "attention_factor": a}
      Per-pair angular frequencies w (hd/2,) in the half-split layout, as a
      RoPE scaling rule makes them (tests/scaling_reference.py); w_i = 0 marks
      an unrotated pair.  The rotated pairs' cos and sin are multiplied by a
      (default 1), as transformers multiplies its cos/sin tables by the
      attention factor, so q.k over those pairs scales by a^2; unrotated pairs
      are left untouched.
"""

import numpy as np

# ---------------------------------------------------------------------------
# Rotary embeddings
# ---------------------------------------------------------------------------


def paper_rope_angles(hd, p):
    """Number of rotated pairs: rope_angles = floor(p * hd / 2).

    Computed exactly like the paper / transformers: int(p * hd // 2), so that
    e.g. p=0.75, hd=16 gives 6.
    """
    return int(p * hd // 2)


def paper_timescales(hd, theta, p):
    """timescale_i = theta**(2i/hd) for i < rope_angles, +inf otherwise (i < hd/2)."""
    i = np.arange(hd // 2, dtype=np.float64)
    ts = theta ** (2.0 * i / hd)
    ts[paper_rope_angles(hd, p):] = np.inf
    return ts


def rope_frequencies(hd, rope):
    """Angular frequency of each pair, shape (hd/2,), in the HF pair layout.

    angle(pos, i) = pos * freq_i.  Pairs that are not rotated have freq 0.
    (For "neox" the non-rotated dimensions are not pairs of this layout;
    see `apply_rope`.)
    """
    if rope["kind"] == "paper":
        scale = rope.get("scale", 1.0)
        return 1.0 / paper_timescales(hd, rope["theta"], rope["p"]) / scale
    if rope["kind"] == "neox":
        r = neox_rotary_dim(hd, rope["factor"])
        if "omega" in rope:
            return np.asarray(rope["omega"], dtype=np.float64).reshape(r // 2)
        i = np.arange(r // 2, dtype=np.float64)
        return rope["base"] ** (-2.0 * i / r)
    if rope["kind"] == "freqs":
        return np.asarray(rope["omega"], dtype=np.float64).reshape(hd // 2)
    raise ValueError(f"unknown rope kind {rope['kind']!r}")


def neox_rotary_dim(hd, factor):
    """rotary_dim = int(hd * factor) (must be even)."""
    r = int(hd * factor)
    if r % 2 or not 0 <= r <= hd:
        raise ValueError(f"rotary_dim {r} (hd={hd}, factor={factor}) must be even and <= hd")
    return r


def rotate_half_split(x, angles):
    """Rotate pairs (x[..., i], x[..., i + n/2]) by angles[..., i].

        x1, x2 = x[..., :n/2], x[..., n/2:]
        out    = concat(x1*cos - x2*sin, x2*cos + x1*sin)
    """
    n = x.shape[-1]
    x1, x2 = x[..., : n // 2], x[..., n // 2:]
    c, s = np.cos(angles), np.sin(angles)
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def rotate_half_split_scaled(x, angles, rotated, attention_factor):
    """rotate_half_split with cos and sin of the `rotated` pairs multiplied by
    attention_factor; pairs where `rotated` is False keep cos 1, sin 0."""
    n = x.shape[-1]
    x1, x2 = x[..., : n // 2], x[..., n // 2:]
    c = np.where(rotated, np.cos(angles) * attention_factor, 1.0)
    s = np.where(rotated, np.sin(angles) * attention_factor, 0.0)
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def apply_rope(x, positions, rope):
    """Apply the rotary embedding to x of shape (..., T, hd) at `positions` (T,).

    paper: angle_i = (pos / scale) / timescale_i, with pos / inf = 0, so the
           non-rotated pairs get angle 0 (cos 1, sin 0) and no NaN appears.
    neox:  rotate the first rotary_dim dims with rotate_half, keep the rest.
    """
    pos = np.asarray(positions, dtype=np.float64)[:, None]  # (T, 1)
    hd = x.shape[-1]
    if rope["kind"] == "paper":
        ts = paper_timescales(hd, rope["theta"], rope["p"])
        angles = (pos / rope.get("scale", 1.0)) / ts  # (T, hd/2); finite / inf = 0
        return rotate_half_split(x, angles)
    if rope["kind"] == "neox":
        r = neox_rotary_dim(hd, rope["factor"])
        angles = pos * rope_frequencies(hd, rope)  # (T, r/2)
        if "omega" in rope or "attention_factor" in rope:
            rotated = rotate_half_split_scaled(x[..., :r], angles, np.ones(r // 2, dtype=bool),
                                               rope.get("attention_factor", 1.0))
        else:
            rotated = rotate_half_split(x[..., :r], angles)
        return np.concatenate([rotated, x[..., r:]], axis=-1)
    if rope["kind"] == "freqs":
        omega = rope_frequencies(hd, rope)
        return rotate_half_split_scaled(x, pos * omega, omega != 0, rope.get("attention_factor", 1.0))
    raise ValueError(f"unknown rope kind {rope['kind']!r}")


def rope_from_config(config):
    """The rope dict transformers would use for this config.json dict.

    The rotary settings are gathered the way transformers 5 does it
    (convert_rope_params_to_dict / standardize_rope_params):
        params = config["rope_scaling"] or config["rope_parameters"] or {}
        params.rope_theta            defaults to config["rope_theta"], else 10000
        params.partial_rotary_factor defaults to config["partial_rotary_factor"]
        rope_type = params["rope_type"] (or legacy "type"), default "default"
    Then:
        "default", no partial factor -> paper, p = 1
        "default", partial factor f  -> neox, factor f
        "proportional"               -> paper, p = partial_rotary_factor (1 if
                                        absent), scale = factor (1 if absent)
    Anything else (linear, dynamic, yarn, llama3, longrope, ...) raises
    ValueError.
    """
    params = config.get("rope_scaling") or config.get("rope_parameters") or {}
    params = dict(params)
    if any(isinstance(v, dict) for v in params.values()):
        raise ValueError("per-layer-type rope_parameters are not supported")
    params.setdefault("rope_theta", config.get("rope_theta", 10000.0))
    top_prf = config.get("partial_rotary_factor")
    if top_prf is not None:
        inner = params.get("partial_rotary_factor")
        if inner is not None and float(inner) != float(top_prf):
            raise ValueError("conflicting partial_rotary_factor values")
        params["partial_rotary_factor"] = top_prf
    rope_type = params.get("rope_type", params.get("type", "default"))
    theta = float(params["rope_theta"])
    prf = params.get("partial_rotary_factor")

    if rope_type == "default":
        if prf is None:
            return {"kind": "paper", "theta": theta, "p": 1.0, "scale": 1.0}
        return {"kind": "neox", "base": theta, "factor": float(prf)}
    if rope_type == "proportional":
        p = 1.0 if prf is None else float(prf)
        scale = params.get("factor")
        scale = 1.0 if scale is None else float(scale)
        return {"kind": "paper", "theta": theta, "p": p, "scale": scale}
    raise ValueError(f"unsupported rope_type {rope_type!r}")


# ---------------------------------------------------------------------------
# Model pieces
# ---------------------------------------------------------------------------


def dims(config):
    """(dim, n_layers, n_heads, n_kv_heads, hd, eps) from a config.json dict."""
    dim = config["hidden_size"]
    n_heads = config["num_attention_heads"]
    n_kv = config.get("num_key_value_heads") or n_heads
    return (dim, config["num_hidden_layers"], n_heads, n_kv, dim // n_heads,
            config.get("rms_norm_eps", 1e-6))


def rmsnorm(x, w, eps):
    """rmsnorm(x) * w = x / sqrt(mean(x^2) + eps) * w  (over the last axis)."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(x):
    """silu(x) = x * sigmoid(x) = x / (1 + exp(-x))."""
    return x / (1.0 + np.exp(-x))


def softmax(x, axis=-1):
    """exp(x - max) / sum exp(x - max); -inf entries get weight 0."""
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def split_heads(x, n, hd):
    """(T, n*hd) -> (n, T, hd)."""
    return x.reshape(x.shape[0], n, hd).transpose(1, 0, 2)


def qkv(n, W, prefix, n_heads, n_kv, hd):
    """Projections of the normed input n (T, dim) -> q (H, T, hd), k, v (KV, T, hd)."""
    q = n @ W[prefix + "self_attn.q_proj.weight"].T
    k = n @ W[prefix + "self_attn.k_proj.weight"].T
    v = n @ W[prefix + "self_attn.v_proj.weight"].T
    return split_heads(q, n_heads, hd), split_heads(k, n_kv, hd), split_heads(v, n_kv, hd)


def causal_attention(q, k, v):
    """Grouped-query causal attention.

    q: (H, T, hd); k, v: (KV, T, hd).  Query head h reads kv head
    h // (H // KV).  P[h, t, s] = softmax_s(q_t . k_s / sqrt(hd)) over s <= t.
    Returns (out (H, T, hd), P (H, T, T)).
    """
    H, T, hd = q.shape
    group = H // k.shape[0]
    kh, vh = np.repeat(k, group, axis=0), np.repeat(v, group, axis=0)
    scores = q @ kh.transpose(0, 2, 1) / np.sqrt(hd)
    future = np.triu(np.ones((T, T), dtype=bool), k=1)
    P = softmax(np.where(future, -np.inf, scores), axis=-1)
    return P @ vh, P


def _run(config, W, tokens, rope, start_pos=0, record=None):
    """Forward pass over all tokens; returns logits (T, vocab).

    x = embed[tokens]
    per layer:  n = rmsnorm(x) * w_in
                q, k, v = Wq n, Wk n, Wv n;  q, k = rope(q), rope(k)
                h = x + Wo attn(q, k, v)
                n = rmsnorm(h) * w_post
                x = h + W_down (silu(W_gate n) * W_up n)
    logits = (rmsnorm(x) * w_final) @ lm_head.T   (lm_head = embed when tied)

    If `record` is a list, per layer a dict with the pre-rotation q, k
    (heads, T, hd) and the attention weights P (H, T, T) is appended.
    """
    _, n_layers, n_heads, n_kv, hd, eps = dims(config)
    tokens = np.asarray(tokens, dtype=np.int64)
    positions = start_pos + np.arange(len(tokens))
    x = W["model.embed_tokens.weight"][tokens]
    for layer in range(n_layers):
        p = f"model.layers.{layer}."
        n = rmsnorm(x, W[p + "input_layernorm.weight"], eps)
        q, k, v = qkv(n, W, p, n_heads, n_kv, hd)
        out, P = causal_attention(apply_rope(q, positions, rope),
                                  apply_rope(k, positions, rope), v)
        if record is not None:
            record.append({"q": q, "k": k, "P": P})
        out = out.transpose(1, 0, 2).reshape(len(tokens), n_heads * hd)
        h = x + out @ W[p + "self_attn.o_proj.weight"].T
        n = rmsnorm(h, W[p + "post_attention_layernorm.weight"], eps)
        ffn = silu(n @ W[p + "mlp.gate_proj.weight"].T) * (n @ W[p + "mlp.up_proj.weight"].T)
        x = h + ffn @ W[p + "mlp.down_proj.weight"].T
    x = rmsnorm(x, W["model.norm.weight"], eps)
    return x @ lm_head(config, W).T


def lm_head(config, W):
    """The output matrix (vocab, dim): the embedding when tie_word_embeddings
    is true (LlamaConfig's default is false), else lm_head.weight."""
    if config.get("tie_word_embeddings", False):
        return W["model.embed_tokens.weight"]
    if "lm_head.weight" not in W:
        raise ValueError("untied model without lm_head.weight")
    return W["lm_head.weight"]


# ---------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------


def forward(config, tensors, tokens, rope, *, start_pos=0):
    """Logits (T, vocab) for `tokens` at positions start_pos .. start_pos+T-1.

    start_pos (default 0) exists only for the self-checks (shift invariance).
    """
    return _run(config, tensors, tokens, rope, start_pos=start_pos)


def nll(logits, tokens):
    """Mean over t = 0..T-2 of -log softmax(logits[t])[tokens[t+1]] (nats)."""
    logits = np.asarray(logits, dtype=np.float64)[:-1]
    m = logits.max(axis=-1, keepdims=True)
    logz = (m + np.log(np.sum(np.exp(logits - m), axis=-1, keepdims=True)))[:, 0]
    target = np.asarray(tokens)[1:]
    return float(np.mean(logz - logits[np.arange(len(target)), target]))


def token_nll(logits, tokens):
    """Per-token nll: -log softmax(logits[t])[tokens[t+1]] for t = 0..T-2 (nats)."""
    logits = np.asarray(logits, dtype=np.float64)[:-1]
    m = logits.max(axis=-1, keepdims=True)
    logz = (m + np.log(np.sum(np.exp(logits - m), axis=-1, keepdims=True)))[:, 0]
    target = np.asarray(tokens)[1:]
    return logz - logits[np.arange(len(target)), target]


def greedy(config, tensors, prompt_tokens, n_new, rope):
    """n_new tokens generated by argmax decoding (full recompute each step)."""
    tokens = list(prompt_tokens)
    new = []
    for _ in range(n_new):
        nxt = int(np.argmax(forward(config, tensors, tokens, rope)[-1]))
        tokens.append(nxt)
        new.append(nxt)
    return new


def inspect_stats(config, tensors, tokens, rope):
    """Per-layer, per-head statistics of queries, keys and attention.

    qnorm[l, h, i] = mean_t sqrt(q[t, i]^2 + q[t, i + hd/2]^2)   (pre-rotation;
                     rotation preserves it).  i = 0 is the highest frequency.
    knorm[l, h, i] = same for the key of kv head h // (H / KV).
    attn[l, h, :]  = mean over t = 1..T-1 of P[t, 0] (BOS), P[t, t] (current),
                     P[t, t-1] (previous).
    """
    _, n_layers, n_heads, n_kv, hd, _ = dims(config)
    record = []
    _run(config, tensors, tokens, rope, record=record)
    group = n_heads // n_kv
    T = len(tokens)
    t = np.arange(1, T)

    def pair_norm(x):  # (heads, T, hd) -> (heads, hd/2)
        return np.sqrt(x[..., : hd // 2] ** 2 + x[..., hd // 2:] ** 2).mean(axis=1)

    qnorm = np.stack([pair_norm(r["q"]) for r in record])
    knorm = np.stack([pair_norm(np.repeat(r["k"], group, axis=0)) for r in record])
    attn = np.stack([
        np.stack([r["P"][:, t, 0], r["P"][:, t, t], r["P"][:, t, t - 1]], axis=-1).mean(axis=1)
        for r in record
    ]) if T > 1 else np.full((n_layers, n_heads, 3), np.nan)
    return {"qnorm": qnorm, "knorm": knorm, "attn": attn}
