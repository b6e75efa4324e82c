"""Independent float64 NumPy reference of the Gemma 4 text decoder.

What it computes: the logits of Hugging Face transformers' `Gemma4ForCausalLM` (and of the
language model + lm_head of `Gemma4ForConditionalGeneration`) for one token sequence, a full
causal pass with sliding windows, on exactly the values a checkpoint stores (a bf16 file's
values widened). Standard library and NumPy only. Written apart from run.c and export.py
(neither was read) so that it can judge both.

Sources read (through the stored copies the search tool returns; never fetched live):
  [M] huggingface/transformers src/transformers/models/gemma4/modeling_gemma4.py
      @ 0246b4f3335464614ef1de66531f9131a44ec801 (Gemma4RMSNorm, rotate_half,
      apply_rotary_pos_emb, repeat_kv, eager_attention_forward, Gemma4TextMLP,
      Gemma4TextRotaryEmbedding, Gemma4TextAttention, Gemma4TextDecoderLayer,
      Gemma4TextScaledWordEmbedding, Gemma4TextModel (get_per_layer_inputs,
      project_per_layer_inputs), Gemma4ForCausalLM, Gemma4Model, Gemma4ForConditionalGeneration)
  [C] huggingface/transformers src/transformers/models/gemma4/configuration_gemma4.py
      @ 008e574391258935f3ecc3035c882e73bbcac419 (Gemma4TextConfig defaults, __post_init__)
  [W] huggingface/transformers src/transformers/models/gemma4/convert_gemma4_weights.py
      @ 0f3f0632a38798af2adf264adc752130ecc5fa66 (tensor names, the variants' configs,
      norms stored as trained - no +1 - and `skip_scale` -> layers.N.layer_scalar)
  [R] transformers src/transformers/modeling_rope_utils.py, `_compute_proportional_rope_parameters`
      (the index's copy of huggingface/transformers at ef464064 predates Gemma 4; the function
      was read from two copies of the newer file found by exact-string search, ids
      64056737866 and 70489197740 of the search index, both with the
      "per_layer_config ... gemma4" workaround; their body agrees line for line)
  [J] google-deepmind/gemma gemma/gm/nn/gemma4/_modules.py
      @ 0360c6629acf31361ab68924d5ed4a15c6097dc0 (Embedder.encode_per_layer_input,
      Attention with k_eq_v and kv_shared_cache, _create_sliding_mask): the original JAX
      model, used to cross-check [M].

The model ([M] unless said otherwise; x is (T, hidden), matrices are (out, in)):

  embed      e = embed_tokens[tok] * round_dtype(sqrt(hidden))          (ScaledWordEmbedding:
             the scale is cast to the weights' dtype first: bf16 sqrt(1536) = 39.25)
  per-layer  (only if hidden_size_per_layer_input P > 0; L layers)
             a = embed_tokens_per_layer[tok] * round_dtype(sqrt(P))  -> (T, L, P)
             b = RMSNorm_P(per_layer_model_projection(e) * hidden^-0.5 -> (T, L, P),
                           per_layer_projection_norm)
             pl = (b + a) * 2^-0.5                                       (project_per_layer_inputs)
  layer i    r = x;  x = r + post_attention_layernorm(attn_i(input_layernorm(x)))
             r = x;  x = r + post_feedforward_layernorm(mlp_i(pre_feedforward_layernorm(x)))
             if P:   r = x;  g = gelu_tanh(per_layer_input_gate(x)) * pl[:, i]     (T, P)
                     x = r + post_per_layer_input_norm(per_layer_projection(g))
             x = x * layer_scalar_i                          (a [1] buffer, stored in the file)
  final      logits = softcap30(norm(x) @ embed_tokens^T)   (tied: lm_head = embed_tokens)

  RMSNorm(x, w) = x * (mean(x^2) + eps)^-0.5 * w  - the weight as stored (no Gemma 3 "1 + w";
             [W] copies the trained scales unchanged); eps = rms_norm_eps (1e-6).
  mlp        down(gelu_tanh(gate x) * up x); intermediate_size, doubled on KV-shared layers
             when use_double_wide_mlp (E2B).
  attn_i     kind = layer_types[i]; hd = global_head_dim on full layers (if set), else head_dim.
             kv heads = num_global_key_value_heads on full layers when attention_k_eq_v,
             else num_key_value_heads.
             q = RoPE(RMSNorm_hd(q_proj x per head, q_norm))
             unshared layer: kr = k_proj x; vr = v_proj x, or kr itself when the layer has no
                  v_proj (attention_k_eq_v and full); k = RoPE(RMSNorm_hd(kr, k_norm));
                  v = RMSNorm_hd(vr) with no weight (v_norm).
             shared layer (i >= L - num_kv_shared_layers): no k/v of its own; it uses the k, v
                  (after norms and RoPE) of the last unshared layer of the same kind
                  (`store_full_length_kv`, `shared_kv_states[layer_type]`).
             scores = q.k * 1.0 (scaling 1.0, no attention soft-cap), causal mask, and on
             sliding layers key s visible from query t only if t - s < sliding_window;
             softmax; GQA: query head h reads kv head h // (heads / kv heads) (repeat_kv);
             o_proj.
  RoPE       rotate_half layout over the whole head: pair (j, j + hd/2) turns by
             pos * inv_freq[j] (emb = cat(freqs, freqs); x*cos + rotate_half(x)*sin).
             sliding ("default"): inv_freq[j] = theta^(-2j/head_dim), theta 1e4, all j < hd/2.
             full ("proportional", [R]): with n = int(partial_rotary_factor * hd // 2),
             inv_freq[j] = theta^(-2j/hd) for j < n and 0 for the other hd/2 - n, then / factor
             (factor default 1). E2B/E4B/31B: hd 512, factor 0.25, theta 1e6 -> n = 64 turning
             pairs (dims 0-63 with 256-319) and 192 still ones (dims 64-255 with 320-511).

Where the issue's summary was wrong or incomplete (the code wins):
  1. KV sharing: confirmed as "the last earlier unshared layer of its own kind"; precisely the
     last layer of that kind in layer_types[:L - num_kv_shared_layers] (a shared layer never
     reads another shared layer, and its mask is its own kind's). E2B: sliding 15-34 read 13,
     full read 14; E4B: 24-41 read 22 (sliding) / 23 (full). The shared keys/values are
     stored after k_norm, RoPE and the v norm, so the shared layer applies neither again.
  2. Proportional RoPE's unrotated pairs are not a tail of the head: in the rotate_half layout
     the 64 turning pairs are dims 0-63 paired with 256-319; dims 64-255 and 320-511 stay.
     Exporters that treat partial_rotary_factor 0.25 the Phi-3 way (rotate the first 128
     dims as their own rotate_half block) get a different model.
  3. The value norm has no weight AND the key/value of k = v layers both come from the single
     k_proj output before k_norm; the v norm is applied to that raw output; k_norm + RoPE only
     to the key. The full-attention layers of a k = v model store no v_proj tensor at all.
  4. The per-layer input's projection is scaled by hidden^-0.5 before its RMSNorm (not after),
     the per-layer token table is itself scaled by sqrt(P) (rounded to the dtype), and the
     sum is times 2^-0.5. The per-layer residual is added before the layer scalar multiplies
     the whole residual stream (the scalar multiplies x, not only the layer's increment).
  5. The double-wide MLP applies to shared layers only when use_double_wide_mlp and
     num_kv_shared_layers > 0 ([M] `layer_idx >= first_kv_shared_layer_idx > 0`).
  6. Config: a last layer that is not "full_attention" is forced to full ([C]); an absent
     layer_types is the 5:1 pattern (sliding unless (i+1) % 6 == 0). E2B's real pattern is
     4:1 (sliding x4, full), E4B and 31B 5:1. hidden_size_per_layer_input defaults to 256,
     so a config that omits it (instead of 0) has per-layer inputs.
  7. Published checkpoints still carry k_proj / v_proj / k_norm for the shared layers (an
     mlx report quoted by the search index; the JAX model computes and discards them);
     transformers drops them on load (`_keys_to_ignore_on_load_unexpected`). They must be
     ignored.
  8. Attention mask with use_bidirectional_attention "vision" (31B) is causal for text-only
     input; "all" (not in any released model) is not supported here.
  9. Not modelled: mixture-of-experts (enable_moe_block, 26B-A4B) -> NotImplementedError;
     multimodal soft tokens; attention_bias (supported: .bias tensors are added if present).

Config keys read (text_config of a "gemma4" config, or a bare "gemma4_text" config; defaults
of [C] where absent): hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
num_key_value_heads, head_dim, global_head_dim, num_global_key_value_heads,
attention_k_eq_v, layer_types, sliding_window, rope_parameters.{sliding_attention,
full_attention}.{rope_type, rope_theta, partial_rotary_factor, factor}, rms_norm_eps,
hidden_activation, final_logit_softcapping, tie_word_embeddings, vocab_size,
hidden_size_per_layer_input, vocab_size_per_layer_input, num_kv_shared_layers,
use_double_wide_mlp, attention_bias, enable_moe_block (refused), use_bidirectional_attention
("all" refused), dtype / torch_dtype (for the rounded embedding scales; the top-level one
when text_config has none).

Tensor names (after stripping "model.language_model." (Gemma4ForConditionalGeneration) or
"model." (Gemma4ForCausalLM)):
  embed_tokens.weight (V, H); norm.weight (H); lm_head.weight (V, H) only if untied;
  embed_tokens_per_layer.weight (Vp, L*P); per_layer_model_projection.weight (L*P, H);
  per_layer_projection_norm.weight (P);
  layers.N.{input_layernorm, post_attention_layernorm, pre_feedforward_layernorm,
            post_feedforward_layernorm}.weight (H); layers.N.layer_scalar (1,)
  layers.N.self_attn.q_proj.weight (heads*hd, H); .k_proj.weight (kvh*hd, H);
            .v_proj.weight (kvh*hd, H) [absent on k = v full layers]; .o_proj.weight (H, heads*hd);
            .q_norm.weight (hd); .k_norm.weight (hd)   [k/v/k_norm ignored on shared layers]
  layers.N.mlp.{gate_proj, up_proj}.weight (I, H), .down_proj.weight (H, I)
  layers.N.per_layer_input_gate.weight (P, H); .per_layer_projection.weight (H, P);
            .post_per_layer_input_norm.weight (H)
"""

