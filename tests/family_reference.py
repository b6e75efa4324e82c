"""Independent NumPy reference forward pass of the model families of "Real models II".

Written from the published modeling code, read (never copied) from Hugging Face
transformers (src/transformers/models/<family>/modeling_<family>.py,
src/transformers/modeling_rope_utils.py, src/transformers/masking_utils.py) and
google/gemma_pytorch (gemma/model.py); each function below names the file whose
behaviour it restates. It is separate from run.c, export.py and tests/reference.py,
so that it can judge all three.

Arithmetic: float64 throughout, on the values the checkpoint stores (a bf16 file's
values widened exactly), so the result is the "true" answer for the file; run.c's
float32 should land within ~1e-5 relative on the mean nll.

Input: the Hugging Face config dict (config.json as loaded; Gemma 3's multimodal
`text_config` is unwrapped) and {HF tensor name: array} (as tests/hf_fixture.py's
`load_hf_checkpoint` returns). Output: logits (T, vocab) for a token sequence.

Layout: Hugging Face's. Matrices are (out, in); a query/key head of size hd rotates
pair (i, i + r/2) for i < r/2, r = the rotated dims (`rotate_half`), the first pair
the fastest; with partial rotary only the first r dims of a head rotate.

The Llama block is the spine:

    x = embed[token] * embed_scale
    per layer:  h = attn(norm(x)) ; x += h ;  f = mlp(norm(x)) ; x += f
                attn: q, k, v = W x (+ b); [q/k head norms]; RoPE(q, k) on rotating layers;
                      softmax(softcap(q.k * scale) masked causal [and to a window]) v; o = Wo .
                mlp:  down(act(gate x) * up x)
    logits = softcap(norm(x) @ lm_head^T)

What each family changes, and the config keys that switch it
(model_type -> FAMILIES below):

  llama    (LlamaForCausalLM): the spine. RMSNorm x * w; SwiGLU (hidden_act "silu");
           scale hd^-0.5; rope_theta, rope_scaling (here: default, linear, longrope).
  mistral  (modeling_mistral.py): `sliding_window` W (4096 in Mistral-7B-v0.1) on every
           layer: query t sees keys s with t - W < s <= t (masking_utils.sliding_window_overlay,
           `kv_idx > q_idx - sliding_window`), i.e. W keys including itself.
  qwen2    (modeling_qwen2.py): q_proj, k_proj, v_proj carry biases (.bias tensors; o_proj
           none). Sliding only if `use_sliding_window` (false in every Qwen2.5 release): then
           layers i >= `max_window_layers` slide.
  qwen3    (modeling_qwen3.py): `head_dim` independent of hidden_size / heads (128 with
           hidden 1024, 16 heads); q_norm, k_norm (RMSNorm x*w over each head's hd values)
           applied after the projections, before RoPE. No biases.
  gemma    (modeling_gemma.py; gemma_pytorch model.py): RMSNorm x * (1 + w) (weights stored
           as offsets from 1; GemmaRMSNorm); GeGLU with the tanh GELU (gemma_pytorch always
           uses F.gelu(approximate="tanh"); transformers overrides the checkpoints'
           hidden_act "gelu" to gelu_pytorch_tanh); embeddings times sqrt(hidden_size)
           rounded to the model's dtype (`normalizer = torch.tensor(hidden_size**0.5,
           dtype=hidden_states.dtype)`: sqrt(2048) = 45.2548 -> 45.25 in bf16); `head_dim`
           256 explicit; lm_head tied to the embeddings.
  gemma2   (modeling_gemma2.py): Gemma plus four norms per layer: input_layernorm before
           attention, post_attention_layernorm on the attention OUTPUT before the residual
           add, pre_feedforward_layernorm before the MLP, post_feedforward_layernorm on its
           output; `attn_logit_softcapping` c: scores -> c tanh(scores / c) after scaling,
           before the mask; `final_logit_softcapping` likewise on the logits; scale
           `query_pre_attn_scalar`^-0.5; `sliding_window` on layers 0, 2, 4, ... (layer i
           slides when (i + 1) % 2 != 0; or `layer_types`).
  gemma3_text (modeling_gemma3.py): Gemma 2's four norms plus q_norm, k_norm with (1 + w)
           before RoPE; soft-caps null; layer i global when (i + 1) % sliding_window_pattern
           == 0 (pattern 6: five sliding to one global; or `layer_types`); two RoPE settings:
           sliding layers theta `rope_local_base_freq` (10k) with no scaling, global layers
           `rope_theta` (1M) with `rope_scaling` (linear factor 8 on 4B and larger); the
           embedding scale is rounded to the weights' dtype (Gemma3TextScaledWordEmbedding).
           transformers 5 spells the two settings rope_parameters{"sliding_attention": {...},
           "full_attention": {...}}; both spellings are read.
  smollm3  (modeling_smollm3.py): `no_rope_layers`[i] is 1 where layer i rotates and 0 where
           it does not (`self.use_rope = config.no_rope_layers[layer_idx]`): every fourth
           layer (3, 7, ...) is NoPE: q and k enter attention unrotated.
  phi3     (modeling_phi3.py; Phi-3-mini and Phi-4-mini): fused `qkv_proj` (rows: q, then k,
           then v) and `gate_up_proj` (rows: gate, then up); `sliding_window` on every layer
           when set (2047 in Phi-3-mini-4k; 262144 in Phi-4-mini, beyond its length);
           `partial_rotary_factor` f: only the first r = int(hd f) dims of each head rotate,
           as rotate_half over those r dims (GPT-NeoX style), frequencies theta^(-2i/r);
           rope_scaling type "longrope": inv_freq_i = 1 / (ext_i theta^(2i/r)) with ext =
           long_factor when the sequence is longer than original_max_position_embeddings,
           else short_factor, and cos, sin multiplied by the attention factor
           sqrt(1 + ln(s) / ln(original)), s = max_position_embeddings / original
           (modeling_rope_utils._compute_longrope_parameters, which takes `factor` when
           given and an explicit `attention_factor` when given).

Cross-check (by hand, not a test: it needs a fetched copy of google/gemma_pytorch, and a
second implementation in torch is not wanted in the suite): gemma_pytorch's gemma/model.py
(GemmaModel, float32) on the F32 Gemma-2B, Gemma-2-2B, Gemma-3-270M and Gemma-3-1B fixtures
of family_fixtures.py, 40 tokens (past the windows of 8), agreed with this file to 6e-8
relative on the mean nll and 6e-5 on the largest logit difference; a window one wider here
moved the nll by 2e-2.

Longrope's choice: transformers picks per forward call by the longest position + 1
(longrope_frequency_update); llama.cpp by the context in use (n_ctx). `forward(...,
context=N)` picks as llama.cpp does for a context of N; without it, as transformers does
for this sequence.
"""

