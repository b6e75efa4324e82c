"""The published config.json of each model "Real models II" names, and a shrinker that
writes a small Hugging Face checkpoint with random weights at each one's shape.

REAL_CONFIGS holds each model's config.json as its Hugging Face repository publishes it
(the file's keys and values; key order alphabetical as save_pretrained writes them).
Sources, read through the stored copies the search tool returns (never fetched live):
  Qwen/Qwen2.5-0.5B, Qwen/Qwen3-0.6B, google/gemma-2b, google/gemma-2-2b,
  google/gemma-3-270m, google/gemma-3-1b-pt, HuggingFaceTB/SmolLM3-3B,
  microsoft/Phi-3-mini-4k-instruct, microsoft/Phi-4-mini-instruct,
  mistralai/Mistral-7B-v0.1: each model's `config.json` on huggingface.co, as quoted in
  public repositories' test fixtures and model cards (e.g. Gemma-3-270M's 18-entry
  layer_types, SmolLM3-3B's 36-entry no_rope_layers, Phi-4-mini's 48 long/short factors
  from an mlx-community copy of microsoft/Phi-4-mini-instruct's config.json, whose
  quantization keys are left out here). "gemma-3-4b-text" is not a whole config.json:
  google/gemma-3-4b-pt's text_config gives hidden_size, intermediate_size,
  num_hidden_layers, rope_scaling (linear x8) and sliding_window (1024); the other fields
  are Gemma3TextConfig's defaults (configuration_gemma3.py) written out. It is wrapped as
  the multimodal gemma3 config nests it, for the text_config path and the linear rule.

`shrink(name)` keeps what the issue says must be kept and narrows the rest:
  - every layer kind of the real pattern: Gemma 2's (sliding, global) pair, Gemma 3's
    five sliding then one global, SmolLM3's three RoPE then one NoPE layer, two layers
    elsewhere; layer_types / no_rope_layers cut to the first period of the real list;
  - head_dim (rotated dims, partial rotary, the 48 longrope factors), the GQA ratio
    num_attention_heads / num_key_value_heads (with one kv head; two where the ratio is
    1), RoPE thetas, rules and factors, soft-caps, query_pre_attn_scalar, eps, biases,
    tying, activation;
  - windows made small (default 8, Phi-3-mini's odd 2047 -> 7; Phi-4-mini's 262144,
    beyond its length, stays beyond it) so short texts cross them; an unused window
    (Qwen2.5's, use_sliding_window false) is made small too, so that applying it shows;
  - narrower: hidden_size = heads x head_dim where the family derives head_dim from it,
    else 96 (sqrt(96) is not a bf16 number, so Gemma's rounded embedding scale shows);
    intermediate_size 2 hidden + 32; vocab 512 (the tests' tok512 tokenizer), with
    bos 1, eos 2, pad 0; max_position_embeddings at most 1024; longrope's
    original_max_position_embeddings 4096 -> 32 with max_position_embeddings in the same
    ratio (32x: factor and attention factor from the same formula).
`write_checkpoint(dir, name, dtype)` writes config.json and model.safetensors (float32 or
bf16 through tests/hf_fixture.py's writer) and returns (config, tensors): tensors as float64
arrays equal to the stored values.
"""

import json
import os

import numpy as np

import hf_fixture

# ---------------------------------------------------------------------------
# The published configs
# ---------------------------------------------------------------------------

PHI4_LONG_FACTOR = [
    1, 1.118320672, 1.250641126, 1.398617824, 1.564103225, 1.74916897, 1.956131817, 2.187582649,
    2.446418898, 2.735880826, 3.059592084, 3.421605075, 3.826451687, 4.279200023, 4.785517845,
    5.351743533, 5.984965424, 6.693110555, 7.485043894, 8.370679318, 9.36110372, 10.4687158,
    11.70738129, 13.09260651, 14.64173252, 16.37415215, 18.31155283, 20.47818807, 22.90118105,
    25.61086418, 28.64115884, 32.03, 32.1, 32.13, 32.23, 32.6, 32.61, 32.64, 32.66, 32.7, 32.71,
    32.93, 32.97, 33.28, 33.49, 33.5, 44.16, 47.77]