import math

import numpy as np

import hf_fixture

# config.json dtype names ("torch_dtype" in transformers 4, "dtype" in 5)
DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}

SLIDING, FULL = "sliding_attention", "full_attention"

# Gemma4TextConfig's defaults ([C]) for the keys this reference reads.
TEXT_DEFAULTS = {
    "vocab_size": 262144,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 30,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "global_head_dim": 512,  # popped from kwargs with default 512 in __post_init__
    "num_global_key_value_heads": None,
    "hidden_activation": "gelu_pytorch_tanh",
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "sliding_window": 512,
    "layer_types": None,
    "final_logit_softcapping": None,
    "use_bidirectional_attention": None,
    "vocab_size_per_layer_input": 262144,
    "hidden_size_per_layer_input": 256,
    "attention_k_eq_v": False,
    "num_kv_shared_layers": 0,
    "enable_moe_block": False,
    "use_double_wide_mlp": False,
    "rope_parameters": None,
}
DEFAULT_ROPE = {
    SLIDING: {"rope_type": "default", "rope_theta": 10000.0},
    FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
}


# ---------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------

def text_config(config):
    """The text decoder's config with Gemma4TextConfig's defaults filled in. Accepts the
    multimodal `gemma4` config (its `text_config`) and a bare `gemma4_text` config."""
    if config.get("_gemma4_resolved"):
        return config
    if "text_config" in config and (config.get("model_type") in (None, "gemma4")):
        inner = dict(config["text_config"])
        for key in ("dtype", "torch_dtype", "tie_word_embeddings"):
            if key in config and key not in inner:
                inner[key] = config[key]
    elif config.get("model_type") in (None, "gemma4_text"):
        inner = dict(config)
    else:
        raise ValueError(f"gemma4_reference: not a Gemma 4 config: {config.get('model_type')!r}")
    out = dict(TEXT_DEFAULTS)
    out.update({k: v for k, v in inner.items()})
    if out.get("enable_moe_block"):
        raise NotImplementedError("gemma4_reference: mixture-of-experts (enable_moe_block) "
                                  "is not implemented")
    if out.get("use_bidirectional_attention") == "all":
        raise NotImplementedError("gemma4_reference: use_bidirectional_attention 'all'")
    if out.get("rope_parameters") is None:
        out["rope_parameters"] = DEFAULT_ROPE
    out["layer_types"] = _layer_types(out)
    out["_gemma4_resolved"] = True
    return out