import math

import numpy as np

# ---------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "smollm3", "phi3")
GEMMA_FAMILIES = ("gemma", "gemma2", "gemma3_text")

# dtype names of config.json ("torch_dtype" in transformers 4, "dtype" in 5)
DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}


def text_config(config):
    """The language model's config: Gemma 3 multimodal configs nest it in text_config."""
    if config.get("model_type") == "gemma3" and "text_config" in config:
        inner = dict(config["text_config"])
        inner.setdefault("model_type", "gemma3_text")
        for key in ("torch_dtype", "dtype"):
            if key in config and key not in inner:
                inner[key] = config[key]
        return inner
    return config


def family(config):
    f = config.get("model_type")
    if f not in FAMILIES:
        raise ValueError(f"family_reference: unsupported model_type {f!r}")
    return f


def head_dim(config):
    """config.head_dim when given (Qwen3, Gemma), else hidden_size / num_attention_heads."""
    hd = config.get("head_dim")
    return int(hd) if hd else config["hidden_size"] // config["num_attention_heads"]


def model_dtype(config):
    return DTYPES.get(config.get("dtype") or config.get("torch_dtype") or "float32", "F32")


def round_to(x, dtype):
    """x rounded to float32 / bfloat16 (nearest even) / float16, returned as float64."""
    x32 = np.float32(x)
    if dtype == "F32":
        return float(x32)
    if dtype == "F16":
        return float(np.float16(x))
    u = int(np.array(x32).view(np.uint32))
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return float(np.array(u, dtype=np.uint32).view(np.float32))


# ---------------------------------------------------------------------------
# Layer pattern: which layers slide, which rotate, with which RoPE setting
# ---------------------------------------------------------------------------