PHI4_SHORT_FACTOR = [1.0] * 48

S, F = "sliding_attention", "full_attention"

REAL_CONFIGS = {
    "Qwen2.5-0.5B": {
        "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
        "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
        "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24,
        "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
        "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
        "sliding_window": 32768, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "transformers_version": "4.40.1", "use_cache": True, "use_mrope": False,
        "use_sliding_window": False, "vocab_size": 151936},
    "Qwen3-0.6B": {
        "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
        "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
        "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
        "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
        "tie_word_embeddings": True, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
        "use_cache": True, "use_sliding_window": False, "vocab_size": 151936},
    "Gemma-2B": {
        "architectures": ["GemmaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 2, "eos_token_id": 1, "head_dim": 256, "hidden_act": "gelu",
        "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 16384,
        "max_position_embeddings": 8192, "model_type": "gemma", "num_attention_heads": 8,
        "num_hidden_layers": 18, "num_key_value_heads": 1, "pad_token_id": 0, "rms_norm_eps": 1e-06,
        "rope_scaling": None, "rope_theta": 10000.0, "torch_dtype": "bfloat16",
        "transformers_version": "4.38.0.dev0", "use_cache": True, "vocab_size": 256000},
    "Gemma-2-2B": {
        "architectures": ["Gemma2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid",
        "eos_token_id": 1, "final_logit_softcapping": 30.0, "head_dim": 256,
        "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": 2304, "initializer_range": 0.02, "intermediate_size": 9216,
        "max_position_embeddings": 8192, "model_type": "gemma2", "num_attention_heads": 8,
        "num_hidden_layers": 26, "num_key_value_heads": 4, "pad_token_id": 0,
        "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
        "sliding_window": 4096, "torch_dtype": "float32", "transformers_version": "4.42.4",
        "use_cache": True, "vocab_size": 256000},
    "Gemma-3-270M": {
        "_sliding_window_pattern": 6, "architectures": ["Gemma3ForCausalLM"], "attention_bias": False,
        "attention_dropout": 0.0, "attn_logit_softcapping": None, "bos_token_id": 2,
        "eos_token_id": 1, "final_logit_softcapping": None, "head_dim": 256,
        "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 640, "initializer_range": 0.02,
        "intermediate_size": 2048, "layer_types": [S, S, S, S, S, F] * 3,
        "max_position_embeddings": 32768, "model_type": "gemma3_text", "num_attention_heads": 4,
        "num_hidden_layers": 18, "num_key_value_heads": 1, "pad_token_id": 0,
        "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000.0,
        "rope_scaling": None, "rope_theta": 1000000.0, "sliding_window": 512,
        "torch_dtype": "bfloat16", "transformers_version": "4.55.0.dev0",
        "use_bidirectional_attention": False, "use_cache": True, "vocab_size": 262144},
    "Gemma-3-1B": {
        "architectures": ["Gemma3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "attn_logit_softcapping": None, "bos_token_id": 2, "cache_implementation": "hybrid",
        "eos_token_id": 1, "final_logit_softcapping": None, "head_dim": 256,
        "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152, "initializer_range": 0.02,
        "intermediate_size": 6912, "max_position_embeddings": 32768, "model_type": "gemma3_text",
        "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1,
        "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
        "rope_local_base_freq": 10000, "rope_scaling": None, "rope_theta": 1000000,
        "sliding_window": 512, "sliding_window_pattern": 6, "torch_dtype": "bfloat16",
        "transformers_version": "4.50.0.dev0", "use_cache": True, "vocab_size": 262144},
    "SmolLM3-3B": {
        "architectures": ["SmolLM3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": None, "eos_token_id": 128012, "hidden_act": "silu", "hidden_size": 2048,
        "initializer_range": 0.02, "intermediate_size": 11008, "max_position_embeddings": 65536,
        "max_window_layers": 28, "mlp_bias": False, "model_type": "smollm3",
        "no_rope_layer_interval": 4, "no_rope_layers": [1, 1, 1, 0] * 9, "num_attention_heads": 16,
        "num_hidden_layers": 36, "num_key_value_heads": 4, "pad_token_id": 128004,
        "pretraining_tp": 2, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 5000000.0,
        "sliding_window": None, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "transformers_version": "4.54.0.dev0", "use_cache": False, "use_sliding_window": False,
        "vocab_size": 128256},
    "Phi-3-mini-4k": {
        "_name_or_path": "Phi-3-mini-4k-instruct", "architectures": ["Phi3ForCausalLM"],
        "attention_bias": False, "attention_dropout": 0.0,
        "auto_map": {"AutoConfig": "configuration_phi3.Phi3Config",
                     "AutoModelForCausalLM": "modeling_phi3.Phi3ForCausalLM"},
        "bos_token_id": 1, "embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu",
        "hidden_size": 3072, "initializer_range": 0.02, "intermediate_size": 8192,
        "max_position_embeddings": 4096, "model_type": "phi3", "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 32, "original_max_position_embeddings": 4096,
        "pad_token_id": 32000, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05, "rope_scaling": None,
        "rope_theta": 10000.0, "sliding_window": 2047, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "transformers_version": "4.40.2", "use_cache": True,
        "vocab_size": 32064},
    "Phi-4-mini": {
        "_name_or_path": "Phi-4-mini-instruct", "architectures": ["Phi3ForCausalLM"],
        "attention_bias": False, "attention_dropout": 0.0,
        "auto_map": {"AutoConfig": "configuration_phi3.Phi3Config",
                     "AutoModelForCausalLM": "modeling_phi3.Phi3ForCausalLM",
                     "AutoTokenizer": "Xenova/gpt-4o"},
        "bos_token_id": 199999, "embd_pdrop": 0.0, "eos_token_id": 200020, "full_attn_mod": 1,
        "hidden_act": "silu", "hidden_size": 3072, "initializer_range": 0.02,
        "intermediate_size": 8192, "interpolate_factor": 1, "lm_head_bias": False,
        "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "phi3",
        "num_attention_heads": 24, "num_hidden_layers": 32, "num_key_value_heads": 8,
        "original_max_position_embeddings": 4096, "pad_token_id": 199999,
        "partial_rotary_factor": 0.75, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05,
        "rope_scaling": {"long_factor": PHI4_LONG_FACTOR, "short_factor": PHI4_SHORT_FACTOR,
                         "type": "longrope"},
        "rope_theta": 10000.0, "sliding_window": 262144, "tie_word_embeddings": True,
        "torch_dtype": "bfloat16", "transformers_version": "4.45.0", "use_cache": True,
        "vocab_size": 200064},
    "Mistral-7B-v0.1": {
        "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
        "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
        "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
        "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.34.0.dev0", "use_cache": True, "vocab_size": 32000},
    # Gemma 3 4B's text_config fields (see the module docstring), nested as Gemma 3's
    # multimodal config.json nests them: the global layers' linear x8.
    "gemma-3-4b-text": {
        "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
        "torch_dtype": "bfloat16",
        "text_config": {
            "head_dim": 256, "hidden_size": 2560, "intermediate_size": 10240,
            "max_position_embeddings": 131072, "model_type": "gemma3_text",
            "num_attention_heads": 8, "num_hidden_layers": 34, "num_key_value_heads": 4,
            "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000.0,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "rope_theta": 1000000.0,
            "sliding_window": 1024, "sliding_window_pattern": 6, "vocab_size": 262208}},
}

# The ten models the issue names (the last entry above is an extra)
ISSUE_MODELS = ["Qwen2.5-0.5B", "Qwen3-0.6B", "Gemma-2B", "Gemma-2-2B", "Gemma-3-270M", "Gemma-3-1B",
                "SmolLM3-3B", "Phi-3-mini-4k", "Phi-4-mini", "Mistral-7B-v0.1"]

# ---------------------------------------------------------------------------
# Shrinking
# ---------------------------------------------------------------------------

PATTERN_LAYERS = {"gemma2": 2, "gemma3_text": 6, "smollm3": 4}
GEMMA = ("gemma", "gemma2", "gemma3_text")


def _text(config):
    return config["text_config"] if config.get("model_type") == "gemma3" else config


def shrink(name, *, window=8, vocab_size=512, original_len=32, max_len=1024, dtype="F32"):
    """A small config of model `name`'s shape (see the module docstring)."""
    real = json.loads(json.dumps(REAL_CONFIGS[name]))  # deep copy
    c = _text(real)
    fam = c["model_type"]
    ratio = c["num_attention_heads"] // c.get("num_key_value_heads", c["num_attention_heads"])
    hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    n_kv = 2 if ratio == 1 else 1
    n_layers = PATTERN_LAYERS.get(fam, 2)
    c["num_hidden_layers"] = n_layers
    c["num_key_value_heads"] = n_kv
    c["num_attention_heads"] = ratio * n_kv
    if "head_dim" in c:
        c["hidden_size"] = 96
    else:
        c["hidden_size"] = ratio * n_kv * hd
    c["intermediate_size"] = 2 * c["hidden_size"] + 32
    c["vocab_size"] = vocab_size
    if "layer_types" in c:
        c["layer_types"] = c["layer_types"][:n_layers]
    if "no_rope_layers" in c:
        c["no_rope_layers"] = c["no_rope_layers"][:n_layers]
    for key in ("max_window_layers",):
        if key in c:
            c[key] = min(c[key], n_layers)
    real_max = c["max_position_embeddings"]
    orig = c.get("original_max_position_embeddings")
    scaling = c.get("rope_scaling") or {}
    if scaling.get("type", scaling.get("rope_type")) == "longrope":
        c["original_max_position_embeddings"] = original_len
        c["max_position_embeddings"] = original_len * (real_max // orig)
    else:
        c["max_position_embeddings"] = min(real_max, max_len)
        if orig is not None:
            c["original_max_position_embeddings"] = min(orig, max_len)
    w = c.get("sliding_window")
    if w:
        if w >= real_max and c.get("use_sliding_window", True):  # beyond the length: stays beyond
            c["sliding_window"] = 2 * c["max_position_embeddings"]
        else:
            c["sliding_window"] = window - 1 if w % 2 else window
    for key, value in (("bos_token_id", 1), ("eos_token_id", 2), ("pad_token_id", 0)):
        if c.get(key) is not None:
            c[key] = value
    torch_dtype = hf_fixture.TORCH_DTYPE[dtype]
    real["torch_dtype"] = torch_dtype
    if c is not real:
        c["torch_dtype"] = torch_dtype
    return real


# ---------------------------------------------------------------------------
# Random weights
# ---------------------------------------------------------------------------


def make_weights(config, rng):
    """Random float64 tensors {HF name: array} for a (small) config of any family.

    Matrices N(0, (c / sqrt(fan_in))^2) with c as tests/hf_fixture.py chooses it (q.k
    neither uniform nor one-hot, residual branches comparable to the embedding, logits
    std ~2, the same embedding matrix for Gemma, whose sqrt(hidden) multiplier makes the
    residual stream's embedding part larger than the branches); Llama-style norm weights
    1 + 0.1 N(0, 1), Gemma's (1 + w) norms w = 0.1 N; Qwen2's biases 0.5 N (large enough to matter). Gemma 2 scales q and k up (c 6) so
    that the attention soft-cap bites (without it the nll moves by ~3e-3; without the
    final cap by ~7e-2, test_family_reference.py checks both).
    """
    c = _text(config)
    fam = c["model_type"]
    dim, hidden = c["hidden_size"], c["intermediate_size"]
    H, KV = c["num_attention_heads"], c["num_key_value_heads"]
    hd = c.get("head_dim") or dim // H
    gemma = fam in GEMMA
    qk = 6.0 if fam == "gemma2" else 1.4
    logit = 2.0

    def mat(out_f, in_f, s):
        return rng.normal(0.0, s / np.sqrt(in_f), size=(out_f, in_f))

    def norm(n):
        return 0.1 * rng.normal(size=n) + (0.0 if gemma else 1.0)

    w = {"model.embed_tokens.weight": mat(c["vocab_size"], dim, logit)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(dim)
        q, k, v = mat(H * hd, dim, qk), mat(KV * hd, dim, qk), mat(KV * hd, dim, 1.0)
        if fam == "phi3":
            w[p + "self_attn.qkv_proj.weight"] = np.concatenate([q, k, v])
        else:
            w[p + "self_attn.q_proj.weight"] = q
            w[p + "self_attn.k_proj.weight"] = k
            w[p + "self_attn.v_proj.weight"] = v
        if fam == "qwen2":
            w[p + "self_attn.q_proj.bias"] = 0.5 * rng.normal(size=H * hd)
            w[p + "self_attn.k_proj.bias"] = 0.5 * rng.normal(size=KV * hd)
            w[p + "self_attn.v_proj.bias"] = 0.5 * rng.normal(size=KV * hd)
        if fam in ("qwen3", "gemma3_text"):
            w[p + "self_attn.q_norm.weight"] = norm(hd)
            w[p + "self_attn.k_norm.weight"] = norm(hd)
        w[p + "self_attn.o_proj.weight"] = mat(dim, H * hd, 0.5)
        w[p + "post_attention_layernorm.weight"] = norm(dim)
        if fam in ("gemma2", "gemma3_text"):
            w[p + "pre_feedforward_layernorm.weight"] = norm(dim)
            w[p + "post_feedforward_layernorm.weight"] = norm(dim)
        gate, up = mat(hidden, dim, 1.0), mat(hidden, dim, 1.0)
        if fam == "phi3":
            w[p + "mlp.gate_up_proj.weight"] = np.concatenate([gate, up])
        else:
            w[p + "mlp.gate_proj.weight"] = gate
            w[p + "mlp.up_proj.weight"] = up
        w[p + "mlp.down_proj.weight"] = mat(dim, hidden, 0.5)
    w["model.norm.weight"] = norm(dim)
    if not c.get("tie_word_embeddings", config.get("tie_word_embeddings", True)):
        w["lm_head.weight"] = mat(c["vocab_size"], dim, logit)
    if config.get("model_type") == "gemma3":  # multimodal layout: the text model's prefix
        w = {("language_model." + n): a for n, a in w.items()}
    return w


def write_checkpoint(out_dir, name, dtype="F32", seed=None, config=None, **shrink_kw):
    """Write model `name`'s small checkpoint (or `config`, a dict from shrink()) to out_dir:
    config.json and model.safetensors, weights float32 ("F32") or bf16 ("BF16").
    Returns (config, tensors), tensors float64 equal to the stored values."""
    if config is None:
        config = shrink(name, dtype=dtype, **shrink_kw)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    if seed is None:  # a different model per name (Gemma-3-270M and -1B shrink alike)
        seed = list(REAL_CONFIGS).index(name) if name in REAL_CONFIGS else 0
    raw = make_weights(config, np.random.default_rng(seed))
    tensors = {n: hf_fixture.round_to_dtype(a, dtype) for n, a in raw.items()}
    hf_fixture.write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors, dtype)
    return config, tensors