def _layer_types(c):
    n = c["num_hidden_layers"]
    lt = c.get("layer_types")
    if lt is None:  # [C]: 5:1, sliding unless (i + 1) % 6 == 0
        lt = [SLIDING if (i + 1) % 6 else FULL for i in range(n)]
    lt = list(lt)
    if len(lt) != n:
        raise ValueError(f"layer_types has {len(lt)} entries for {n} layers")
    if lt and lt[-1] != FULL:  # [C] forces the last layer to full attention
        lt[-1] = FULL
    return lt


def model_dtype(config):
    c = config if config.get("_gemma4_resolved") else text_config(config)
    return DTYPES.get(c.get("dtype") or c.get("torch_dtype") or "float32", "F32")


def round_to(x, dtype):
    """x rounded to float32 / bfloat16 (nearest even) / float16, as a Python float (the test
    fixtures' rounding: tests/hf_fixture.py)."""
    return float(hf_fixture.round_to_dtype(np.array([x]), dtype)[0])


def layer_kinds(config):
    """'sliding_attention' / 'full_attention' per layer (after [C]'s fix-ups)."""
    return list(text_config(config)["layer_types"])


def first_shared_layer(config):
    c = text_config(config)
    return c["num_hidden_layers"] - (c.get("num_kv_shared_layers") or 0)