def layer_types(config):
    """'sliding_attention' or 'full_attention' per layer, as each family's config builds it."""
    n = config["num_hidden_layers"]
    f = family(config)
    if config.get("layer_types") and f not in ("qwen2", "smollm3"):
        return list(config["layer_types"])
    if f == "gemma2":  # configuration_gemma2.py: sliding when (i + 1) % 2 != 0
        return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
    if f == "gemma3_text":  # configuration_gemma3.py: global when (i + 1) % pattern == 0
        pattern = config.get("sliding_window_pattern", config.get("_sliding_window_pattern", 6))
        return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
    if f in ("mistral", "phi3"):  # one window on every layer when sliding_window is set
        return ["sliding_attention" if config.get("sliding_window") else "full_attention"] * n
    if f == "qwen2":  # configuration_qwen2.py: only with use_sliding_window, layers >= max_window_layers
        slide = config.get("use_sliding_window") and config.get("sliding_window")
        mwl = config.get("max_window_layers", n)
        return ["sliding_attention" if slide and i >= mwl else "full_attention" for i in range(n)]
    if f == "smollm3":  # configuration_smollm3.py: sliding only with use_sliding_window, NoPE layers
        slide = config.get("use_sliding_window") and config.get("sliding_window")
        rot = rotating_layers(config)
        return ["sliding_attention" if slide and not rot[i] else "full_attention" for i in range(n)]
    return ["full_attention"] * n


def rotating_layers(config):
    """True where a layer applies RoPE. Only SmolLM3 has NoPE layers (no_rope_layers[i] == 0)."""
    n = config["num_hidden_layers"]
    if family(config) == "smollm3":
        nrl = config.get("no_rope_layers")
        if nrl is None:  # configuration_smollm3.py's default from no_rope_layer_interval
            every = config.get("no_rope_layer_interval", 4)
            nrl = [int((i + 1) % every != 0) for i in range(n)]
        return [bool(v) for v in nrl]
    return [True] * n


def layer_windows(config):
    """Attention window per layer: None (full causal) or W (query t sees t-W+1 .. t)."""
    w = config.get("sliding_window")
    return [int(w) if t == "sliding_attention" else None for t in layer_types(config)]


def rope_settings(config):
    """The RoPE setting(s) of the model, as {layer_type: params}; params is a dict with
    rope_type, rope_theta, partial_rotary_factor and the rule's keys (transformers 5's
    standardized form), read from either spelling."""
    prf = config.get("partial_rotary_factor", 1.0)
    rp = config.get("rope_parameters")
    if family(config) == "gemma3_text":
        if rp and "full_attention" in rp:  # transformers 5: one dict per layer type
            return {t: dict(p) for t, p in rp.items()}
        scaling = dict(config.get("rope_scaling") or {"rope_type": "default"})
        glob = {"rope_theta": config.get("rope_theta", 1e6), "partial_rotary_factor": prf, **scaling}
        glob["rope_type"] = scaling.get("rope_type", scaling.get("type", "default"))
        loc = {"rope_type": "default", "rope_theta": config.get("rope_local_base_freq", 10000.0),
               "partial_rotary_factor": prf}
        return {"full_attention": glob, "sliding_attention": loc}
    if rp:
        p = dict(rp)
    else:
        p = dict(config.get("rope_scaling") or {})
        p["rope_type"] = p.pop("rope_type", p.pop("type", "default"))
        p["rope_theta"] = config.get("rope_theta", 10000.0)
        p["partial_rotary_factor"] = prf
    # Phi-3 keeps original_max_position_embeddings at the top level
    if "original_max_position_embeddings" not in p and "original_max_position_embeddings" in config:
        p["original_max_position_embeddings"] = config["original_max_position_embeddings"]
    p.setdefault("partial_rotary_factor", prf)
    return {"full_attention": p, "sliding_attention": p}


def rotary_dim(config, params):
    """Rotated dims of a head: int(head_dim * partial_rotary_factor) (modeling_rope_utils)."""
    return int(head_dim(config) * params.get("partial_rotary_factor", 1.0))


def longrope_attention_factor(config, params):
    """_compute_longrope_parameters: an explicit attention_factor wins; else with
    s = factor (or max_position_embeddings / original when no factor is given),
    sqrt(1 + ln s / ln original) when s > 1, else 1."""
    if params.get("attention_factor") is not None:
        return float(params["attention_factor"])
    original = params["original_max_position_embeddings"]
    s = params.get("factor") or config["max_position_embeddings"] / original
    return math.sqrt(1.0 + math.log(s) / math.log(original)) if s > 1.0 else 1.0


def inverse_frequencies(config, params, seq_len):
    """(inv_freq (r/2,), attention_factor) of a RoPE setting for a sequence of seq_len
    positions: default theta^(-2i/r); linear divides by factor; longrope divides by the
    short or long factors (the long ones when seq_len > original_max_position_embeddings)."""
    r = rotary_dim(config, params)
    base = float(params["rope_theta"])
    i = np.arange(0, r, 2, dtype=np.float64) / r
    inv = base ** -i
    kind = params.get("rope_type", "default")
    if kind == "default":
        return inv, 1.0
    if kind == "linear":
        return inv / float(params["factor"]), 1.0
    if kind == "longrope":
        original = params["original_max_position_embeddings"]
        ext = params["long_factor"] if seq_len > original else params["short_factor"]
        ext = np.asarray(ext, dtype=np.float64)
        if ext.shape != inv.shape:
            raise ValueError(f"longrope factors: {ext.shape[0]} for {inv.shape[0]} rotated pairs")
        return inv / ext, longrope_attention_factor(config, params)
    raise ValueError(f"family_reference: rope_type {kind!r} not covered")


def longrope_factors_in_use(config, seq_len):
    """'short' or 'long': which longrope factor set applies to seq_len positions."""
    p = rope_settings(config)["full_attention"]
    return "long" if seq_len > p["original_max_position_embeddings"] else "short"


# ---------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------


def rms_norm(x, w, eps, offset=0.0):
    """x / sqrt(mean(x^2) + eps) * (offset + w): offset 0 (Llama), 1 (Gemma's (1 + w))."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * (offset + w)


def silu(x):
    return x / (1.0 + np.exp(-x))


def gelu_tanh(x):
    """GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def softcap(x, cap):
    """cap * tanh(x / cap): Gemma 2's soft-capping, |result| < cap, ~x for |x| << cap."""
    return x if not cap else cap * np.tanh(x / cap)


def rotate(x, positions, inv_freq, attention_factor=1.0):
    """RoPE on x (T, H, hd) at positions (T,), HF layout (modeling_llama.apply_rotary_pos_emb
    with Phi-3's partial split): with r = 2 len(inv_freq), dims [0, r) rotate as
    x*cos + rotate_half(x)*sin, cos and sin of pos * inv_freq times the attention factor;
    dims [r, hd) pass unchanged."""
    r = 2 * len(inv_freq)
    ang = np.asarray(positions, dtype=np.float64)[:, None] * inv_freq[None, :]  # (T, r/2)
    c = (np.cos(ang) * attention_factor)[:, None, :]
    s = (np.sin(ang) * attention_factor)[:, None, :]
    x1, x2, rest = x[..., : r // 2], x[..., r // 2: r], x[..., r:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s, rest], axis=-1)


def attention_mask(T, window):
    """allowed[t, s]: s <= t, and t - s < window on a sliding layer (masking_utils)."""
    t = np.arange(T)[:, None]
    s = np.arange(T)[None, :]
    ok = s <= t
    if window:
        ok &= s > t - window
    return ok


def embed_scale(config):
    """Gemma families: sqrt(hidden_size) rounded to the model's dtype; others 1."""
    if family(config) not in GEMMA_FAMILIES:
        return 1.0
    return round_to(math.sqrt(config["hidden_size"]), model_dtype(config))


def attention_scale(config):
    """Gemma 2, 3: query_pre_attn_scalar^-0.5; others head_dim^-0.5."""
    if family(config) in ("gemma2", "gemma3_text"):
        return float(config["query_pre_attn_scalar"]) ** -0.5
    return head_dim(config) ** -0.5


def activation(config):
    if family(config) in GEMMA_FAMILIES:
        return gelu_tanh
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"family_reference: hidden_act {act!r} not covered")
    return silu


def strip_prefix(tensors):
    """Gemma 3 multimodal checkpoints prefix the text model's names: keep those, named as
    Gemma3ForCausalLM names them."""
    out = {}
    for name, a in tensors.items():
        for p in ("language_model.model.", "model.language_model."):
            if name.startswith(p):
                name = "model." + name[len(p):]
        if name.startswith("language_model.lm_head."):
            name = name[len("language_model."):]
        out[name] = np.asarray(a, dtype=np.float64)
    return out