def kv_sources(config):
    """For each layer, the layer whose keys and values it attends over: itself when it
    computes its own, else (KV-shared layer) the last layer of its kind before the first
    shared layer ([M] Gemma4TextAttention.store_full_length_kv / is_kv_shared_layer)."""
    kinds = layer_kinds(config)
    first = first_shared_layer(config)
    out = []
    for i, kind in enumerate(kinds):
        if i >= first >= 0 and first < len(kinds):
            src = [j for j in range(first) if kinds[j] == kind]
            if not src:
                raise ValueError(f"shared layer {i} ({kind}) has no unshared {kind} layer")
            out.append(src[-1])
        else:
            out.append(i)
    return out


def is_shared(config, layer):
    return kv_sources(config)[layer] != layer


def head_dim(config, layer):
    c = text_config(config)
    if c["layer_types"][layer] == FULL and c.get("global_head_dim"):
        return int(c["global_head_dim"])
    return int(c["head_dim"])


def kv_heads(config, layer):
    c = text_config(config)
    if c.get("attention_k_eq_v") and c["layer_types"][layer] == FULL:
        if not c.get("num_global_key_value_heads"):
            raise ValueError("attention_k_eq_v needs num_global_key_value_heads")
        return int(c["num_global_key_value_heads"])
    return int(c["num_key_value_heads"])


def k_eq_v(config, layer):
    """True where values are the raw key projection (no v_proj): full layers of k = v models."""
    c = text_config(config)
    return bool(c.get("attention_k_eq_v")) and c["layer_types"][layer] == FULL


def intermediate_size(config, layer):
    c = text_config(config)
    first = first_shared_layer(c)
    wide = c.get("use_double_wide_mlp") and layer >= first > 0
    return int(c["intermediate_size"]) * (2 if wide else 1)