# ---------------------------------------------------------------------------
# Forward pass
# ---------------------------------------------------------------------------


class Plan:
    """Everything the forward pass needs from the config, per layer."""

    def __init__(self, config, seq_len, context=None, folded_norms=False):
        config = text_config(config)
        self.config = config
        self.family = family(config)
        self.hd = head_dim(config)
        self.n_heads = config["num_attention_heads"]
        self.n_kv = config.get("num_key_value_heads", self.n_heads)
        self.eps = config.get("rms_norm_eps", 1e-6)
        # Gemma's x * (1 + w); folded_norms: the weights already hold 1 + w (as an export may store them)
        self.offset = 1.0 if self.family in GEMMA_FAMILIES and not folded_norms else 0.0
        self.four_norms = self.family in ("gemma2", "gemma3_text")
        self.qk_norm = self.family in ("qwen3", "gemma3_text")
        self.scale = attention_scale(config)
        self.attn_cap = config.get("attn_logit_softcapping") if self.four_norms else None
        self.final_cap = config.get("final_logit_softcapping") if self.four_norms else None
        self.act = activation(config)
        self.embed_scale = embed_scale(config)
        self.windows = layer_windows(config)
        types = layer_types(config)
        rotates = rotating_layers(config)
        settings = rope_settings(config)
        n_for_choice = context if context is not None else seq_len
        self.rope = []  # per layer: None (NoPE) or (inv_freq, attention_factor)
        for i in range(config["num_hidden_layers"]):
            if not rotates[i]:
                self.rope.append(None)
            else:
                self.rope.append(inverse_frequencies(config, settings[types[i]], n_for_choice))


def layer_settings(config, context):
    """Per layer, what a runner should report for a context of `context` positions:
    {"rotates", "theta", "rotated_pairs", "inv_freq" (None for NoPE), "attention_factor",
    "rope_type", "window"} (the rotary setting of its layer type, longrope's set chosen by
    the context, as llama.cpp chooses)."""
    config = text_config(config)
    plan = Plan(config, context, context)
    settings, types = rope_settings(config), layer_types(config)
    out = []
    for i, rope in enumerate(plan.rope):
        params = settings[types[i]]
        out.append({"rotates": rope is not None, "theta": float(params["rope_theta"]),
                    "rotated_pairs": len(rope[0]) if rope else 0, "inv_freq": rope[0] if rope else None,
                    "attention_factor": rope[1] if rope else 1.0,
                    "rope_type": params.get("rope_type", "default"), "window": plan.windows[i]})
    return out


def project_qkv(plan, w, p, x):
    """q (T, H, hd), k, v (T, Hkv, hd): separate projections (+ Qwen2's biases) or Phi-3's
    fused qkv_proj rows [q | k | v]."""
    T, hd = x.shape[0], plan.hd
    nq, nk = plan.n_heads * hd, plan.n_kv * hd
    if p + "self_attn.qkv_proj.weight" in w:
        qkv = x @ w[p + "self_attn.qkv_proj.weight"].T
        q, k, v = qkv[:, :nq], qkv[:, nq:nq + nk], qkv[:, nq + nk:nq + 2 * nk]
    else:
        out = []
        for name in ("q_proj", "k_proj", "v_proj"):
            y = x @ w[p + f"self_attn.{name}.weight"].T
            b = w.get(p + f"self_attn.{name}.bias")
            out.append(y if b is None else y + b)
        q, k, v = out
    return q.reshape(T, plan.n_heads, hd), k.reshape(T, plan.n_kv, hd), v.reshape(T, plan.n_kv, hd)


def attention(plan, w, p, x, layer, positions, return_keys=False):
    q, k, v = project_qkv(plan, w, p, x)
    if plan.qk_norm:  # per head, over hd, before RoPE (Qwen3: x*w; Gemma 3: x*(1+w))
        q = rms_norm(q, w[p + "self_attn.q_norm.weight"], plan.eps, plan.offset)
        k = rms_norm(k, w[p + "self_attn.k_norm.weight"], plan.eps, plan.offset)
    if plan.rope[layer] is not None:
        inv, af = plan.rope[layer]
        q, k = rotate(q, positions, inv, af), rotate(k, positions, inv, af)
    if return_keys:
        return k
    T = x.shape[0]
    group = plan.n_heads // plan.n_kv  # query head h reads kv head h // group (repeat_kv)
    allowed = attention_mask(T, plan.windows[layer])
    out = np.empty((T, plan.n_heads, plan.hd))
    for h in range(plan.n_heads):
        kh, vh = k[:, h // group], v[:, h // group]
        scores = softcap((q[:, h] @ kh.T) * plan.scale, plan.attn_cap)
        scores = np.where(allowed, scores, -np.inf)
        scores -= scores.max(axis=-1, keepdims=True)
        prob = np.exp(scores)
        prob /= prob.sum(axis=-1, keepdims=True)
        out[:, h] = prob @ vh
    o = out.reshape(T, -1) @ w[p + "self_attn.o_proj.weight"].T
    b = w.get(p + "self_attn.o_proj.bias")  # attention_bias true (Llama-style); Qwen2 has none
    return o if b is None else o + b


def mlp(plan, w, p, x):
    """down(act(gate x) * up x); Phi-3's gate_up_proj rows are [gate | up]."""
    if p + "mlp.gate_up_proj.weight" in w:
        gu = x @ w[p + "mlp.gate_up_proj.weight"].T
        n = gu.shape[1] // 2
        gate, up = gu[:, :n], gu[:, n:]
    else:
        gate, up = x @ w[p + "mlp.gate_proj.weight"].T, x @ w[p + "mlp.up_proj.weight"].T
    return (plan.act(gate) * up) @ w[p + "mlp.down_proj.weight"].T


def forward(config, tensors, tokens, context=None, return_hidden=False, folded_norms=False):
    """Logits (T, vocab) for tokens at positions 0..T-1. context: the context in use,
    for longrope's short/long choice (default: T, as transformers chooses).
    folded_norms: Gemma's norm weights hold 1 + w already (plain x * w norms)."""
    w = strip_prefix(tensors)
    tokens = np.asarray(tokens)
    T = len(tokens)
    plan = Plan(config, T, context, folded_norms)
    positions = np.arange(T)
    x = w["model.embed_tokens.weight"][tokens] * plan.embed_scale
    for i in range(plan.config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        norm = lambda y, name: rms_norm(y, w[p + name + ".weight"], plan.eps, plan.offset)  # noqa: E731
        h = attention(plan, w, p, norm(x, "input_layernorm"), i, positions)
        if plan.four_norms:
            h = norm(h, "post_attention_layernorm")  # Gemma 2/3: on the attention output
            x = x + h
            f = mlp(plan, w, p, norm(x, "pre_feedforward_layernorm"))
            x = x + norm(f, "post_feedforward_layernorm")
        else:
            x = x + h
            x = x + mlp(plan, w, p, norm(x, "post_attention_layernorm"))  # the pre-MLP norm
    x = rms_norm(x, w["model.norm.weight"], plan.eps, plan.offset)
    if return_hidden:
        return x
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return softcap(x @ head.T, plan.final_cap)


def layer_keys(config, tensors, tokens, layer=0):
    """Layer `layer`'s keys (T, Hkv, hd) after norms and RoPE for tokens fed from position 0
    (only layer 0's keys are a function of the tokens alone; used by the NoPE check)."""
    w = strip_prefix(tensors)
    T = len(tokens)
    plan = Plan(config, T)
    assert layer == 0
    x = w["model.embed_tokens.weight"][np.asarray(tokens)] * plan.embed_scale
    x = rms_norm(x, w["model.layers.0.input_layernorm.weight"], plan.eps, plan.offset)
    return attention(plan, w, "model.layers.0.", x, 0, np.arange(T), return_keys=True)


def log_softmax(logits):
    m = logits.max(axis=-1, keepdims=True)
    return logits - m - np.log(np.exp(logits - m).sum(axis=-1, keepdims=True))


def nll(logits, tokens):
    """Mean negative log-likelihood of tokens[1:] given the logits at positions 0..T-2
    (run -m ppl's "nll:")."""
    lp = log_softmax(logits[:-1])
    return float(-np.mean(lp[np.arange(len(tokens) - 1), np.asarray(tokens[1:])]))


def greedy(config, tensors, prompt, steps, context=None):
    """The `steps` argmax tokens that follow prompt (a full forward pass per step)."""
    toks = list(prompt)
    w = strip_prefix(tensors)
    for _ in range(steps):
        toks.append(int(np.argmax(forward(config, w, toks, context)[-1])))
    return toks[len(prompt):]