def inverse_frequencies(config, layer):
    """inv_freq (hd/2,) of the layer's RoPE; pair (j, j + hd/2) turns by pos * inv_freq[j]."""
    c = text_config(config)
    kind = c["layer_types"][layer]
    params = c["rope_parameters"].get(kind) if kind in c["rope_parameters"] else c["rope_parameters"]
    rope_type = params.get("rope_type", "default")
    theta = float(params["rope_theta"])
    hd = head_dim(c, layer)
    if rope_type == "default":
        dim = int(c["head_dim"])  # compute_default_rope_parameters reads config.head_dim
        if dim != hd:
            raise NotImplementedError("default RoPE on a layer whose head size is not head_dim")
        return 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    if rope_type == "proportional":
        # [R]: head_dim_key "global_head_dim" on full layers (Gemma4TextRotaryEmbedding)
        n = int(float(params.get("partial_rotary_factor", 1.0)) * hd // 2)
        rot = 1.0 / theta ** (np.arange(0, 2 * n, 2, dtype=np.float64) / hd)
        inv = np.concatenate([rot, np.zeros(hd // 2 - n)])
        return inv / float(params.get("factor", 1.0))
    raise NotImplementedError(f"rope_type {rope_type!r}")


# ---------------------------------------------------------------------------
# Pieces
# ---------------------------------------------------------------------------

def rms_norm(x, w, eps):
    """Gemma4RMSNorm: x * (mean(x^2) + eps)^-0.5 * w (w None: no weight, the v norm)."""
    y = x * (np.mean(x * x, axis=-1, keepdims=True) + eps) ** -0.5
    return y if w is None else y * w


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def gelu_erf(x):
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


ACTIVATIONS = {"gelu_pytorch_tanh": gelu_tanh, "gelu_new": gelu_tanh, "gelu": gelu_erf}


def softcap(x, cap):
    return x if not cap else cap * np.tanh(x / cap)


def apply_rope(x, positions, inv_freq):
    """x (T, heads, hd) rotated: x*cos + rotate_half(x)*sin, cos/sin of cat(f, f), f = pos*inv."""
    half = x.shape[-1] // 2
    assert len(inv_freq) == half
    ang = np.asarray(positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def attention_mask(T, window=None):
    """allowed[t, s]: s <= t, and t - s < window when window (masking_utils' sliding overlay,
    [J] _create_sliding_mask: cache_pos > pos - window)."""
    t = np.arange(T)[:, None]
    s = np.arange(T)[None, :]
    ok = s <= t
    if window:
        ok &= (t - s) < window
    return ok


def strip_prefix(tensors):
    """{name: float64} with "model.language_model." / "model." stripped (lm_head kept)."""
    out = {}
    for name, a in tensors.items():
        for p in ("model.language_model.", "language_model.model.", "model."):
            if name.startswith(p):
                name = name[len(p):]
                break
        out[name] = np.asarray(a, dtype=np.float64)
    return out


def _linear(w, name, x):
    y = x @ w[name + ".weight"].T
    b = w.get(name + ".bias")
    return y if b is None else y + b


def _norm_weight(w, name):
    return w[name + ".weight"]


# ---------------------------------------------------------------------------
# Forward pass
# ---------------------------------------------------------------------------

def per_layer_inputs(config, w, tokens, e):
    """(T, L, P) per-layer inputs, or None without them ([M] get_per_layer_inputs +
    project_per_layer_inputs; [J] encode_per_layer_input)."""
    c = text_config(config)
    P = int(c.get("hidden_size_per_layer_input") or 0)
    if not P:
        return None
    L, H, T = c["num_hidden_layers"], c["hidden_size"], len(tokens)
    dt = model_dtype(c)
    a = w["embed_tokens_per_layer.weight"][np.asarray(tokens)] * round_to(math.sqrt(P), dt)
    a = a.reshape(T, L, P)
    b = (e @ w["per_layer_model_projection.weight"].T) * H ** -0.5
    b = rms_norm(b.reshape(T, L, P), w["per_layer_projection_norm.weight"], c["rms_norm_eps"])
    return (b + a) * 2.0 ** -0.5


def attention(config, w, layer, x, positions, shared_kv, trace=None):
    """One attention block on x = input_layernorm output (T, H). shared_kv: {kind: (k, v)},
    read by shared layers and written by each kind's last unshared layer."""
    c = text_config(config)
    eps = c["rms_norm_eps"]
    kind = c["layer_types"][layer]
    p = f"layers.{layer}.self_attn."
    T = x.shape[0]
    hd, nh, nkv = head_dim(c, layer), int(c["num_attention_heads"]), kv_heads(c, layer)
    inv = inverse_frequencies(c, layer)
    q = _linear(w, p + "q_proj", x).reshape(T, nh, hd)
    q = apply_rope(rms_norm(q, _norm_weight(w, p + "q_norm"), eps), positions, inv)
    src = kv_sources(c)[layer]
    if src != layer:
        k, v = shared_kv[kind]
        kr = vr = None
    else:
        kr = _linear(w, p + "k_proj", x).reshape(T, nkv, hd)
        vr = kr if k_eq_v(c, layer) else _linear(w, p + "v_proj", x).reshape(T, nkv, hd)
        k = apply_rope(rms_norm(kr, _norm_weight(w, p + "k_norm"), eps), positions, inv)
        v = rms_norm(vr, None, eps)
        if layer == max(j for j in range(first_shared_layer(c)) if c["layer_types"][j] == kind):
            shared_kv[kind] = (k, v)
    nkv = k.shape[1]
    group = nh // nkv
    window = c["sliding_window"] if kind == SLIDING else None
    allowed = attention_mask(T, window)
    out = np.empty((T, nh, hd))
    for h in range(nh):
        kh, vh = k[:, h // group, :], v[:, h // group, :]
        s = (q[:, h, :] @ kh.T) * 1.0  # Gemma4TextAttention.scaling = 1.0
        s = np.where(allowed, s, -np.inf)
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        out[:, h, :] = (s / s.sum(axis=-1, keepdims=True)) @ vh
    o = _linear(w, p + "o_proj", out.reshape(T, nh * hd))
    if trace is not None:
        trace.update(attn_in=x, q=q, k=k, v=v, k_raw=kr, v_raw=vr, attn_out=o)
    return o


def mlp(config, w, layer, x):
    c = text_config(config)
    act = ACTIVATIONS[c.get("hidden_activation") or "gelu_pytorch_tanh"]
    p = f"layers.{layer}.mlp."
    return _linear(w, p + "down_proj", act(_linear(w, p + "gate_proj", x)) * _linear(w, p + "up_proj", x))


def decoder_layer(config, w, layer, x, positions, shared_kv, pl=None, trace=None):
    c = text_config(config)
    eps = c["rms_norm_eps"]
    p = f"layers.{layer}."
    t = {} if trace is not None else None
    h = attention(c, w, layer, rms_norm(x, _norm_weight(w, p + "input_layernorm"), eps),
                  positions, shared_kv, t)
    x = x + rms_norm(h, _norm_weight(w, p + "post_attention_layernorm"), eps)
    h = mlp(c, w, layer, rms_norm(x, _norm_weight(w, p + "pre_feedforward_layernorm"), eps))
    x = x + rms_norm(h, _norm_weight(w, p + "post_feedforward_layernorm"), eps)
    if pl is not None:
        act = ACTIVATIONS[c.get("hidden_activation") or "gelu_pytorch_tanh"]
        g = act(_linear(w, p + "per_layer_input_gate", x)) * pl[:, layer, :]
        g = _linear(w, p + "per_layer_projection", g)
        x = x + rms_norm(g, _norm_weight(w, p + "post_per_layer_input_norm"), eps)
    scalar = w.get(p + "layer_scalar")
    x = x * (1.0 if scalar is None else float(np.asarray(scalar).reshape(-1)[0]))
    if trace is not None:
        t["out"] = x
        trace[layer] = t
    return x


def hidden_states(config, tensors, tokens, trace=None):
    """Final hidden states (T, H) before the final norm."""
    c = text_config(config)
    w = tensors if tensors.get("__stripped__") is not None else strip_prefix(tensors)
    tokens = np.asarray(tokens)
    dt = model_dtype(c)
    e = w["embed_tokens.weight"][tokens] * round_to(math.sqrt(c["hidden_size"]), dt)
    pl = per_layer_inputs(c, w, tokens, e)
    positions = np.arange(len(tokens))
    shared_kv = {}
    x = e
    if trace is not None:
        trace["embed"], trace["per_layer_inputs"] = e, pl
    for i in range(c["num_hidden_layers"]):
        x = decoder_layer(c, w, i, x, positions, shared_kv, pl, trace)
    return x


def forward(config, tensors, tokens, trace=None):
    """Logits (T, vocab) for tokens. trace, if a dict, receives per-layer intermediates:
    trace[i] = {attn_in, q, k, v, k_raw, v_raw, attn_out, out}, trace["embed"], ..."""
    c = text_config(config)
    w = strip_prefix(tensors)
    w["__stripped__"] = np.zeros(0)
    x = hidden_states(c, w, tokens, trace)
    x = rms_norm(x, w["norm.weight"], c["rms_norm_eps"])
    head = w["embed_tokens.weight"] if c.get("tie_word_embeddings", True) or "lm_head.weight" not in w \
        else w["lm_head.weight"]
    return softcap(x @ head.T, c.get("final_logit_softcapping"))


def log_softmax(logits):
    m = logits.max(axis=-1, keepdims=True)
    return logits - m - np.log(np.exp(logits - m).sum(axis=-1, keepdims=True))


def nll(logits, tokens):
    """Mean negative log-likelihood of tokens[1:] given logits at positions 0..T-2."""
    lp = log_softmax(logits[:-1])
    return float(-np.mean(lp[np.arange(len(tokens) - 1), np.asarray(tokens[1:])]))


def perplexity(config, tensors, tokens):
    return math.exp(nll(forward(config, tensors, tokens), tokens))


def greedy(config, tensors, prompt, steps):
    """The `steps` argmax tokens after prompt (one full forward pass per step)."""
    toks = list(prompt)
    for _ in range(steps):
        toks.append(int(np.argmax(forward(config, tensors, toks)[-1])))
    return toks[len(prompt):]
