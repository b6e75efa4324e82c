#!/usr/bin/env python3
"""export.py: write checkpoints in this project's "ROPE" format (see docs/format.md).

    export.py MODEL_DIR out.bin [--rope-theta F] [--rope-fraction F] [--dtype T] [--legacy]
        a Hugging Face Llama (or Mistral) directory: config.json plus
        model.safetensors or a sharded model.safetensors.index.json
    export.py CHECKPOINT.bin out.bin [--rope-theta F] [--rope-fraction F] [--dtype T] [--legacy]
        a llama2.c checkpoint (legacy or "version 1") or a ROPE file (version 1 or 2)
    export.py --tokenizer tokenizer.model -o tokenizer.bin
        a SentencePiece model to llama2.c's tokenizer.bin
    export.py --tokenizer tokenizer.json -o tok.bin [--template NAME]
        a Hugging Face tokenizer.json (with the tokenizer_config.json and
        generation_config.json beside it), or a model directory's tokenizer, to a
        standalone tokenizer section ("TOKN", docs/format.md)

A Hugging Face directory's tokenizer (tokenizer.json, else tokenizer.model) is written
into the checkpoint (ROPE version 2), so that run needs no -z; without one the weights
are written alone. --template NAME (none, llama2, llama3, chatml, gemma, zephyr,
mistral, qwen2.5, smollm2) overrides the chat template recognised from tokenizer_config.json.

--rope-theta and --rope-fraction replace the stored theta and p (for example for a
model that was trained with p-RoPE); --legacy writes llama2.c's legacy format instead.

Weight types. The matrices and the token embedding keep the type the source stores
them in: a Hugging Face model in BF16 gives a bf16 file, one in F16 an f16 file (ROPE
version 2: half the bytes, and run.c computes in float32 what the float32 file of the
widened weights computes); F32 sources, llama2.c files and --legacy give float32
(version 1, as before). --dtype f32|bf16|f16|q8_0|q4_0 chooses: widening is exact; narrowing
(f32 to bf16 or f16, or between the 16-bit types) rounds to nearest even, is said on
stderr, and a value that would overflow the narrower type is refused. q8_0 is GGUF's
8-bit block (32 weights: an f16 scale and 32 int8), quantized as llama.cpp's
quantize_row_q8_0_ref does; q4_0 its 4-bit block (an f16 scale and 32 nibbles), as
quantize_row_q4_0_ref does; every row length must be a multiple of 32. GGUF's other blocks
(Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) are copied from a GGUF file as they are, never
requantized, and widened exactly as llama.cpp's dequantize_row_* does. The norms are
always float32. A ROPE file with a type per matrix piece (weight_type 4, its type table)
keeps each piece's type and bytes unless --dtype asks for one type; write_rope with
weight_type None writes such a file from pieces of several types (Blocks: a piece as stored,
as a GGUF converter copies it).

RoPE scaling. A Hugging Face config's rope_scaling (transformers 4.x) or
rope_parameters (5.x) of rope_type "linear", "yarn" or "llama3" is stored as the
header's scaling rule (bytes 52..83: the factor, the rule, the original length and
the rule's parameters), read as transformers' modeling_rope_utils.py reads them;
"proportional"'s factor is the linear rule; "longrope" is rule 5 of version 2, its
factors a tensor. "dynamic" and yarn with truncate false are refused. A ROPE file's rule is carried through unchanged;
--legacy refuses a file with a rule. Writing more than 100 MB shows a progress line.

This file uses only NumPy and the standard library: it reads safetensors and the
SentencePiece protobuf by hand, so it also documents those formats. Every failure
is one line on stderr, "export.py: error: ...", with exit code 1 for bad input and
2 for a bad command line.

Rotary layouts. A Hugging Face checkpoint rotates dim i of a head together with
dim i + head_dim/2 ("rotate_half"); run.c rotates adjacent pairs (2i, 2i+1). Both
give the same attention scores when the rows of wq and wk are reordered per head:
new row 2i <- old row i, new row 2i+1 <- old row i + head_dim/2. llama2.c's own
checkpoints are already in the adjacent-pair layout and are copied unchanged.

Gemma 4 (model_type gemma4: its text_config, the weights under model.language_model., the
vision and audio towers left out; or gemma4_text) is written with docs/format.md's per-layer
records (head size, KV heads, width, KV sharing, k = v), v norm, layer scalars and per-layer
inputs: the full layers' proportional RoPE is the first setting (p-RoPE over global_head_dim),
the sliding layers' the second. On k = v layers the values are wk's permuted rows, so wo's
columns are permuted per head the same way; 26B-A4B's experts (enable_moe_block) beside each
feed-forward. Bidirectional attention "all" and attention biases are refused, and so is a
config.json that contradicts the tensors (per-layer inputs, experts or the full layers' v_proj
present where it says none, or the reverse; head sizes other than the checkpoint's; a null
sliding_window with sliding layers); a key it does not give takes Gemma4TextConfig's published
default, with a note.
"""

import argparse
import collections
import copy
import dataclasses
import functools
import itertools
import json
import math
import mmap
import os
import re
import struct
import sys
import time
import unicodedata

EXIT_BAD_INPUT = 1  # the input files (or the output path) are unusable
EXIT_BAD_USAGE = 2  # the command line is wrong

try:
    import numpy as np
except ImportError:
    sys.exit(f"export.py: error: this Python ({sys.executable}) has no NumPy; run export.py with one that has")

ROPE_MAGIC = 0x45504F52  # the bytes "ROPE", read as a little-endian uint32
ROPE_VERSION = 1  # float32 weights
ROPE_VERSION_2 = 2  # a weight_type field, tensors at multiples of 64 bytes, the tokenizer section
# the header's weight_type codes (and the type table's entries); 4 is no type (below)
WEIGHT_TYPE_CODES = {"f32": 0, "bf16": 1, "f16": 2, "q8_0": 3, "q4_0": 5, "q4_1": 6, "q5_0": 7, "q5_1": 8,
                     "q4_k": 9, "q5_k": 10, "q6_k": 11}
WEIGHT_TYPES = list(WEIGHT_TYPE_CODES)
WEIGHT_TYPE_NAMES = {code: name for name, code in WEIGHT_TYPE_CODES.items()}
WEIGHT_TYPE_PER_PIECE = 4  # the header's weight_type of a file whose type table gives each matrix piece's type
WEIGHT_TYPES_LISTED = ", ".join(f"{code} {name}" for name, code in WEIGHT_TYPE_CODES.items())
TENSOR_ALIGNMENT = 64  # version 2: every tensor starts at a multiple of this from the file's start
# the tensors stored in the weight type (the norms are always float32)
MATRIX_TENSORS = {"token_embedding", "wq", "wk", "wv", "wo", "w1", "w2", "w3", "wcls",
                  # Gemma 4's per-layer inputs (bit 5)
                  "per_layer_embedding", "per_layer_projection_in", "per_layer_gate", "per_layer_projection_out",
                  # a mixture of experts' (bit 6)
                  "router", "expert_w1", "expert_w2", "expert_w3"}
# version 2's block options (bytes 112..151): block_flags, activation, embedding_multiplier,
# attention_scale, attention_softcap, final_softcap, layer_table_offset, layer_table_bytes
ROPE_V2_BLOCK = struct.Struct("<Ii4f2Q")
# the second RoPE setting (bytes 152..191): the first's fields from rope_theta on, in the
# header's order: theta, fraction, factor, rule, original length, the five rule fields
ROPE_V2_SECOND = struct.Struct("<3f2i5f")
FLAG_QKV_BIAS, FLAG_QK_NORM, FLAG_POST_NORMS = 1, 2, 4
FLAG_V_NORM, FLAG_LAYER_SCALARS, FLAG_PER_LAYER_INPUTS = 8, 16, 32  # Gemma 4
FLAG_EXPERTS = 64  # a mixture of experts (Qwen3-MoE, Mixtral)
KNOWN_FLAGS = 127  # the bits above; run.c refuses a file with any other
# the header's routing codes (byte 212): softmax over the experts, the top k, renormalized
# over them (Mixtral; Qwen3-MoE with norm_topk_prob) or not (Qwen3-MoE without); Gemma 4's
# (renormalized, times a per-expert scale, the experts beside the feed-forward)
ROUTING_SOFTMAX_TOPK_NORM, ROUTING_SOFTMAX_TOPK, ROUTING_GEMMA4 = 1, 2, 3
# bytes 200..215: n_experts, n_experts_used, expert_hidden, routing
ROPE_V2_EXPERTS = struct.Struct("<4i")
EXPERTS_BYTES_AT = 200
ACTIVATIONS = ["swiglu", "geglu-tanh"]  # the header's activation codes 0, 1
LAYER_NOPE, LAYER_ROPE_FIRST, LAYER_ROPE_SECOND = 0, 1, 2  # the per-layer table's rope field
LAYER_RECORD = struct.Struct("<2i")  # per layer: rope, window (0: full attention)
# Gemma 4's records: rope, window, head_size, n_kv_heads, hidden_dim (0: the header's), kv_source
# (0: its own cache; s + 1: layer s's), values (1: the values are the key projection), experts
# (1: the layer's feed-forward is the mixture of experts; 0 without block flag 64)
LAYER_RECORD_WIDE = struct.Struct("<8i")
# bytes 216..231: type_table_offset and type_table_bytes (uint64; weight_type 4 only, else 0)
ROPE_V2_TYPE_TABLE = struct.Struct("<2Q")
TYPE_TABLE_BYTES_AT = 216
# bytes 192..199: per_layer_input_dim (int32), per_layer_embedding_multiplier (float32)
ROPE_V2_PER_LAYER = struct.Struct("<if")
PER_LAYER_BYTES_AT = 192
LLAMA2C_MAGIC = 0x616B3432  # "ak42": llama2.c's version 1 and 2 exports
LLAMA2C_VERSION = 1  # float32; llama2.c's version 2 is int8-quantized
HEADER_BYTES = 256  # ROPE and llama2.c version 1 headers are zero-padded to this
# magic, version, dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len,
# shared_classifier, norm_eps, rope_theta, rope_fraction, rope_factor (bytes 0..55,
# docs/format.md), then the scaling rule (bytes 56..83): rope_scaling, rope_original_len,
# yarn_beta_fast, yarn_beta_slow, rope_attention_factor, llama3_low_freq_factor,
# llama3_high_freq_factor. Bytes 84..255 are reserved (zero) in version 1.
ROPE_HEADER = struct.Struct("<Ii8i4f2i5f")
# version 2, bytes 84..111: head_size (0: dim / n_heads), weight_type, reserved, and the
# uint64 tokenizer_offset and tokenizer_bytes (0, 0: no tokenizer); 112..255 reserved (zero)
ROPE_V2_FIELDS = struct.Struct("<3i2Q")
# magic, version, the seven sizes, a uint8 shared-classifier flag (llama2.c's export.py)
LLAMA2C_V1_HEADER = struct.Struct("<Ii7iB")
# dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size (< 0: unshared classifier), seq_len
LEGACY_HEADER = struct.Struct("<7i")

LLAMA2C_THETA = 10000.0  # what llama2.c's checkpoints were trained with
LLAMA2C_NORM_EPS = 1e-5
HF_DEFAULTS = {  # transformers' LlamaConfig defaults for keys a config.json may omit
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "max_position_embeddings": 2048,
    "hidden_act": "silu",
}
@dataclasses.dataclass(frozen=True)
class Family:
    """What one model family's checkpoints add to Llama's block, and where they keep it: the
    functions that read a checkpoint (check_architecture, hf_config, hf_layers, hf_experts,
    read_hf) ask a family's record instead of testing its model_type. A record says what the
    family is, not where it is read from: config.json's keys today, GGUF's metadata later."""
    architecture: str               # config.json's architectures entry (transformers' class)
    gguf: str                       # the architecture's name in GGUF (llama.cpp's general.architecture)
    head_dim: bool = False          # config.json's head_dim may differ from hidden_size / num_attention_heads
    qkv_bias: bool = False          # the q, k and v projections carry biases (o_proj none)
    qk_norm: bool = False           # an RMSNorm over each query and key head before RoPE
    activation: str = "swiglu"      # ACTIVATIONS' name; "geglu-tanh": config.json's hidden_activation is checked
    gemma_block: bool = False       # norms x * (1 + w) (1 + w is stored), the embedding times sqrt(hidden_size)
    post_norms: bool = False        # four norms a layer, query_pre_attn_scalar and the two soft-caps
    sliding: str = None             # which layers sliding_window applies to (the rules below)
    local_rope: bool = False        # the sliding layers rotate with rope_local_base_freq (the second setting)
    nope_layers: bool = False       # no_rope_layers marks the layers that do not rotate
    fused: dict = None              # {ROPE name: (the fused tensor in model.layers.{i}., which band of its rows)}
    experts: str = None             # config.json's number of experts (a mixture of experts)
    expert_hidden: str = None       # config.json's width of one expert
    dense_layers: bool = False      # decoder_sparse_step and mlp_only_layers leave some layers a feed-forward,
    #                                 and norm_topk_prob says whether the chosen weights are renormalized
    expert_tensors: dict = None     # the router's and experts' names in model.layers.{i}. (expert e's under
    #                                 EXPERTS.{e}.)
    layer_records: bool = False     # Gemma 4's per-layer records: read by read_gemma4, which sets its block itself
    multimodal: str = None          # the model_type of the multimodal config.json that nests it in text_config
    inherited: tuple = ()           # the keys text_config takes from the whole config.json where it has none


# Family.sliding, which layers config.json's sliding_window applies to (hf_layers):
#   None: none (the key is not read); "all": every layer; "max_window_layers": with
#   use_sliding_window, the layers from max_window_layers on; "refused": use_sliding_window true
#   is refused; "alternate", "pattern": layer_types when given, else every other layer from
#   layer 0 ("alternate") or all but every sliding_window_pattern-th ("pattern")

GEMMA_BLOCK = dict(head_dim=True, activation="geglu-tanh", gemma_block=True)  # Gemma 1, 2 and 3 alike

# The families export.py reads, by config.json's model_type (in the order its refusals list them)
FAMILIES = {
    # Llama 2 and 3, TinyLlama, SmolLM2: the spine the others add to
    "llama": Family("LlamaForCausalLM", "llama", head_dim=True),
    # Mistral 7B; NeMo gives a head_dim of its own (32 heads of 128 in a hidden_size of 5120)
    "mistral": Family("MistralForCausalLM", "llama", head_dim=True, sliding="all"),
    # Qwen2, Qwen2.5
    "qwen2": Family("Qwen2ForCausalLM", "qwen2", qkv_bias=True, sliding="max_window_layers"),
    # Qwen3 (0.6B: 16 heads of 128 with hidden_size 1024)
    "qwen3": Family("Qwen3ForCausalLM", "qwen3", head_dim=True, qk_norm=True, sliding="max_window_layers"),
    # SmolLM3-3B: every fourth layer NoPE
    "smollm3": Family("SmolLM3ForCausalLM", "smollm3", sliding="refused", nope_layers=True),
    # Gemma 2B, 7B
    "gemma": Family("GemmaForCausalLM", "gemma", **GEMMA_BLOCK),
    # Gemma 2
    "gemma2": Family("Gemma2ForCausalLM", "gemma2", **GEMMA_BLOCK, post_norms=True, sliding="alternate"),
    # Gemma 3 270M and 1B; 4B and larger nest it in a gemma3 config.json (the text model only)
    "gemma3_text": Family("Gemma3ForCausalLM", "gemma3", **GEMMA_BLOCK, qk_norm=True, post_norms=True,
                          sliding="pattern", local_rope=True, multimodal="gemma3", inherited=("torch_dtype", "dtype")),
    # Phi-3, Phi-4-mini: qkv_proj's rows are q, then k, then v; gate_up_proj's the gate (w1), then up (w3)
    "phi3": Family("Phi3ForCausalLM", "phi3", sliding="all",
                   fused={"wq": ("self_attn.qkv_proj.weight", 0), "wk": ("self_attn.qkv_proj.weight", 1),
                          "wv": ("self_attn.qkv_proj.weight", 2), "w1": ("mlp.gate_up_proj.weight", 0),
                          "w3": ("mlp.gate_up_proj.weight", 1)}),
    # Gemma 4 E2B, E4B, 31B and 26B-A4B (its experts): gemma4_config reads the rest
    "gemma4_text": Family("Gemma4ForCausalLM", "gemma4", activation="geglu-tanh", experts="num_experts",
                          expert_hidden="moe_intermediate_size", layer_records=True, multimodal="gemma4",
                          inherited=("torch_dtype", "dtype", "tie_word_embeddings")),
    # Qwen3-30B-A3B
    "qwen3_moe": Family("Qwen3MoeForCausalLM", "qwen3moe", head_dim=True, qk_norm=True, sliding="max_window_layers",
                        experts="num_experts", expert_hidden="moe_intermediate_size", dense_layers=True,
                        expert_tensors={"router": "mlp.gate.weight", "experts": "mlp.experts",
                                        "expert_w1": "gate_proj.weight", "expert_w2": "down_proj.weight",
                                        "expert_w3": "up_proj.weight"}),
    # Mixtral 8x7B
    "mixtral": Family("MixtralForCausalLM", "llama", head_dim=True, sliding="all", experts="num_local_experts",
                      expert_hidden="intermediate_size",
                      expert_tensors={"router": "block_sparse_moe.gate.weight", "experts": "block_sparse_moe.experts",
                                      "expert_w1": "w1.weight", "expert_w2": "w2.weight", "expert_w3": "w3.weight"}),
}


def family_of(model_type):
    """The family of a config.json's model_type (none given: Llama's, transformers' default), or
    None for one export.py does not read."""
    if model_type is None:
        return FAMILIES["llama"]
    return FAMILIES.get(model_type) if isinstance(model_type, str) else None


def nested_family(model_type):
    """The model_type of the text model a multimodal config.json (Gemma 3 4B and larger, Gemma 4)
    nests in its text_config, or None."""
    for name, family in FAMILIES.items():
        if family.multimodal is not None and family.multimodal == model_type:
            return name
    return None


# Gemma's activations: run.c computes the tanh GELU only. transformers runs hidden_activation
# as written ("gelu" is the exact erf GELU there, so it is refused); without one, Gemma 1's
# hidden_act "gelu" becomes gelu_pytorch_tanh (GemmaMLP's legacy path, as gemma_pytorch runs it)
# and Gemma 2 and 3 ignore hidden_act
GEMMA_ACTIVATIONS = {"gelu", "gelu_pytorch_tanh"}
DTYPE_NAMES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}  # config.json's torch_dtype
INT32_MAX = 2**31 - 1
# run.c's limits on the header (validate_config): a file beyond them would be written and then refused
RUN_LIMITS = {"dim": 1 << 16, "hidden_dim": 1 << 20, "n_layers": 1024, "vocab_size": 1 << 22, "seq_len": 1 << 20,
              "n_experts": 1024, "n_experts_used": 64}
MIN_VOCAB = 3  # run.c needs the ids of <unk>, <s> and </s>
MAX_ATTENTION_FACTOR = 100.0  # run.c's MAX_ROPE_ATTENTION_FACTOR: the scores scale by its square
FLT_MAX = float(np.finfo(np.float32).max)
MAX_LLAMA2C_PIECE_BYTES = 1024  # run.c's limit on llama2.c's max_token_length

# The header's rope_scaling codes. 0 with rope_factor != 1 is linear too (files before the rule field).
RULE_NONE, RULE_LINEAR, RULE_NTK, RULE_YARN, RULE_LLAMA3, RULE_LONGROPE = range(6)
RULE_NAMES = ["none", "linear", "ntk", "yarn", "llama3", "longrope"]  # longrope: version 2 (a factors tensor)
# The rule parameters after rope_original_len: (field, the only rule it may be non-zero for, or
# None for any rule, what 0 stands for)
RULE_FIELDS = [
    ("yarn_beta_fast", RULE_YARN, 32.0),
    ("yarn_beta_slow", RULE_YARN, 1.0),
    ("rope_attention_factor", None, None),  # default: the rule's own (yarn 0.1 ln s + 1, others 1)
    ("llama3_low_freq_factor", RULE_LLAMA3, 1.0),
    ("llama3_high_freq_factor", RULE_LLAMA3, 4.0),
]
# the second RoPE setting's fields, in ROPE_V2_SECOND's order, and what each is when Config.rope2
# does not give it (p 1, factor 1, no rule, the trained length and the rule fields 0: their defaults)
ROPE2_FIELDS = ["rope_theta", "rope_fraction", "rope_factor", "rope_scaling", "rope_original_len"] + [
    name for name, _, _ in RULE_FIELDS]
ROPE2_DEFAULTS = dict(zip(ROPE2_FIELDS[1:], [1.0, 1.0, RULE_NONE, 0] + [0.0] * len(RULE_FIELDS)))
PROGRESS_BYTES = 100_000_000  # writing a bigger file shows a progress line on stderr


INPUTS = []  # every file this run reads: no output may replace one (check_not_an_input)


def reading(path):
    """path, remembered as an input (see check_not_an_input)."""
    INPUTS.append(path)
    return path


class ExportError(Exception):
    """A problem with the input: reported as one line, exit code EXIT_BAD_INPUT."""


class FlagError(ExportError):
    """A flag's value that the model refuses (found after reading it): one line, exit code EXIT_BAD_USAGE."""


LATER = []  # stderr lines kept until the export succeeds: a refusal is its error line alone


def say_later(message):
    """Keep an "export.py: ..." line for stderr until the export has succeeded (main prints it)."""
    LATER.append(f"export.py: {message}")


def say_now():
    """Print the lines say_later kept."""
    for line in LATER:
        print(line, file=sys.stderr)
    LATER.clear()


def warn(message):
    """A warning line for stderr, printed once the export has succeeded."""
    say_later(f"warning: {message}")


def f32(x):
    """x rounded to float32, the precision the header stores (inf when too large, even an integer
    beyond a double's range)."""
    try:
        x = float(x)
    except OverflowError:
        x = math.inf if x > 0 else -math.inf
    with np.errstate(over="ignore"):
        return float(np.float32(x))


def show(x):
    """Short text for the float32 value of x: "%g" when that reads back exactly."""
    value = f32(x)
    text = f"{value:g}"
    return text if f32(float(text)) == value else str(np.float32(value))


# ----------------------------------------------------------------------------
# The model: a header (Config) and its tensors, in the order the README gives


class Config:
    """The header fields of a ROPE file (docs/format.md), with the rotary settings."""

    def __init__(self, dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size,
                 seq_len, shared_classifier, norm_eps, rope_theta=LLAMA2C_THETA,
                 rope_fraction=1.0, rope_factor=1.0, rope_scaling=RULE_NONE, rope_original_len=0,
                 **rule_fields):
        self.dim = dim                      # model width
        self.hidden_dim = hidden_dim        # feed-forward width
        self.n_layers = n_layers
        self.n_heads = n_heads              # query heads
        self.n_kv_heads = n_kv_heads        # key/value heads (divides n_heads)
        self.vocab_size = vocab_size
        self.seq_len = seq_len              # context length
        self.shared_classifier = shared_classifier  # True: wcls is the token embedding
        self.norm_eps = norm_eps            # RMSNorm epsilon
        self.rope_theta = rope_theta        # base wavelength theta
        self.rope_fraction = rope_fraction  # p: floor(p * head_dim / 2) pairs rotate
        # the scaling rule: rope_scaling (RULE_NONE .. RULE_LLAMA3), rope_factor (its s; 1:
        # none), rope_original_len (the trained length L; 0: seq_len), and RULE_FIELDS (0:
        # the rule's default)
        self.set_scaling(rope_scaling, rope_factor, rope_original_len, **rule_fields)
        # version 2's block options (docs/format.md); these defaults are the Llama block
        self.head_size = 0            # 0: dim / n_heads
        self.qkv_bias = False         # q, k, v biases (Qwen2)
        self.qk_norm = False          # per-head q/k RMSNorm before RoPE (Qwen3)
        self.post_norms = False       # post-attention and post-feed-forward norms (Gemma 2, 3)
        self.activation = 0           # 0 SwiGLU, 1 GeGLU with the tanh GELU
        self.embedding_multiplier = 0.0  # 0: 1
        self.attention_scale = 0.0    # 0: 1 / sqrt(head_size)
        self.attention_softcap = 0.0  # 0: none
        self.final_softcap = 0.0      # 0: none
        self.layers = None            # per layer (rope, window), or None: every layer rotates, full attention;
        #                               Gemma 4: per layer the eight fields of LAYER_RECORD_WIDE
        self.rope2 = None             # the second RoPE setting: {"rope_theta": theta, and any other of
        #                               ROPE2_FIELDS it gives (else ROPE2_DEFAULTS)}, or None
        self.v_norm = False           # Gemma 4: a weightless RMSNorm over each value head
        self.layer_scalars = False    # Gemma 4: the residual stream times a scalar after each layer
        self.per_layer_dim = 0        # Gemma 4 E2B / E4B: P, the width of each layer's input slice (0: none)
        self.per_layer_multiplier = 0.0  # with P: the per-layer embedding row's multiplier
        self.n_experts = 0            # a mixture of experts (block flag 64): experts per layer (0: none)
        self.n_experts_used = 0       # k, the experts a token uses
        self.expert_hidden = 0        # each expert's feed-forward width
        self.routing = 0              # ROUTING_SOFTMAX_TOPK_NORM, ROUTING_SOFTMAX_TOPK or ROUTING_GEMMA4
        self.gemma_norms = False      # export only: the source's norms are x * (1 + w)
        self.longrope_factors = None  # longrope: [short, long], rotated-pairs floats each (the tensor rope_factors)

    @property
    def head_dim(self):
        """Width of one attention head."""
        return self.head_size or self.dim // self.n_heads

    @property
    def block_flags(self):
        return (FLAG_QKV_BIAS * self.qkv_bias | FLAG_QK_NORM * self.qk_norm | FLAG_POST_NORMS * self.post_norms
                | FLAG_V_NORM * self.v_norm | FLAG_LAYER_SCALARS * self.layer_scalars
                | FLAG_PER_LAYER_INPUTS * bool(self.per_layer_dim) | FLAG_EXPERTS * bool(self.n_experts))

    @property
    def wide_records(self):
        """True when the per-layer table holds Gemma 4's eight-field records."""
        return self.layers is not None and len(self.layers[0]) == 8

    def needs_block_fields(self):
        """Whether the file needs version 2's block fields (a Llama block with no table does not)."""
        return bool(self.head_size or self.block_flags or self.activation or self.embedding_multiplier
                    or self.attention_scale or self.attention_softcap or self.final_softcap
                    or self.layers is not None or self.rope2 is not None or self.rope_scaling == RULE_LONGROPE
                    or self.per_layer_dim or self.n_experts)

    @property
    def rule(self):
        """The scaling rule in force (rope_scaling 0 with a factor != 1 is linear, as older files meant)."""
        if self.rope_scaling == RULE_NONE and f32(self.rope_factor) != 1:
            return RULE_LINEAR
        return self.rope_scaling

    def set_scaling(self, rule=RULE_NONE, factor=1.0, original_len=0, **rule_fields):
        """Set the scaling rule and its parameters; the parameters not given are 0 (default)."""
        self.rope_scaling, self.rope_factor, self.rope_original_len = rule, factor, original_len
        for name, _, _ in RULE_FIELDS:
            setattr(self, name, rule_fields.pop(name, 0.0))
        if rule_fields:
            raise TypeError(f"unknown rule fields {sorted(rule_fields)}")

    def check(self):
        """Refuse sizes that cannot describe a model, or that run.c does not load (RUN_LIMITS)."""
        sizes = ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len")
        for name in sizes:
            value = getattr(self, name)
            if not 0 < value <= INT32_MAX:
                raise ExportError(f"{name} {value} must be a positive int32")
            if value > RUN_LIMITS.get(name, INT32_MAX):
                raise ExportError(f"{name} {value} is above run.c's limit of {RUN_LIMITS[name]}")
        if self.vocab_size < MIN_VOCAB:
            raise ExportError(f"vocab_size {self.vocab_size} is below {MIN_VOCAB}: run.c needs the ids of <unk>, "
                              "<s> and </s>")
        if self.n_heads > self.dim:  # possible with an explicit head_dim (Qwen3, Gemma)
            raise ExportError(f"n_heads {self.n_heads} (num_attention_heads) is above dim {self.dim} (hidden_size): "
                              "run.c's limit")
        if self.dim % self.n_heads and not self.head_size:
            raise ExportError(f"dim {self.dim} is not a multiple of n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ExportError(f"n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")
        why = head_size_problem(self.head_dim, self.n_heads)
        if why:
            raise ExportError(f"head_dim {self.head_dim}: {why}")
        if not (math.isfinite(f32(self.norm_eps)) and f32(self.norm_eps) > 0):
            raise ExportError(f"norm_eps {self.norm_eps} must be finite and > 0 (in float32, as it is stored)")
        check_rope_values(self)
        check_block_values(self)


def head_size_problem(head_size, n_heads):
    """Why a head size cannot be stored, or None: run.c's limits (validate_config, parse_layer_table)."""
    if head_size < 2 or head_size % 2:
        return "a head size must be even and at least 2 (RoPE rotates pairs of dimensions)"
    if n_heads * head_size > RUN_LIMITS["dim"]:
        return f"n_heads {n_heads} heads of it are above run.c's limit of {RUN_LIMITS['dim']} wide"
    return None


def check_block_values(c):
    """Refuse version 2's block options as run.c's parse_header_v2 refuses them: a float option is
    0 (its default) or finite and > 0 in float32; one that rounds to 0 would silently read as the
    default. The second RoPE setting (theta only, no rule) is checked as the first is."""
    if not 0 <= c.activation < len(ACTIVATIONS):
        raise ExportError(f"activation {c.activation} is not one of 0 swiglu, 1 geglu-tanh")
    for name in ("embedding_multiplier", "attention_scale", "attention_softcap", "final_softcap"):
        value = getattr(c, name)
        if value and not (value > 0 and math.isfinite(f32(value)) and f32(value) > 0):
            raise ExportError(f"{name} {value} must be finite and > 0 in float32 (0: the default)")
    if c.n_experts:
        check_experts(c)
    if c.layers is not None:
        check_layer_records(c)
    if c.rope2 is not None:
        second = second_setting(c)
        try:
            check_rope_values(second)
        except ExportError as e:
            raise ExportError(f"the second RoPE setting: {e}")
        if second.rope_scaling == RULE_LONGROPE or (second.rope_scaling == RULE_NONE and f32(second.rope_factor) != 1):
            raise ExportError(f"the second RoPE setting: rope_scaling {second.rope_scaling} with rope_factor "
                              f"{show(second.rope_factor)}: longrope is the first setting's only, and the factor of "
                              "no rule is 1 (run.c refuses the rest)")
    if c.rope_scaling == RULE_LONGROPE and c.longrope_factors is not None:  # (a ROPE file's: once mapped)
        shape = np.shape(c.longrope_factors)
        if shape != (2, rotated_pairs(c)):
            raise ExportError(f"longrope needs 2 x {rotated_pairs(c)} factors (short, long), not {shape}")
    if c.per_layer_dim and not (1 <= c.per_layer_dim <= RUN_LIMITS["dim"]
                                and c.n_layers * c.per_layer_dim <= RUN_LIMITS["hidden_dim"]):
        raise ExportError(f"per_layer_input_dim {c.per_layer_dim} must be in [1, {RUN_LIMITS['dim']}] with n_layers "
                          f"{c.n_layers} x it at most {RUN_LIMITS['hidden_dim']} (run.c's limits)")
    if c.per_layer_dim and not (c.per_layer_multiplier > 0 and math.isfinite(f32(c.per_layer_multiplier))):
        raise ExportError(f"per_layer_embedding_multiplier {c.per_layer_multiplier} must be finite and > 0")


def check_experts(c):
    """Refuse a mixture of experts' fields as run.c's parse_experts refuses them."""
    if not 1 <= c.n_experts <= RUN_LIMITS["n_experts"]:
        raise ExportError(f"n_experts {c.n_experts} must be in [1, {RUN_LIMITS['n_experts']}] (run.c's limit)")
    if not 1 <= c.n_experts_used <= min(c.n_experts, RUN_LIMITS["n_experts_used"]):
        raise ExportError(f"n_experts_used {c.n_experts_used} must be in [1, n_experts {c.n_experts}] and at most "
                          f"{RUN_LIMITS['n_experts_used']} (run.c's limit)")
    if not 1 <= c.expert_hidden <= RUN_LIMITS["hidden_dim"]:
        raise ExportError(f"expert_hidden {c.expert_hidden} must be in [1, {RUN_LIMITS['hidden_dim']}]")
    if c.routing not in (ROUTING_SOFTMAX_TOPK_NORM, ROUTING_SOFTMAX_TOPK, ROUTING_GEMMA4):
        raise ExportError(f"routing {c.routing} is not 1 (softmax, top-k, renormalized), 2 (softmax, top-k) or 3 "
                          "(Gemma 4's)")


def check_layer_records(c):
    """Refuse the per-layer records, (rope, window) or Gemma 4's eight fields, as run.c's
    parse_layer_table refuses them."""
    rope2_head = None
    for l, record in enumerate(c.layers):
        rope, window, head_size, kv_heads, hidden, source, values, experts = (tuple(record) + (0,) * 8)[:8]
        where = f"layer {l}"
        if experts not in ((0, 1) if c.n_experts else (0,)) or (experts and hidden and c.routing != ROUTING_GEMMA4):
            raise ExportError(f"{where}: experts {experts} (with hidden_dim {hidden}) out of range")
        if rope not in (LAYER_NOPE, LAYER_ROPE_FIRST, LAYER_ROPE_SECOND) or (rope == LAYER_ROPE_SECOND and c.rope2 is None):
            raise ExportError(f"{where}: rope {rope} is not a setting of this file")
        if window < 0 or values not in (0, 1):
            raise ExportError(f"{where}: window {window} or values {values} out of range")
        if head_size and head_size_problem(head_size, c.n_heads):
            raise ExportError(f"{where}: head_size {head_size}: {head_size_problem(head_size, c.n_heads)}")
        if kv_heads and (kv_heads < 1 or c.n_heads % kv_heads):
            raise ExportError(f"{where}: n_kv_heads {kv_heads} does not divide n_heads {c.n_heads}")
        if hidden and not 1 <= hidden <= RUN_LIMITS["hidden_dim"]:
            raise ExportError(f"{where}: hidden_dim {hidden} is above run.c's limit of {RUN_LIMITS['hidden_dim']}")
        if not 0 <= source <= l:
            raise ExportError(f"{where}: kv_source {source} must be 0 or an earlier layer + 1")
    shapes = layer_shapes(c)
    for l, s in enumerate(shapes):
        if s.source != l:
            src = shapes[s.source]
            if src.source != s.source or s.values or (src.rope, src.window, src.head_size, src.n_kv_heads) != (
                    s.rope, s.window, s.head_size, s.n_kv_heads):
                raise ExportError(f"layer {l}: its kv_source layer {s.source} shares a cache itself, or differs in "
                                  "rope, window, head_size or n_kv_heads")
        if s.rope == LAYER_ROPE_FIRST and s.head_size != c.head_dim:
            raise ExportError(f"layer {l}: head_size {s.head_size}, but the first RoPE setting's layers have the "
                              f"header's {c.head_dim}")
        if s.rope == LAYER_ROPE_SECOND:
            if rope2_head is not None and s.head_size != rope2_head:
                raise ExportError(f"layer {l}: head_size {s.head_size}, but the second RoPE setting's layers have "
                                  f"{rope2_head}")
            rope2_head = s.head_size


def second_setting(c):
    """A Config whose first RoPE setting is c's second one (ROPE2_FIELDS), over the head size of the
    layers that use it (Gemma 4's sliding layers: head_dim; else the header's), for the checks."""
    second, fields = copy.copy(c), {**ROPE2_DEFAULTS, **c.rope2}
    second.rope_theta, second.rope_fraction = fields["rope_theta"], fields["rope_fraction"]
    second.set_scaling(fields["rope_scaling"], fields["rope_factor"], fields["rope_original_len"],
                       **{name: fields[name] for name, _, _ in RULE_FIELDS})
    second.head_size = next((s.head_size for s in layer_shapes(c) if s.rope == LAYER_ROPE_SECOND), c.head_dim)
    second.rope2 = second.longrope_factors = second.layers = None
    return second


def check_rope_values(c):
    """Refuse rotary settings that the ROPE format does not allow (docs/format.md)."""
    theta, fraction, factor = f32(c.rope_theta), f32(c.rope_fraction), f32(c.rope_factor)
    if not (math.isfinite(theta) and theta > 0):
        raise ExportError(f"rope_theta {c.rope_theta} must be finite and > 0 (in float32)")
    if not 0 <= fraction <= 1:
        raise ExportError(f"rope_fraction {c.rope_fraction} must be in [0, 1]")
    if not (is_int(c.rope_scaling) and 0 <= c.rope_scaling < len(RULE_NAMES)):
        raise ExportError(f"rope_scaling {c.rope_scaling} is not a rule (0 none, 1 linear, 2 ntk, 3 yarn, 4 llama3, 5 longrope)")
    if not (math.isfinite(factor) and factor >= 1):
        raise ExportError(f"rope_factor {c.rope_factor} must be finite and >= 1 (in float32): every rule stretches "
                          "positions; run.c refuses a factor below 1")
    if not (is_int(c.rope_original_len) and 0 <= c.rope_original_len <= RUN_LIMITS["seq_len"]):
        raise ExportError(f"rope_original_len {c.rope_original_len} must be in [0, {RUN_LIMITS['seq_len']}] "
                          "(0: seq_len; run.c's limit)")
    for name, owner, _ in RULE_FIELDS:
        value = f32(getattr(c, name))
        if not (math.isfinite(value) and value >= 0):
            raise ExportError(f"{name} {getattr(c, name)} must be finite and >= 0 (0: the default)")
        if getattr(c, name) and not value:
            raise ExportError(f"{name} {getattr(c, name)} is 0 in float32, which the format reads as the default")
        if value and owner is not None and c.rope_scaling != owner:
            raise ExportError(f"{name} is {show(value)}, but it belongs to {RULE_NAMES[owner]} and the rule is "
                              f"{RULE_NAMES[c.rope_scaling]} (it must be 0)")
    if c.rope_scaling == RULE_LLAMA3:
        defaults = {name: default for name, _, default in RULE_FIELDS}
        low = f32(c.llama3_low_freq_factor) or defaults["llama3_low_freq_factor"]
        high = f32(c.llama3_high_freq_factor) or defaults["llama3_high_freq_factor"]
        if not high > low:
            raise ExportError(f"llama3_high_freq_factor {show(high)} must be > llama3_low_freq_factor {show(low)}")
    if c.rope_scaling == RULE_YARN:
        defaults = {name: default for name, _, default in RULE_FIELDS}
        fast = f32(c.yarn_beta_fast) or defaults["yarn_beta_fast"]
        slow = f32(c.yarn_beta_slow) or defaults["yarn_beta_slow"]
        if fast < slow:
            raise ExportError(f"yarn_beta_fast {show(fast)} is below yarn_beta_slow {show(slow)}: the rule would "
                              "divide the fast pairs and keep the slow ones (run.c refuses it)")
    if f32(c.rope_attention_factor) > MAX_ATTENTION_FACTOR:
        raise ExportError(f"rope_attention_factor {show(c.rope_attention_factor)} must be at most "
                          f"{MAX_ATTENTION_FACTOR:g} (the attention scores are multiplied by its square; run.c's limit)")
    check_rope_angles(c)


def rotated_pairs(c):
    """floor(p * head_dim / 2) as run.c's rope_angles_of counts it (p as float32, plus 1e-4 of a pair)."""
    return min(math.floor(f32(c.rope_fraction) * (c.head_dim // 2) + 1e-4), c.head_dim // 2)


def check_rope_angles(c):
    """Refuse a theta (or longrope factor) so small that a rotated pair's angle overflows float32
    in run.c's tables.

    omega_i = theta^(-2i/head_dim) grows with i when theta < 1; run.c refuses a file
    where (seq_len - 1) * omega_i is not finite in float32 for a rotated pair i. The
    scaling rules only lower frequencies (ntk raises the base), so the unscaled ones
    bound them, except longrope, which divides omega_i by its factor for pair i: a factor
    below 1 raises it (both sets are checked: run picks one by the context in use). Checked
    in logarithms with a margin of 2, so that float32 rounding in run.c cannot tip a file
    written here over its limit.
    """
    theta, pairs = f32(c.rope_theta), rotated_pairs(c)
    limit, log_last = math.log(FLT_MAX / 2), math.log(max(c.seq_len - 1, 1))
    if pairs < 1:
        return
    i = pairs - 1
    if theta < 1 and log_last - 2 * i / c.head_dim * math.log(theta) >= limit:
        raise ExportError(f"rope_theta {show(theta)} is too small: pair {i} would turn through an angle beyond "
                          f"float32's range by position {c.seq_len - 1} (run.c refuses it)")
    if c.rope_scaling != RULE_LONGROPE or c.longrope_factors is None:
        return
    for name, factors in zip(("short_factor", "long_factor"), c.longrope_factors):
        for i in range(min(pairs, len(factors))):
            factor = f32(factors[i])
            if not (math.isfinite(factor) and factor > 0):
                raise ExportError(f"longrope {name}[{i}] {factors[i]} must be finite and > 0 in float32")
            if log_last - 2 * i / c.head_dim * math.log(theta) - math.log(factor) >= limit:
                raise ExportError(f"longrope {name}[{i}] {float(factors[i]):g} is too small: pair {i}'s frequency divided "
                                  f"by it turns through an angle beyond float32's range by position {c.seq_len - 1} "
                                  "(run.c refuses it)")


def describe_rope(c):
    """The scaling rule in words, for the summary line: "none", "yarn x4 (original 32)", ..."""
    rule = c.rule
    if rule == RULE_NONE:
        text = "none"
    else:
        text = f"{RULE_NAMES[rule]} x{show(c.rope_factor)}"
    details = [f"original {c.rope_original_len}"] if c.rope_original_len else []
    labels = {"yarn_beta_fast": "beta_fast", "yarn_beta_slow": "beta_slow",
              "rope_attention_factor": "attention factor", "llama3_low_freq_factor": "low_freq_factor",
              "llama3_high_freq_factor": "high_freq_factor"}
    details += [f"{labels[name]} {show(getattr(c, name))}" for name, _, _ in RULE_FIELDS if getattr(c, name)]
    return f"{text} ({', '.join(details)})" if details else text


LayerShape = collections.namedtuple("LayerShape", "rope window head_size n_kv_heads hidden_dim source values experts")


def layer_shapes(c):
    """Per layer, its LayerShape: the table's fields with 0 resolved to the header's; source is the
    layer whose keys and values it attends over (itself when kv_source is 0)."""
    out = []
    for l in range(c.n_layers):
        record = tuple(c.layers[l]) if c.layers is not None else (LAYER_ROPE_FIRST, 0)
        rope, window, head_size, kv_heads, hidden, source, values, experts = (record + (0,) * 8)[:8]
        experts = experts if len(record) == 8 else int(bool(c.n_experts))  # no table: every layer has them
        beside = c.routing == ROUTING_GEMMA4  # Gemma 4: the experts beside the feed-forward
        out.append(LayerShape(rope, window, head_size or c.head_dim, kv_heads or c.n_kv_heads,
                              0 if experts and not beside else hidden or c.hidden_dim, source - 1 if source else l,
                              values, experts))
    return out


def gemma4_shapes(c):
    """Tensors 21 to 27 (docs/format.md), each when its flag is set."""
    L, dim, P = c.n_layers, c.dim, c.per_layer_dim
    shapes = [("layer_scalars", (L,))] if c.layer_scalars else []
    if P:
        shapes += [("per_layer_embedding", (c.vocab_size, L * P)), ("per_layer_projection_in", (L * P, dim)),
                   ("per_layer_projection_norm", (P,)), ("per_layer_gate", (L, P, dim)),
                   ("per_layer_projection_out", (L, dim, P)), ("rms_per_layer", (L, dim))]
    return shapes


def check_block_rows(c, kind="q8_0"):
    """Refuse q8_0 (or q4_0) for a model with a matrix row that is not whole 32-weight blocks (as run
    does): GGUF's blocks have no partial block, and a file holds one weight type."""
    rows = {"dim": c.dim, "per_layer_input_dim": c.per_layer_dim or 0, "expert_hidden": c.expert_hidden or 0}
    for l, s in enumerate(layer_shapes(c)):
        rows[f"layer {l}'s q_dim"] = c.n_heads * s.head_size
        rows[f"layer {l}'s hidden_dim"] = s.hidden_dim
    for what, n in rows.items():
        if not_whole_blocks(kind, n):
            raise ExportError(f"--dtype {kind} needs every row a multiple of {BLOCK_KINDS[kind].weights} weights, "
                              f"and {what} is {n} "
                              "(export it as --dtype bf16 or f32)")


def tensor_shapes(c):
    """[(name, shape)] of every tensor of a ROPE file, in file order (docs/format.md). A layered
    tensor is (n_layers, rows[, cols]) when the layers are alike; with per-layer records that give
    the layers shapes of their own (Gemma 4), the layers' pieces back to back, one flat run."""
    L, dim = c.n_layers, c.dim
    layers = layer_shapes(c)
    own = [s for l, s in enumerate(layers) if s.source == l]  # the layers with their own k and v

    def layered(pieces):
        # stacked when the layers are alike (with experts on some layers only, all but w1, w2, w3)
        if not c.wide_records or (c.n_experts and len(pieces) == L and all(p == pieces[0] for p in pieces)):
            return (L,) + pieces[0]
        return (sum(math.prod(p) for p in pieces),)

    q = [c.n_heads * s.head_size for s in layers]
    kv = [s.n_kv_heads * s.head_size for s in own]
    v = [s.n_kv_heads * s.head_size for s in own if not s.values]
    shapes = [
        ("token_embedding", (c.vocab_size, dim)),
        ("rms_att", (L, dim)),
        ("wq", layered([(n, dim) for n in q])),
        ("wk", layered([(n, dim) for n in kv])),
        ("wv", layered([(n, dim) for n in v])),
        ("wo", layered([(dim, n) for n in q])),
        ("rms_ffn", (L, dim)),
        ("w1", layered([(s.hidden_dim, dim) for s in layers])),  # gate
        ("w2", layered([(dim, s.hidden_dim) for s in layers])),  # down
        ("w3", layered([(s.hidden_dim, dim) for s in layers])),  # up
        ("rms_final", (dim,)),
    ]
    if not c.shared_classifier:
        shapes.append(("wcls", (c.vocab_size, dim)))
    # version 2's optional tensors, after version 1's, in this order (float32)
    if c.qkv_bias:
        shapes += [("bq", layered([(n,) for n in q])), ("bk", layered([(n,) for n in kv])),
                   ("bv", layered([(n,) for n in v]))]
    if c.qk_norm:
        shapes += [("q_norm", layered([(s.head_size,) for s in layers])),
                   ("k_norm", layered([(s.head_size,) for s in own]))]
    if c.post_norms:
        shapes += [("rms_post_att", (L, dim)), ("rms_post_ffn", (L, dim))]
    if c.rope_scaling == RULE_LONGROPE:
        shapes.append(("rope_factors", (2, rotated_pairs(c))))
    return shapes + gemma4_shapes(c) + expert_shapes(c, layers)


def expert_shapes(c, layers):
    """Tensors 28 to 31 (bit 6): for the S layers with experts, the router and each expert's
    gate, down and up, the layers' pieces stacked."""
    if not c.n_experts:
        return []
    S, E, H, dim = sum(s.experts for s in layers), c.n_experts, c.expert_hidden, c.dim
    shapes = [("router", (S, E, dim)), ("expert_w1", (S, E, H, dim)), ("expert_w2", (S, E, dim, H)),
              ("expert_w3", (S, E, H, dim))]
    if c.routing == ROUTING_GEMMA4:  # tensors 32 to 36
        shapes += [("router_scale", (S, dim)), ("expert_scale", (S, E)), ("rms_pre_experts", (S, dim)),
                   ("rms_post_dense", (S, dim)), ("rms_post_experts", (S, dim))]
    return shapes


def matrix_piece_shapes(c):
    """{name: [shape of each piece]} of the matrices, in file order, which is the type table's
    order (docs/format.md): one piece for the embedding, the classifier (unless shared) and Gemma 4's
    per-layer embedding and input projection; one per layer for wq wk wv wo w1 w2 w3 and Gemma 4's
    per_layer_gate and per_layer_projection_out (a layer without such a matrix: a piece of 0 rows);
    one per layer with experts for the router and the three expert tensors."""
    L, dim, P = c.n_layers, c.dim, c.per_layer_dim
    layers = layer_shapes(c)
    q = [c.n_heads * s.head_size for s in layers]
    kv = [s.n_kv_heads * s.head_size if s.source == l else 0 for l, s in enumerate(layers)]
    v = [0 if s.values else n for s, n in zip(layers, kv)]
    shapes = {"token_embedding": [(c.vocab_size, dim)], "wq": [(n, dim) for n in q], "wk": [(n, dim) for n in kv],
              "wv": [(n, dim) for n in v], "wo": [(dim, n) for n in q],
              "w1": [(s.hidden_dim, dim) for s in layers], "w2": [(dim, s.hidden_dim) for s in layers],
              "w3": [(s.hidden_dim, dim) for s in layers]}
    if not c.shared_classifier:
        shapes["wcls"] = [(c.vocab_size, dim)]
    if P:
        shapes.update(per_layer_embedding=[(c.vocab_size, L * P)], per_layer_projection_in=[(L * P, dim)],
                      per_layer_gate=[(P, dim)] * L, per_layer_projection_out=[(dim, P)] * L)
    if c.n_experts:
        S, E, H = sum(s.experts for s in layers), c.n_experts, c.expert_hidden
        shapes.update(router=[(E, dim)] * S, expert_w1=[(E, H, dim)] * S, expert_w2=[(E, dim, H)] * S,
                      expert_w3=[(E, H, dim)] * S)
    return shapes


def n_floats(shapes):
    """Total number of floats in a list of (name, shape)."""
    return sum(math.prod(shape) for _, shape in shapes)


# ----------------------------------------------------------------------------
# Reading flat float32 files: ROPE, llama2.c version 1, llama2.c legacy


def map_floats(path, offset, shapes):
    """{name: float32 view into the file} for tensors stored back to back from offset."""
    data = np.memmap(path, dtype="<f4", mode="r", offset=offset)
    tensors, start = {}, 0
    for name, shape in shapes:
        count = math.prod(shape)
        tensors[name] = data[start:start + count].reshape(shape)
        start += count
    return tensors


def check_padding(path, data, start, end=HEADER_BYTES, why="a newer format?"):
    """Refuse a 256-byte header whose padding (reserved bytes, or the fields of an option the file does
    not have) is not all zero."""
    if any(data[start:end]):
        raise ExportError(f"{path}: header bytes {start}..{end - 1} are not all zero ({why})")


def file_bytes(path, offset, count):
    """count bytes of a file from offset, or None when the file ends before them."""
    if offset + count > os.path.getsize(path):
        return None
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(count)


def check_size(path, what, expected):
    """Refuse a file whose size is not what its header implies."""
    actual = os.path.getsize(path)
    if actual != expected:
        raise ExportError(f"{path}: {what} header implies {expected} bytes, but the file has {actual}")


WHOLE_MATRICES = {"token_embedding", "wcls", "per_layer_embedding", "per_layer_projection_in"}  # one piece each


def map_aligned(path, c, weight_type, piece_types=None):
    """{name: view into a version 2 file}: the tensors where rope_layout, which writes them,
    places them (each at the next multiple of 64 bytes, the matrices in weight_type, the norms
    float32). With a type table (piece_types, weight_type None) each matrix piece is a Blocks of
    its type, kept as it is: a layered matrix the list of its pieces (one per layer, or per layer
    with experts), the others one Blocks. Returns (tensors, the file size they imply)."""
    data = np.memmap(path, dtype=np.uint8, mode="r")
    layout, end, _ = rope_layout(c, weight_type, ROPE_VERSION_2, piece_types)
    tensors = {}
    for name, shape, kind, at in layout:
        nbytes = tensor_bytes(kind, math.prod(shape))
        if at + nbytes > len(data):
            continue
        if piece_types is not None and name in piece_types:
            pieces = tensors.setdefault(name, [])
            try:
                pieces.append(Blocks(kind, shape, data[at:at + nbytes], f"{path}: {name} piece {len(pieces)}"))
            except ExportError as e:  # a block piece whose rows are not whole blocks
                raise ExportError(f"{e} (the type table gives it {kind})")
            if name in WHOLE_MATRICES:
                tensors[name] = pieces[0]
        elif kind == "q8_0":  # read back as its dequantized weights (exact in float32)
            tensors[name] = dequantize_q8_0(data[at:at + nbytes]).reshape(shape)
        elif kind in BLOCK_KINDS:  # kept as stored (widened exactly when another type is asked for)
            tensors[name] = Blocks(kind, shape, data[at:at + nbytes], f"{path}: {name}")
        else:
            tensors[name] = data[at:at + nbytes].view(np.dtype(NUMPY_STORAGE[kind])).reshape(shape)
    return tensors, end


def read_rope_v2_fields(path, data, c):
    """Set c's version 2 fields (bytes 84..255, docs/format.md: head_size, the block options, the second
    RoPE setting, the per-layer inputs' and the experts' fields), refused as run.c's parse_header_v2
    refuses them; Config.check checks their values. Returns (the matrices' type, None for a type per
    piece, (the tokenizer section's offset, bytes), (the per-layer table's offset, bytes), (the type
    table's offset, bytes))."""
    head_size, type_code, reserved, tok_offset, tok_bytes = ROPE_V2_FIELDS.unpack_from(data, ROPE_HEADER.size)
    if reserved != 0:
        raise ExportError(f"{path}: the reserved field at byte 92 is {reserved}, not 0")
    if type_code not in WEIGHT_TYPE_NAMES and type_code != WEIGHT_TYPE_PER_PIECE:
        raise ExportError(f"{path}: weight_type {type_code} is not one of {WEIGHT_TYPES_LISTED}, 4 per piece")
    type_table = ROPE_V2_TYPE_TABLE.unpack_from(data, TYPE_TABLE_BYTES_AT)
    table_as_it_must_be = all(type_table) if type_code == WEIGHT_TYPE_PER_PIECE else not any(type_table)
    if not table_as_it_must_be:
        raise ExportError(f"{path}: weight_type {type_code} with type_table_offset {type_table[0]} and "
                          f"type_table_bytes {type_table[1]} (a type table: weight_type 4 and both not 0; else both 0)")
    (flags, c.activation, c.embedding_multiplier, c.attention_scale, c.attention_softcap, c.final_softcap,
     table_offset, table_bytes) = ROPE_V2_BLOCK.unpack_from(data, ROPE_HEADER.size + ROPE_V2_FIELDS.size)
    if flags & ~KNOWN_FLAGS:
        raise ExportError(f"{path}: block_flags {flags:#x} has bits this format does not define")
    c.head_size = head_size
    c.qkv_bias, c.qk_norm, c.post_norms, c.v_norm, c.layer_scalars = (
        bool(flags & flag) for flag in (FLAG_QKV_BIAS, FLAG_QK_NORM, FLAG_POST_NORMS, FLAG_V_NORM, FLAG_LAYER_SCALARS))
    second = dict(zip(ROPE2_FIELDS, ROPE_V2_SECOND.unpack_from(data, PER_LAYER_BYTES_AT - ROPE_V2_SECOND.size)))
    if second["rope_theta"]:
        c.rope2 = second
    else:
        check_padding(path, data, PER_LAYER_BYTES_AT - ROPE_V2_SECOND.size, PER_LAYER_BYTES_AT,
                      "a second RoPE setting's fields, but rope2_theta is 0: none")
    for flag, at, fields, names in ((FLAG_PER_LAYER_INPUTS, PER_LAYER_BYTES_AT, ROPE_V2_PER_LAYER,
                                     ("per_layer_dim", "per_layer_multiplier")),
                                    (FLAG_EXPERTS, EXPERTS_BYTES_AT, ROPE_V2_EXPERTS,
                                     ("n_experts", "n_experts_used", "expert_hidden", "routing"))):
        if flags & flag:
            for name, value in zip(names, fields.unpack_from(data, at)):
                setattr(c, name, value)
        else:
            check_padding(path, data, at, at + fields.size, f"fields of block flag {flag}, which is not set")
    if c.block_flags != flags:  # bit 5 or 6 with a width of 0
        raise ExportError(f"{path}: block_flags {flags:#x}, but per_layer_input_dim is {c.per_layer_dim} and "
                          f"n_experts {c.n_experts} (each must be >= 1 with its bit, 32 and 64)")
    check_padding(path, data, TYPE_TABLE_BYTES_AT + ROPE_V2_TYPE_TABLE.size)
    weight_type = None if type_code == WEIGHT_TYPE_PER_PIECE else WEIGHT_TYPE_NAMES[type_code]
    return weight_type, (tok_offset, tok_bytes), (table_offset, table_bytes), type_table


def read_type_table(path, c, offset, count):
    """The type table's entries as {name: [type of each piece]} of matrix_piece_shapes; its place is
    checked by the caller once the tensors' end is known."""
    shapes = matrix_piece_shapes(c)
    pieces = sum(len(s) for s in shapes.values())
    if count != pieces:
        raise ExportError(f"{path}: type_table_bytes {count} is not {pieces}, one per matrix piece of this model")
    table = file_bytes(path, offset, count)
    if table is None:
        raise ExportError(f"{path}: the type table ({count} bytes at {offset}) runs past the end of the file")
    if any(code not in WEIGHT_TYPE_NAMES for code in table):
        i = next(i for i, code in enumerate(table) if code not in WEIGHT_TYPE_NAMES)
        raise ExportError(f"{path}: type table entry {i} is {table[i]}, not one of {WEIGHT_TYPES_LISTED}")
    kinds, at = {}, 0
    for name, piece_shapes in shapes.items():
        kinds[name] = [WEIGHT_TYPE_NAMES[code] for code in table[at:at + len(piece_shapes)]]
        at += len(piece_shapes)
    return kinds


def read_layer_table(path, c, offset, count):
    """The per-layer table's records (docs/format.md: two int32 per layer, or Gemma 4's eight), or
    None when the header gives none (offset and bytes 0); checked by Config.check, its place by the
    caller once the tensors' end is known."""
    if offset == 0 and count == 0:
        return None
    sizes = {LAYER_RECORD.size * c.n_layers: LAYER_RECORD, LAYER_RECORD_WIDE.size * c.n_layers: LAYER_RECORD_WIDE}
    record = sizes.get(count) if c.n_layers >= 1 else None
    if record is None:
        raise ExportError(f"{path}: layer_table_bytes {count} is not 8 x n_layers {c.n_layers} (or 32 x it)")
    table = file_bytes(path, offset, count)
    if table is None:
        raise ExportError(f"{path}: the per-layer table ({count} bytes at {offset}) runs past the end of the file")
    return [record.unpack_from(table, l * record.size) for l in range(c.n_layers)]


def read_rope(path, data):
    """Read a ROPE file (docs/format.md), version 1 or 2, every field and section a version 2 file
    has: (Config, tensors, the matrices' type, its tokenizer section's bytes or None). A file with a
    type table (weight_type 4) gives the type None, and each matrix piece as a Blocks (map_aligned)."""
    (_, version, dim, hidden, layers, heads, kv_heads, vocab, seq_len, shared,
     eps, theta, fraction, factor, rule, original_len, *rule_values) = ROPE_HEADER.unpack_from(data)
    if version not in (ROPE_VERSION, ROPE_VERSION_2):
        raise ExportError(f"{path}: ROPE version {version} is not supported (only {ROPE_VERSION} and "
                          f"{ROPE_VERSION_2})")
    if shared not in (0, 1):
        raise ExportError(f"{path}: shared_classifier is {shared}, expected 0 or 1")
    c = Config(dim, hidden, layers, heads, kv_heads, vocab, seq_len, bool(shared), eps, theta, fraction, factor,
               rule, original_len, **{name: value for (name, _, _), value in zip(RULE_FIELDS, rule_values)})
    weight_type, (tok_offset, tok_bytes), table, type_table = "f32", (0, 0), (0, 0), (0, 0)
    if version == ROPE_VERSION_2:
        weight_type, (tok_offset, tok_bytes), table, type_table = read_rope_v2_fields(path, data, c)
        c.layers = read_layer_table(path, c, *table)
    else:
        check_padding(path, data, ROPE_HEADER.size)
    try:
        c.check()
    except ExportError as e:
        raise ExportError(f"{path}: {e}")
    shapes = tensor_shapes(c)
    if version == ROPE_VERSION:
        check_size(path, "ROPE", HEADER_BYTES + 4 * n_floats(shapes))
        return c, map_floats(path, HEADER_BYTES, shapes), weight_type, None
    piece_types = read_type_table(path, c, *type_table) if weight_type is None else None
    tensors, end = map_aligned(path, c, weight_type, piece_types)
    tensors_end = end
    if c.rope_scaling == RULE_LONGROPE and "rope_factors" in tensors:  # the factors, checked as run checks them
        c.longrope_factors = tensors["rope_factors"]
        try:
            c.check()
        except ExportError as e:
            raise ExportError(f"{path}: {e}")
    if c.layers is not None:
        if table != layer_table_place(c, end):
            raise ExportError(f"{path}: the per-layer table is at {table[0]} ({table[1]} bytes); the format puts it "
                              f"at {layer_table_place(c, end)[0]}, the first multiple of 64 after the tensors")
        end = sum(table)
    if piece_types is not None:
        if type_table != type_table_place(c, tensors_end):
            raise ExportError(f"{path}: the type table is at {type_table[0]} ({type_table[1]} bytes); the format puts "
                              f"it at {type_table_place(c, tensors_end)[0]}, the first multiple of 64 after the "
                              "tensors (and the per-layer table)")
        end = sum(type_table)
    tokenizer = None
    if tok_offset or tok_bytes:
        if tok_offset != end + -end % TENSOR_ALIGNMENT or tok_bytes < TOKN_HEADER_BYTES:
            raise ExportError(f"{path}: tokenizer section at {tok_offset} ({tok_bytes} bytes); the format puts it at "
                              f"{end + -end % TENSOR_ALIGNMENT}, at least {TOKN_HEADER_BYTES} bytes")
        end = tok_offset + tok_bytes
    check_size(path, f"ROPE version 2 ({weight_type or 'a type per piece'})", end)
    if tok_bytes:
        tokenizer = file_bytes(path, tok_offset, tok_bytes)
        magic, _, _, n_tokens = struct.unpack_from("<I3i", tokenizer)
        if magic != TOKN_MAGIC or not 0 < n_tokens <= c.vocab_size:
            raise ExportError(f"{path}: the tokenizer section is not a TOKN section of at most {c.vocab_size} tokens")
    return c, tensors, weight_type, tokenizer


def read_llama2c_v1(path, data):
    """Read llama2.c's "version 1" export: (Config, tensors).

    Header: uint32 magic, int32 version, seven int32 (dim, hidden_dim, n_layers,
    n_heads, n_kv_heads, vocab_size, seq_len), uint8 shared-classifier flag, zeros
    to byte 256. Tensors: the norms first (all rms_att, all rms_ffn, rms_final),
    then token_embedding, wq, wk, wv, wo, w1, w2, w3, and wcls when not shared.
    """
    _, version, dim, hidden, layers, heads, kv_heads, vocab, seq_len, shared = LLAMA2C_V1_HEADER.unpack_from(data)
    if version != LLAMA2C_VERSION:
        raise ExportError(f"{path}: llama2.c version {version} is not supported (only the float32 version 1)")
    if shared not in (0, 1):
        raise ExportError(f"{path}: shared-classifier flag is {shared}, expected 0 or 1")
    check_padding(path, data, LLAMA2C_V1_HEADER.size)
    c = Config(dim, hidden, layers, heads, kv_heads, vocab, seq_len, bool(shared), LLAMA2C_NORM_EPS)
    c.check()
    shapes = dict(tensor_shapes(c))
    order = ["rms_att", "rms_ffn", "rms_final", "token_embedding",
             "wq", "wk", "wv", "wo", "w1", "w2", "w3"] + ([] if c.shared_classifier else ["wcls"])
    file_shapes = [(name, shapes[name]) for name in order]
    check_size(path, "llama2.c version 1", HEADER_BYTES + 4 * n_floats(file_shapes))
    return c, map_floats(path, HEADER_BYTES, file_shapes), "f32"


def legacy_shapes(c):
    """[(name, shape)] of llama2.c's legacy format: ROPE's order plus its freq_cis tables."""
    shapes = tensor_shapes(c)
    at = [name for name, _ in shapes].index("rms_final") + 1
    tables = [("freq_cis_real", (c.seq_len, c.head_dim // 2)), ("freq_cis_imag", (c.seq_len, c.head_dim // 2))]
    return shapes[:at] + tables + shapes[at:]


def read_llama2c_legacy(path, data):
    """Read llama2.c's legacy export: (Config, tensors).

    Header: seven int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads,
    vocab_size, seq_len); a negative vocab_size means a separate classifier.
    Tensors as in ROPE, with freq_cis_real and freq_cis_imag (seq_len, head_dim/2)
    after rms_final; the tables are skipped (run.c computes its own angles).
    """
    dim, hidden, layers, heads, kv_heads, vocab, seq_len = LEGACY_HEADER.unpack_from(data)
    c = Config(dim, hidden, layers, heads, kv_heads, abs(vocab), seq_len, vocab > 0, LLAMA2C_NORM_EPS)
    try:
        c.check()
    except ExportError as e:
        raise ExportError(f"{path}: not a ROPE, llama2.c or Hugging Face checkpoint (as a legacy llama2.c header: {e})")
    shapes = legacy_shapes(c)
    check_size(path, "llama2.c legacy", LEGACY_HEADER.size + 4 * n_floats(shapes))
    tensors = map_floats(path, LEGACY_HEADER.size, shapes)
    del tensors["freq_cis_real"], tensors["freq_cis_imag"]
    return c, tensors, "f32"


def read_flat_checkpoint(path):
    """Read a ROPE or llama2.c checkpoint file, telling the format by its first bytes.

    Returns (Config, tensors, the matrices' stored type (None: a type per piece), the tokenizer
    section's bytes or None)."""
    with open(reading(path), "rb") as f:
        data = f.read(HEADER_BYTES)
    if len(data) < LEGACY_HEADER.size:
        raise ExportError(f"{path}: only {len(data)} bytes: too short for any checkpoint header")
    magic = struct.unpack_from("<I", data)[0]
    if magic in (ROPE_MAGIC, LLAMA2C_MAGIC) and len(data) < HEADER_BYTES:
        raise ExportError(f"{path}: truncated {HEADER_BYTES}-byte header")
    if magic == ROPE_MAGIC:
        return read_rope(path, data)
    if magic == LLAMA2C_MAGIC:
        return (*read_llama2c_v1(path, data), None)
    return (*read_llama2c_legacy(path, data), None)


# ----------------------------------------------------------------------------
# Reading safetensors (by hand)
#
#   u64 little-endian N | N bytes of JSON header | data
#   header: {name: {"dtype": "BF16", "shape": [rows, cols], "data_offsets": [begin, end]},
#            "__metadata__": {...}}, offsets relative to the start of the data.

SAFETENSORS_ITEMSIZE = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2,
    "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}
FLOAT_DTYPES = {"F32": "<f4", "F16": "<f2", "BF16": "<u2"}  # BF16 kept as raw uint16 bits
MAX_HEADER_BYTES = 100 * 2**20  # the safetensors library's own limit


class Safetensors:
    """One .safetensors file: its validated header, and its data mapped read-only."""

    def __init__(self, path):
        self.path = reading(path)
        size = os.path.getsize(path)
        if size < 8:
            raise ExportError(f"{path}: truncated safetensors file ({size} bytes)")
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > size - 8 or n > MAX_HEADER_BYTES:
                raise ExportError(f"{path}: safetensors header length {n} runs past the end of the {size}-byte file")
            header = f.read(n)
        try:
            entries = json.loads(header)
        except (ValueError, UnicodeDecodeError) as e:
            raise ExportError(f"{path}: safetensors header is not valid JSON ({e})")
        if not isinstance(entries, dict):
            raise ExportError(f"{path}: safetensors header is not a JSON object")
        entries.pop("__metadata__", None)
        self.data_start, self.data_size = 8 + n, size - 8 - n
        for name, entry in entries.items():
            self.check_entry(name, entry)
        self.check_layout(entries)
        self.entries = entries
        self.data = np.memmap(path, dtype=np.uint8, mode="r")

    def check_entry(self, name, entry):
        """Refuse a header entry with an unknown dtype, a bad shape or bad offsets."""
        where = f"{self.path}: tensor {name}"
        if not isinstance(entry, dict):
            raise ExportError(f"{where}: header entry is not an object")
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if dtype not in SAFETENSORS_ITEMSIZE:
            raise ExportError(f"{self.path}: unknown dtype {dtype} for tensor {name}")
        if not (isinstance(shape, list) and all(is_int(d) and d >= 0 for d in shape)):
            raise ExportError(f"{where}: bad shape {shape}")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(is_int(o) for o in offsets)):
            raise ExportError(f"{where}: bad data_offsets {offsets}")
        begin, end = offsets
        if not 0 <= begin <= end <= self.data_size:
            raise ExportError(f"{where}: data_offsets [{begin}, {end}] lie outside the "
                              f"{self.data_size} bytes of data (truncated file?)")
        expected = math.prod(shape) * SAFETENSORS_ITEMSIZE[dtype]
        if end - begin != expected:
            raise ExportError(f"{where}: {end - begin} bytes for shape {shape} of {dtype}, expected {expected}")

    def check_layout(self, entries):
        """Refuse data that the tensors do not tile exactly, as the safetensors format requires.

        Sorted by offset, each tensor starts where the previous one ends, the first at 0,
        and the last ends at the end of the file: an overlap would make one tensor a copy
        of another's bytes, and a gap or trailing bytes are data no tensor names.
        """
        end, previous = 0, None
        for name, entry in sorted(entries.items(), key=lambda item: tuple(item[1]["data_offsets"])):
            begin, stop = entry["data_offsets"]
            if begin < end:
                raise ExportError(f"{self.path}: tensors {previous} and {name} overlap (data_offsets [{begin}, "
                                  f"{stop}] start before {end}, where {previous} ends)")
            if begin > end:
                raise ExportError(f"{self.path}: {begin - end} bytes before tensor {name} belong to no tensor "
                                  f"(data_offsets [{begin}, {stop}]; the format has no gaps)")
            end, previous = stop, name
        if end != self.data_size:
            raise ExportError(f"{self.path}: {self.data_size - end} bytes after the last tensor's data belong to no "
                              "tensor (the format has no trailing bytes)")

    def raw(self, name):
        """(dtype, array of the stored values) of a float tensor, without copying."""
        entry = self.entries[name]
        dtype = entry["dtype"]
        if dtype not in FLOAT_DTYPES:
            raise ExportError(f"{self.path}: tensor {name} has dtype {dtype}; only F32, F16 and BF16 are supported")
        begin, end = entry["data_offsets"]
        start = self.data_start + begin
        values = self.data[start:self.data_start + end].view(FLOAT_DTYPES[dtype])
        return dtype, values.reshape(entry["shape"])


def is_int(x):
    """True for a JSON integer (bool is not one)."""
    return isinstance(x, int) and not isinstance(x, bool)


def to_float32(dtype, values):
    """Stored F32, F16 or BF16 values as float32 (BF16 is the upper half of a float32)."""
    if dtype == "BF16":
        return (values.astype(np.uint32) << 16).view(np.float32)
    return values.astype(np.float32, copy=False)


# Arrays of weights travel in their stored type: float32, float16, or uint16 holding
# bf16 bits (NumPy has no bfloat16).
SAFETENSORS_TYPES = {"F32": "f32", "BF16": "bf16", "F16": "f16"}
NUMPY_STORAGE = {"f32": "<f4", "bf16": "<u2", "f16": "<f2"}
LARGEST_FINITE = {"bf16": 3.3895313892515355e38, "f16": 65504.0}

# Block types (GGUF's blocks, byte for byte; ggml-common.h's block_* structs, docs/format.md):
# each run of `weights` weights along a row is one block of `storage.itemsize` bytes holding f16
# scales and packed integers; the weight is a product of them, exactly as llama.cpp's
# dequantize_row_* computes it in float32. `scales` names the f16 fields that must be finite.
# Only q8_0 and q4_0 are ever quantized here (quantize_row_*_ref); the others are copied as stored.
Q8_0_BLOCK = 32
Q8_0_STORAGE = np.dtype([("d", "<f2"), ("qs", "i1", (Q8_0_BLOCK,))])  # 34 bytes, unpadded
QK_K = 256  # the K-quants' super-block
BlockKind = collections.namedtuple("BlockKind", "ggml weights storage scales dequantize")


def block_dtype(*fields):
    """A packed (unaligned) structured dtype: numpy's default for a list of fields."""
    return np.dtype(list(fields))


def _nibbles(qs):
    """(low nibbles, high nibbles) of uint8 bytes, as int32."""
    qs = qs.astype(np.int32)
    return qs & 0xF, qs >> 4


def dequantize_q8_0(data):
    """Q8_0 blocks (bytes or a structured array) as their float32 weights d * q, exactly."""
    blocks = np.asarray(data).view(Q8_0_STORAGE)
    return (blocks["d"].astype(np.float32)[:, None] * blocks["qs"].astype(np.float32)).reshape(-1)


def _legacy_blocks(b, offset, with_min, fifth_bit):
    """dequantize_row_q4_0 / q4_1 / q5_0 / q5_1: the low nibbles are weights 0..15, the high ones
    16..31; Q5's fifth bit of weight j is bit j of qh (a little-endian uint32). x*d (Q4_0, Q5_0:
    x - 8 or x - 16 first) or x*d + m, in float32 (x*d is exact: one rounding at most)."""
    lo, hi = _nibbles(b["qs"])
    x = np.concatenate([lo, hi], axis=1)
    if fifth_bit:
        x |= ((b["qh"].astype(np.int64)[:, None] >> np.arange(32)) & 1).astype(np.int32) << 4
    y = (x - offset).astype(np.float32) * b["d"].astype(np.float32)[:, None]
    if with_min:
        y = y + b["m"].astype(np.float32)[:, None]
    return y.reshape(-1)


def scale_min_k4(scales):
    """get_scale_min_k4 for j = 0..7 of each block: (sc, m), each (blocks, 8) int32, 6 bits."""
    q = scales.astype(np.int32)
    sc = np.concatenate([q[:, 0:4] & 63, (q[:, 8:12] & 0xF) | ((q[:, 0:4] >> 6) << 4)], axis=1)
    m = np.concatenate([q[:, 4:8] & 63, (q[:, 8:12] >> 4) | ((q[:, 4:8] >> 6) << 4)], axis=1)
    return sc, m


def _k_blocks(b, fifth_bit):
    """dequantize_row_q4_K / q5_K: sub-block j (32 weights, j = 0..7) is the low (j even) or high
    (j odd) nibbles of qs[32 (j // 2) ..][:32], plus 16 where bit j of qh[l] is set (Q5_K); its
    weight is (d * sc_j) * q - dmin * m_j in float32 (the products are exact: one rounding)."""
    sc, m = scale_min_k4(b["scales"])
    lo, hi = _nibbles(b["qs"].reshape(-1, 4, 32))
    q = np.stack([lo, hi], axis=2).reshape(-1, 8, 32)  # sub-block 2p: lo of group p, 2p + 1: hi
    if fifth_bit:
        q = q + ((b["qh"].astype(np.int32)[:, None, :] >> np.arange(8)[None, :, None]) & 1) * 16
    d1 = b["d"].astype(np.float32)[:, None] * sc.astype(np.float32)
    m1 = b["dmin"].astype(np.float32)[:, None] * m.astype(np.float32)
    return (d1[:, :, None] * q.astype(np.float32) - m1[:, :, None]).reshape(-1)


def _q6_k_blocks(b):
    """dequantize_row_q6_K: in each half h (128 weights), weight 32 k + l (k = 0..3, l = 0..31)
    is the low (k 0, 1) or high (k 2, 3) nibble of ql[64 h + l + 32 (k % 2)] with bits 2k, 2k + 1
    of qh[32 h + l] above it, minus 32; its weight is (d * scales[8 h + l // 16 + 2 k]) * q in
    float32 (exact)."""
    ql = b["ql"].astype(np.int32).reshape(-1, 2, 2, 32)  # (block, half, l // 32, l % 32)
    qh = b["qh"].astype(np.int32).reshape(-1, 2, 1, 32)
    low = np.stack([ql[:, :, 0] & 0xF, ql[:, :, 1] & 0xF, ql[:, :, 0] >> 4, ql[:, :, 1] >> 4], axis=2)
    high = (qh >> (2 * np.arange(4))[None, None, :, None]) & 3
    q = (low | high << 4) - 32  # (block, half, k, l)
    sc = b["scales"].astype(np.float32).reshape(-1, 2, 4, 2)  # (block, half, k, l // 16), entry l//16 + 2k
    d = b["d"].astype(np.float32)[:, None, None, None]
    ds = np.repeat(d * sc, 16, axis=3)  # (d * sc) per weight
    return (ds * q.astype(np.float32)).reshape(-1)


BLOCK_KINDS = {
    "q8_0": BlockKind("Q8_0", Q8_0_BLOCK, Q8_0_STORAGE, ("d",), dequantize_q8_0),
    "q4_0": BlockKind("Q4_0", 32, block_dtype(("d", "<f2"), ("qs", "u1", (16,))), ("d",),
                      lambda b: _legacy_blocks(b, 8, False, False)),
    "q4_1": BlockKind("Q4_1", 32, block_dtype(("d", "<f2"), ("m", "<f2"), ("qs", "u1", (16,))), ("d", "m"),
                      lambda b: _legacy_blocks(b, 0, True, False)),
    "q5_0": BlockKind("Q5_0", 32, block_dtype(("d", "<f2"), ("qh", "<u4"), ("qs", "u1", (16,))), ("d",),
                      lambda b: _legacy_blocks(b, 16, False, True)),
    "q5_1": BlockKind("Q5_1", 32, block_dtype(("d", "<f2"), ("m", "<f2"), ("qh", "<u4"), ("qs", "u1", (16,))),
                      ("d", "m"), lambda b: _legacy_blocks(b, 0, True, True)),
    "q4_k": BlockKind("Q4_K", QK_K, block_dtype(("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", (12,)),
                                                ("qs", "u1", (128,))), ("d", "dmin"), lambda b: _k_blocks(b, False)),
    "q5_k": BlockKind("Q5_K", QK_K, block_dtype(("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", (12,)),
                                                ("qh", "u1", (32,)), ("qs", "u1", (128,))), ("d", "dmin"),
                      lambda b: _k_blocks(b, True)),
    "q6_k": BlockKind("Q6_K", QK_K, block_dtype(("ql", "u1", (128,)), ("qh", "u1", (64,)), ("scales", "i1", (16,)),
                                                ("d", "<f2")), ("d",), _q6_k_blocks),
}
assert [k.storage.itemsize for k in BLOCK_KINDS.values()] == [34, 18, 20, 22, 24, 144, 176, 210]
GGUF_BLOCK_KINDS = {k.ggml: name for name, k in BLOCK_KINDS.items()}  # "Q4_K" -> "q4_k"


def dequantize(kind, data):
    """Blocks of a block kind (bytes or its structured array) as their float32 weights, flat, as
    llama.cpp's dequantize_row_* computes them."""
    return BLOCK_KINDS[kind].dequantize(np.asarray(data).view(BLOCK_KINDS[kind].storage).reshape(-1))


def tensor_bytes(kind, elements):
    """The bytes of `elements` weights stored as kind (a block kind: whole blocks)."""
    if kind in BLOCK_KINDS:
        return elements // BLOCK_KINDS[kind].weights * BLOCK_KINDS[kind].storage.itemsize
    return elements * np.dtype(NUMPY_STORAGE[kind]).itemsize


def not_whole_blocks(kind, row):
    """True when rows of `row` weights are not whole blocks of kind (never for f32, bf16, f16)."""
    return kind in BLOCK_KINDS and row % BLOCK_KINDS[kind].weights != 0


class Blocks:
    """One matrix piece as a file stores it, of any weight type: kind (a WEIGHT_TYPES name), shape,
    data (a uint8 array of exactly tensor_bytes(kind, prod(shape)) bytes: little-endian float32,
    bf16 or f16 values, or blocks (BLOCK_KINDS: q8_0, q4_0, ..., q6_k) along the rows) and source
    (what a message names). write_rope writes it as it is, never rounded again; asked for another
    type, it widens it (widened: the float32 weights, exactly) and converts that."""

    def __init__(self, kind, shape, data, source=""):
        if kind not in WEIGHT_TYPES:
            raise ExportError(f"{source}: weight type {kind!r} is not one of {', '.join(WEIGHT_TYPES)}")
        self.kind, self.shape, self.source = kind, tuple(int(n) for n in shape), source
        self.data = np.asarray(data, dtype=np.uint8).reshape(-1)
        elements = math.prod(self.shape)
        if elements and not_whole_blocks(kind, self.shape[-1]):
            raise ExportError(f"{source}: {kind} rows of {self.shape[-1]} weights are not whole "
                              f"{BLOCK_KINDS[kind].weights}-weight blocks")
        if len(self.data) != tensor_bytes(kind, elements):
            raise ExportError(f"{source}: {len(self.data)} bytes for {elements} {kind} weights; they take "
                              f"{tensor_bytes(kind, elements)}")

    @property
    def size(self):
        return math.prod(self.shape)

    def stored(self):
        """The values in their stored type (float32, uint16 bf16 bits, float16); a block kind: the blocks."""
        dtype = BLOCK_KINDS[self.kind].storage if self.kind in BLOCK_KINDS else np.dtype(NUMPY_STORAGE[self.kind])
        return self.data.view(dtype)

    def widened(self):
        """The float32 weights, exactly (Q8_0: d * q; the others as llama.cpp dequantizes), in the piece's shape."""
        if self.kind in BLOCK_KINDS:
            return dequantize(self.kind, self.data).reshape(self.shape)
        return widen(self.stored()).reshape(self.shape)

    def part(self, start, end):
        """Weights start..end (flat) as a Blocks of one row (a block kind's cut: at whole blocks)."""
        if not_whole_blocks(self.kind, start) or not_whole_blocks(self.kind, end):
            raise ExportError(f"{self.source}: a {self.kind} piece cannot be cut inside a block (weights {start}..{end})")
        data = self.data[tensor_bytes(self.kind, start):tensor_bytes(self.kind, end)]
        return Blocks(self.kind, (end - start,), data, self.source)


def check_piece_finite(piece, source):
    """Refuse a NaN or infinite weight (check_finite), or a block scale (d, and m or dmin) that is not
    finite (run refuses the file)."""
    if not isinstance(piece, Blocks):
        check_finite(piece, source)
    elif piece.kind not in BLOCK_KINDS:
        check_finite(piece.stored(), source)
    elif piece.size:
        blocks = piece.stored()
        for field in BLOCK_KINDS[piece.kind].scales:
            if not np.isfinite(blocks[field]).all():
                what = "scale" if field == "d" else f"{field} scale"
                raise ExportError(f"tensor {source}: a {piece.kind} {what} is not finite; run refuses such a file")


def piece_kind(piece):
    """The weight type a piece is given in: a Blocks' kind, or an array's (float32, uint16 bf16 bits,
    float16; any other array is written as float32)."""
    if isinstance(piece, Blocks):
        return piece.kind
    return weight_type_of(piece) if piece.dtype in (np.float32, np.float16, np.uint16) else "f32"


def cut_into_pieces(name, tensor, shapes):
    """A tensor as write_rope is given it (one array or Blocks; or a list of them or of loaders: one
    per layer, the n_experts of each layer with experts, any run of pieces) cut into the file's
    pieces of `shapes` by their weights' count, in order: [(type, [parts])] per file piece, its parts
    the given pieces' weights that fill it. A file piece of 0 weights takes a given piece of 0 weights
    (its type kept; else None). The parts of one file piece must share one type."""
    given = []
    for piece in tensor if isinstance(tensor, list) else [tensor]:
        source = getattr(piece, "source", name)
        piece = piece() if callable(piece) else piece
        if not isinstance(piece, (Blocks, np.ndarray)):
            piece = np.asarray(piece, dtype=np.float32)
        check_piece_finite(piece, source)
        given.append((piece, source))
    out, i, offset = [], 0, 0
    for n, shape in enumerate(shapes):
        need, parts, kinds = math.prod(shape), [], set()
        if need == 0 and i < len(given) and given[i][0].size == 0:
            kinds.add(piece_kind(given[i][0]))
            i += 1
        while need:
            if i == len(given):
                raise ExportError(f"tensor {name}: its pieces hold fewer weights than the model's shapes need")
            piece, source = given[i]
            take = min(need, piece.size - offset)
            if take:
                part = (piece.part(offset, offset + take) if isinstance(piece, Blocks)
                        else np.asarray(piece).reshape(-1)[offset:offset + take])
                parts.append(part)
                kinds.add(piece_kind(piece))
            need, offset = need - take, offset + take
            if offset == piece.size:
                i, offset = i + 1, 0
        if len(kinds) > 1:
            raise ExportError(f"tensor {name}: file piece {n} (a layer's) is given in {' and '.join(sorted(kinds))}; "
                              "the weights of one piece share one type")
        out.append((kinds.pop() if kinds else None, parts))
    if any(piece.size for piece, _ in given[i:]):
        raise ExportError(f"tensor {name}: its pieces hold more weights than the model's shapes need")
    return out


def quantize_q8_0(wide):
    """float32 weights (a whole number of blocks) as Q8_0 blocks, as llama.cpp's
    quantize_row_q8_0_ref computes them: amax = max |w| of the block, d = amax / 127 and
    id = 1 / d (0 when d is 0) in float32, d stored as f16 (nearest even), q = roundf(w * id)
    (the float32 product, rounded half away from zero) with the unrounded d."""
    x = np.ascontiguousarray(wide, dtype=np.float32).reshape(-1, Q8_0_BLOCK)
    amax = np.abs(x).max(axis=1)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    product = (x * inv[:, None]).astype(np.float64)  # float32 products, then exact in float64
    blocks = np.empty(len(x), Q8_0_STORAGE)
    with np.errstate(over="ignore"):
        blocks["d"] = d.astype(np.float16)
    blocks["qs"] = np.sign(product) * np.floor(np.abs(product) + 0.5)  # roundf: |q| <= 127
    return blocks


def quantize_q4_0(wide):
    """float32 weights (a whole number of blocks) as Q4_0 blocks, as llama.cpp's
    quantize_row_q4_0_ref computes them: max = the block's first weight of the largest magnitude
    (0.0 in a block of zeros), d = max / -8 and id = 1 / d (0 when d is 0) in float32, d stored as
    f16 (nearest even); each weight's q = MIN(15, (int8_t)(w * id + 8.5f)): the float32 product
    (with the unrounded d), the float32 sum, truncated toward zero. Weights 0..15 of a block are
    the low nibbles of its 16 bytes, 16..31 the high ones. (A product past int8, which only an id
    of inf gives, a max under ~2.4e-38, is C's undefined behaviour: here x86-64's cvttss2si, 0.)"""
    x = np.ascontiguousarray(wide, dtype=np.float32).reshape(-1, 32)
    first = np.argmax(np.abs(x), axis=1)  # the C keeps the first: amax < fabsf(v)
    largest = x[np.arange(len(x)), first]
    largest = np.where(np.abs(largest) > 0, largest, np.float32(0)).astype(np.float32)  # never -0.0
    d = (largest / np.float32(-8)).astype(np.float32)
    with np.errstate(divide="ignore", over="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        v = x * inv[:, None] + np.float32(8.5)  # two float32 roundings, as the C
        whole = np.isfinite(v) & (np.abs(v) < 2.0 ** 31)
        t = np.where(whole, np.trunc(np.where(whole, v, 0)), -2.0 ** 31).astype(np.int64)
    xi = np.minimum(15, ((t & 0xFF) ^ 0x80) - 0x80) & 0xFF  # (int8_t), MIN(15, ...), as uint8_t
    blocks = np.empty(len(x), BLOCK_KINDS["q4_0"].storage)
    with np.errstate(over="ignore"):
        blocks["d"] = d.astype(np.float16)
    blocks["qs"] = (xi[:, :16] | (xi[:, 16:] << 4)) & 0xFF
    return blocks


QUANTIZERS = {"q8_0": quantize_q8_0, "q4_0": quantize_q4_0}
# the f16 scale's divisor: d = largest / 127 (q8_0), largest / -8 (q4_0)
QUANTIZER_DIVISOR = {"q8_0": 127, "q4_0": 8}
QUANTIZER_SOURCE = {"q8_0": "quantize_row_q8_0_ref", "q4_0": "quantize_row_q4_0_ref"}


class Q8Stats:
    """What a Q8_0 (or Q4_0) export says on stderr: the largest change of a weight relative to its
    block's largest magnitude, and where."""
    def __init__(self):
        self.worst, self.where, self.quantized = 0.0, "", 0  # quantized: the tensors quantized (0: all copied)

    def add(self, wide, blocks, name, kind="q8_0"):
        self.quantized += 1
        n = BLOCK_KINDS[kind].weights
        x = np.asarray(wide, dtype=np.float32).reshape(-1, n)
        change = np.abs(dequantize(kind, blocks).reshape(-1, n) - x)
        amax = np.abs(x).max(axis=1, keepdims=True)
        with np.errstate(invalid="ignore", divide="ignore"):
            rel = np.where(amax > 0, change / amax, 0.0)
        if rel.size and rel.max() > self.worst:
            self.worst, self.where = float(rel.max()), name


Q8_STATS = Q8Stats()


def weight_type_of(array):
    """"f32", "bf16" or "f16": how an array holds its weights."""
    return {np.dtype(np.float32): "f32", np.dtype(np.uint16): "bf16", np.dtype(np.float16): "f16"}[array.dtype]


def widen(array):
    """Weights of any type as float32, exactly."""
    kind = weight_type_of(array)
    return to_float32({"f32": "F32", "bf16": "BF16", "f16": "F16"}[kind], array)


def narrow(wide, target):
    """float32 values rounded to nearest even in bf16 (uint16 bits) or f16. For bf16: add
    0x7FFF plus the lowest kept bit, then drop the low 16 bits; a NaN stays a (quiet) NaN."""
    if target == "f16":
        with np.errstate(over="ignore"):
            return wide.astype(np.float16)
    u = np.ascontiguousarray(wide).view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> 16) & 1)) >> 16).astype(np.uint16)  # wraps only for NaNs
    return np.where(np.isnan(wide), (u >> 16).astype(np.uint16) | np.uint16(0x40), rounded)


def convert_weights(array, target, name):
    """The array in the target type (widening is exact; narrowing rounds to nearest even).
    A finite value that becomes infinite in the narrower type is refused."""
    if weight_type_of(array) == target:
        return array
    wide = widen(np.asarray(array))
    if target == "f32":
        return wide
    if target in QUANTIZERS:
        if wide.size % BLOCK_KINDS[target].weights:  # check_block_rows refuses such a model before writing
            raise ExportError(f"tensor {name}: {wide.size} weights are not whole 32-weight {target} blocks")
        largest = np.abs(wide).max() if wide.size else 0
        if largest / QUANTIZER_DIVISOR[target] > LARGEST_FINITE["f16"]:
            raise ExportError(f"tensor {name}: the weight {largest:g} needs a {target} scale past f16's largest "
                              f"{LARGEST_FINITE['f16']:g}; export it as --dtype f32 or bf16")
        blocks = QUANTIZERS[target](wide)
        Q8_STATS.add(wide, blocks, name, target)
        return blocks
    if target in BLOCK_KINDS:  # a type only ever copied (write_tensor writes its Blocks as they are)
        raise ExportError(f"tensor {name}: export.py does not quantize to {target} (only to "
                          f"{' and '.join(QUANTIZERS)}); its source holds it in {weight_type_of(array)}")
    out = narrow(wide, target)
    overflow = np.isinf(widen(out)) & np.isfinite(wide)
    if overflow.any():
        value = wide[overflow].flat[0]
        raise ExportError(f"tensor {name}: the value {value:g} overflows {target} (largest finite "
                          f"{LARGEST_FINITE[target]:g}); export it as --dtype f32 or bf16")
    return out


def open_safetensors(model_dir):
    """{tensor name: Safetensors file holding it} for a single or sharded checkpoint."""
    single = os.path.join(model_dir, "model.safetensors")
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.isfile(single):
        shard = Safetensors(single)
        return {name: shard for name in shard.entries}
    if not os.path.isfile(index):
        raise ExportError(f"{model_dir}: no model.safetensors or model.safetensors.index.json "
                          "(PyTorch .bin checkpoints are not supported)")
    weight_map = read_json(index).get("weight_map")
    if not isinstance(weight_map, dict):
        raise ExportError(f"{index}: no \"weight_map\" object")
    shards, where = {}, {}
    for name, file in weight_map.items():
        if not isinstance(file, str) or os.path.basename(file) != file:
            raise ExportError(f"{index}: bad shard file name {file!r} for tensor {name}")
        if file not in shards:
            shards[file] = Safetensors(os.path.join(model_dir, file))
        if name not in shards[file].entries:
            raise ExportError(f"{index}: tensor {name} is not in its shard {file}")
        where[name] = shards[file]
    return where


def read_json(path):
    """A JSON object from a file."""
    try:
        with open(reading(path), encoding="utf-8") as f:
            value = json.load(f)
    except ValueError as e:
        raise ExportError(f"{path}: not valid JSON ({e})")
    if not isinstance(value, dict):
        raise ExportError(f"{path}: not a JSON object")
    return value


# ----------------------------------------------------------------------------
# Hugging Face config.json: sizes and rotary settings


def json_bool(obj, key, default, where="config.json:"):
    """obj[key] as a JSON boolean (default when absent or null); a string such as "false" is refused."""
    value = obj.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ExportError(f"{where} {key} {json.dumps(value)} must be true or false (a JSON boolean)")
    return value


def json_str(obj, key, where="config.json:"):
    """obj[key] as a JSON string, or None when absent or null."""
    value = obj.get(key)
    if value is not None and not isinstance(value, str):
        raise ExportError(f"{where} {key} {json.dumps(value)} must be a string")
    return value


def json_list(obj, key, where="config.json:"):
    """obj[key] as a JSON list of strings ([] when absent or null)."""
    value = obj.get(key)
    if value is None:
        return []
    if not (isinstance(value, list) and all(isinstance(x, str) for x in value)):
        raise ExportError(f"{where} {key} {json.dumps(value)} must be a list of strings")
    return value


def hf_int(config, key, default=None):
    """A positive integer from config.json (default when absent or null)."""
    value = config.get(key)
    if value is None:
        value = default
    if value is None:
        raise ExportError(f"config.json has no {key!r}")
    if not is_int(value) or not 0 < value <= INT32_MAX:
        raise ExportError(f"config.json: {key} {value!r} must be a positive int32")
    return value


def hf_number(value, what):
    """A JSON number (not a bool) as a float (inf for an integer beyond a double's range)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ExportError(f"config.json: {what} {value!r} is not a number")
    try:
        return float(value)
    except OverflowError:
        return math.inf


def hf_positive(value, key, why):
    """A config.json number stored as a float32 that must be finite and > 0 (0 would read as the
    format's default): refused naming the key, the value and why."""
    x = hf_number(value, key)
    if not (x > 0 and math.isfinite(f32(x)) and f32(x) > 0):
        raise ExportError(f"config.json: {key} {json.dumps(value)}: must be finite and > 0 in float32, as it is "
                          f"stored ({why})")
    return x


def hf_dtype(config):
    """The weights' type config.json names (torch_dtype, or transformers 5's dtype): f32, bf16 or f16."""
    for key in ("torch_dtype", "dtype"):
        name = json_str(config, key)
        if name:
            return DTYPE_NAMES.get(name, "f32")
    return "f32"


def hf_attention_scale(config):
    """Gemma 2 and 3: query_pre_attn_scalar s gives the attention scale 1 / sqrt(s) (0: none given)."""
    value = config.get("query_pre_attn_scalar")
    if value is None:
        return 0.0
    x = hf_number(value, "query_pre_attn_scalar")
    if not (x > 0 and math.isfinite(x)):
        raise ExportError(f"config.json: query_pre_attn_scalar {json.dumps(value)}: must be finite and > 0 (the "
                          "attention scale is 1 / sqrt of it)")
    scale = f32(x ** -0.5)
    if not math.isfinite(scale):
        raise ExportError(f"config.json: query_pre_attn_scalar {json.dumps(value)}: the attention scale 1 / sqrt of "
                          "it overflows float32")
    if scale == 0:
        raise ExportError(f"config.json: query_pre_attn_scalar {json.dumps(value)}: the attention scale 1 / sqrt of "
                          "it is 0 in float32, which the format reads as the default 1 / sqrt(head_dim)")
    return x ** -0.5


def check_architecture(config):
    """Refuse models whose block this format cannot describe (it can the families of FAMILIES),
    each refusal one line naming what it found."""
    if config.get("vision_config") is not None:
        raise ExportError("config.json: a vision tower (vision_config) is not supported: export the text model only")
    model_type = json_str(config, "model_type")
    family = family_of(model_type)
    for key in ("num_experts", "num_local_experts", "n_routed_experts"):
        if config.get(key) and (family is None or family.experts != key):
            raise ExportError(f"config.json: {key} {json.dumps(config[key])}: mixtures of experts are supported for "
                              "qwen3_moe, mixtral and gemma4 only")
    if family is None:
        raise ExportError(f"config.json: model_type {model_type!r} is not supported (only "
                          f"{', '.join(FAMILIES)}, and gemma3 and gemma4's text models)")
    architectures = [f.architecture for f in FAMILIES.values()]
    for arch in json_list(config, "architectures"):
        if arch not in architectures:
            raise ExportError(f"config.json: architecture {arch!r} is not supported (only "
                              f"{', '.join(architectures)})")
        if model_type is not None and arch != family.architecture:
            raise ExportError(f"config.json: architecture {arch!r} does not match model_type {model_type!r} "
                              f"(expected {family.architecture!r})")
    act = json_str(config, "hidden_act")
    act = HF_DEFAULTS["hidden_act"] if act is None else act
    if family.activation == "geglu-tanh":
        explicit = json_str(config, "hidden_activation")
        if explicit == "gelu":
            raise ExportError("config.json: hidden_activation 'gelu': the exact (erf) GELU is not supported; run.c "
                              "computes the tanh GELU only ('gelu_pytorch_tanh', what Gemma is trained with)")
        if explicit is not None and explicit != "gelu_pytorch_tanh":
            raise ExportError(f"config.json: hidden_activation {explicit!r} is not supported for {model_type} (only "
                              "'gelu_pytorch_tanh', as Gemma runs)")
        act = json_str(config, "hidden_act") or "gelu_pytorch_tanh"
        if explicit is None and act not in GEMMA_ACTIVATIONS:
            raise ExportError(f"config.json: hidden_act {act!r} is not supported for {model_type} (only "
                              "'gelu_pytorch_tanh', as Gemma runs)")
    elif act != "silu":
        raise ExportError(f"config.json: hidden_act {act!r} is not supported (only 'silu': run.c's SwiGLU)")
    for key in ("attention_bias", "mlp_bias"):
        if json_bool(config, key, False):
            raise ExportError(f"config.json: {key} is true; this format has no biases")
    window = config.get("sliding_window")
    if window is not None and not is_int(window):
        raise ExportError(f"config.json: sliding_window {json.dumps(window)} must be an integer or null")
    if window is not None and window < 1:
        raise ExportError(f"config.json: sliding_window {window} must be at least 1")


def gemma_sliding_layers(config, family, n_layers):
    """Which layers slide, as Gemma 2's and 3's configs build it: layer_types when given,
    else Gemma 2 every other layer from layer 0 ((i + 1) % 2 != 0), Gemma 3 all but every
    sliding_window_pattern-th ((i + 1) % pattern != 0; 6: five local to one global)."""
    types = config.get("layer_types")
    if types is not None:
        if not (isinstance(types, list) and len(types) == n_layers
                and all(t in ("sliding_attention", "full_attention") for t in types)):
            raise ExportError(f"config.json: layer_types must be a list of {n_layers} 'sliding_attention' or "
                              "'full_attention'")
        return [t == "sliding_attention" for t in types]
    if family.sliding == "alternate":
        return [(i + 1) % 2 != 0 for i in range(n_layers)]
    pattern = config.get("sliding_window_pattern", config.get("_sliding_window_pattern", 6))
    if not is_int(pattern) or pattern < 1:
        raise ExportError(f"config.json: sliding_window_pattern {json.dumps(pattern)} must be a positive integer")
    return [(i + 1) % pattern != 0 for i in range(n_layers)]


def hf_layers(config, model_type, n_layers, seq_len):
    """The per-layer table [(rope, window)], or None when every layer rotates with full
    attention. As transformers builds each family's layer types:
      mistral, phi3: sliding_window W on every layer (query t sees keys t - W < s <= t);
      qwen2, qwen3: W only with use_sliding_window, on layers i >= max_window_layers;
      smollm3: no_rope_layers[i] == 0 marks a NoPE layer (every fourth in SmolLM3-3B).
    A window at least as long as the context is full attention, and is not stored."""
    family = FAMILIES[model_type]
    window = config.get("sliding_window")
    windows = [0] * n_layers
    if family.sliding == "all" and window is not None:
        windows = [window] * n_layers
    elif family.sliding == "max_window_layers" and json_bool(config, "use_sliding_window", False) and window is not None:
        first = config.get("max_window_layers", n_layers)
        if not is_int(first) or first < 0:
            raise ExportError(f"config.json: max_window_layers {json.dumps(first)} must be an integer >= 0")
        windows = [window if i >= first else 0 for i in range(n_layers)]
    elif family.sliding == "refused" and json_bool(config, "use_sliding_window", False):
        raise ExportError(f"config.json: use_sliding_window true is not supported for {model_type}")
    elif family.sliding in ("alternate", "pattern"):
        sliding = gemma_sliding_layers(config, family, n_layers)
        if any(sliding) and window is None:
            raise ExportError(f"config.json: {model_type} has sliding layers but no sliding_window")
        windows = [window if slides else 0 for slides in sliding]
    windows = [w if w < seq_len else 0 for w in windows]
    ropes = [LAYER_ROPE_FIRST] * n_layers
    if family.nope_layers:
        flags = config.get("no_rope_layers")
        if flags is None:  # configuration_smollm3.py's default: every no_rope_layer_interval-th layer is NoPE
            every = config.get("no_rope_layer_interval", 4)
            if not is_int(every) or every < 1:
                raise ExportError(f"config.json: no_rope_layer_interval {json.dumps(every)} must be a positive integer")
            flags = [int((i + 1) % every != 0) for i in range(n_layers)]
        if not (isinstance(flags, list) and len(flags) == n_layers and all(f in (0, 1) and not isinstance(f, bool)
                                                                            for f in flags)):
            raise ExportError(f"config.json: no_rope_layers must be a list of {n_layers} zeros and ones "
                              "(1: the layer rotates)")
        ropes = [LAYER_ROPE_FIRST if f else LAYER_NOPE for f in flags]
    if family.local_rope:  # the local (sliding) layers' own theta: the second setting
        ropes = [LAYER_ROPE_SECOND if slides else LAYER_ROPE_FIRST
                 for slides in gemma_sliding_layers(config, family, n_layers)]
    if all(w == 0 for w in windows) and all(r == LAYER_ROPE_FIRST for r in ropes):
        return None
    return list(zip(ropes, windows))


def hf_config(config):
    """The Config of a Hugging Face config.json, before the rotary settings."""
    check_architecture(config)
    dim = hf_int(config, "hidden_size")
    n_heads = hf_int(config, "num_attention_heads")
    c = Config(dim=dim,
               hidden_dim=hf_int(config, "intermediate_size"),
               n_layers=hf_int(config, "num_hidden_layers"),
               n_heads=n_heads,
               n_kv_heads=hf_int(config, "num_key_value_heads", n_heads),
               vocab_size=hf_int(config, "vocab_size"),
               seq_len=hf_int(config, "max_position_embeddings", HF_DEFAULTS["max_position_embeddings"]),
               shared_classifier=json_bool(config, "tie_word_embeddings", False),
               norm_eps=hf_number(config.get("rms_norm_eps", HF_DEFAULTS["rms_norm_eps"]), "rms_norm_eps"))
    model_type = config.get("model_type") or "llama"
    family = FAMILIES[model_type]
    head_dim = config.get("head_dim")
    if head_dim is not None and (not is_int(head_dim) or head_dim < 1):
        raise ExportError(f"config.json: head_dim {json.dumps(head_dim)} must be an integer or null")
    if family.head_dim and head_dim is not None and head_dim * n_heads != dim:
        c.head_size = head_dim  # Qwen3-0.6B: 16 heads of 128 with hidden_size 1024
    elif dim % n_heads:
        raise ExportError(f"config.json: hidden_size {dim} is not a multiple of num_attention_heads {n_heads}")
    elif head_dim is not None and head_dim != dim // n_heads:
        raise ExportError(f"config.json: head_dim {head_dim} differs from hidden_size / num_attention_heads = "
                          f"{dim // n_heads}; export.py takes a head_dim of its own only for "
                          f"{', '.join(sorted(name for name, f in FAMILIES.items() if f.head_dim))}")
    c.qkv_bias = family.qkv_bias
    c.qk_norm = family.qk_norm
    c.layers = hf_layers(config, model_type, c.n_layers, c.seq_len)
    if family.experts:
        hf_experts(config, family, c)
    c.gemma_norms = family.gemma_block  # x * (1 + w): 1 + w is stored
    c.activation = ACTIVATIONS.index(family.activation)
    if family.gemma_block:
        # the embedding times sqrt(hidden_size), rounded to the model's dtype as Gemma computes it
        c.embedding_multiplier = float(narrow_scalar(math.sqrt(dim), hf_dtype(config)))
    if family.post_norms:
        c.post_norms = True
        c.attention_scale = hf_attention_scale(config)
        for key, field in (("attn_logit_softcapping", "attention_softcap"), ("final_logit_softcapping", "final_softcap")):
            if config.get(key) is not None:  # null: no cap
                setattr(c, field, hf_positive(config[key], key, "a cap; null for none, run.c refuses the rest"))
    if family.local_rope:  # the local layers' setting: rope_local_base_freq, no rule
        value = config.get("rope_local_base_freq")
        theta = 10000.0 if value is None else hf_positive(value, "rope_local_base_freq", "the local layers' theta")
        c.rope2 = {"rope_theta": theta}
        try:
            check_rope_angles(second_setting(c))
        except ExportError as e:
            raise ExportError(f"config.json: rope_local_base_freq {json.dumps(value)}: {e}")
    return c


def hf_experts(config, family, c):
    """A mixture of experts' fields from config.json, and which layers have the experts:
      qwen3_moe: num_experts of moe_intermediate_size, num_experts_per_tok chosen, weights
        renormalized with norm_topk_prob; layer i has them unless in mlp_only_layers, when
        (i + 1) % decoder_sparse_step == 0 (else a feed-forward of intermediate_size);
      mixtral: num_local_experts of intermediate_size on every layer, num_experts_per_tok
        chosen, renormalized."""
    c.n_experts = hf_int(config, family.experts)
    c.n_experts_used = hf_int(config, "num_experts_per_tok")
    c.expert_hidden = hf_int(config, family.expert_hidden)
    c.routing = ROUTING_SOFTMAX_TOPK_NORM
    sparse = [True] * c.n_layers
    if family.dense_layers:
        c.routing = ROUTING_SOFTMAX_TOPK_NORM if json_bool(config, "norm_topk_prob", False) else ROUTING_SOFTMAX_TOPK
        step = hf_int(config, "decoder_sparse_step", 1)
        dense = config.get("mlp_only_layers") or []
        if not (isinstance(dense, list) and all(is_int(l) and 0 <= l < c.n_layers for l in dense)):
            raise ExportError(f"config.json: mlp_only_layers {json.dumps(dense)} must list layers in [0, {c.n_layers})")
        sparse = [l not in dense and (l + 1) % step == 0 for l in range(c.n_layers)]
    if c.n_experts_used > c.n_experts:
        raise ExportError(f"config.json: num_experts_per_tok {c.n_experts_used} is above the {c.n_experts} experts")
    if not any(sparse):
        raise ExportError("config.json: no layer has the experts (decoder_sparse_step, mlp_only_layers)")
    if not all(sparse):  # some layers keep a feed-forward: Gemma 4's eight-field records say which
        records = c.layers if c.layers is not None else [(LAYER_ROPE_FIRST, 0)] * c.n_layers
        c.layers = [tuple(r[:2]) + (0, 0, 0, 0, 0, int(moe)) for r, moe in zip(records, sparse)]


def moe_pieces(c, ours, names):
    """[(Hugging Face tensor name, its expected shape)] of a mixture of experts' tensors and of
    w1, w2, w3 (the feed-forwards of the layers without experts)."""
    layers, dim = layer_shapes(c), c.dim
    dense = [(l, s) for l, s in enumerate(layers) if not s.experts]
    sparse = [l for l, s in enumerate(layers) if s.experts]
    if ours in ("w1", "w3"):
        return [(HF_TENSORS[ours].format(i=l), [s.hidden_dim, dim]) for l, s in dense]
    if ours == "w2":
        return [(HF_TENSORS[ours].format(i=l), [dim, s.hidden_dim]) for l, s in dense]
    if ours == "router":
        return [(f"model.layers.{l}.{names['router']}", [c.n_experts, dim]) for l in sparse]
    shape = [dim, c.expert_hidden] if ours == "expert_w2" else [c.expert_hidden, dim]
    return [(f"model.layers.{l}.{names['experts']}.{e}.{names[ours]}", shape)
            for l in sparse for e in range(c.n_experts)]


def narrow_scalar(x, dtype):
    """x rounded to float32, bf16 or f16 (nearest even), as a float32."""
    x32 = np.float32(x)
    if dtype == "f16":
        return np.float32(np.float16(x32))
    if dtype == "bf16":
        u = int(np.array(x32).view(np.uint32))
        u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
        return np.array(u, dtype=np.uint32).view(np.float32)
    return x32


def hf_rope_parameters(config):
    """(rope dict, rope_type, theta, partial_rotary_factor) from either place transformers keeps them.

    transformers 4.x: top-level rope_theta and partial_rotary_factor, and a
    rope_scaling dict (or null) with "rope_type" (older: "type") and the rule's keys.
    transformers 5.x: a rope_parameters dict with rope_type, rope_theta and the rest.
    As in transformers' convert_rope_params_to_dict, a non-null rope_scaling wins.
    """
    for key in ("rope_scaling", "rope_parameters"):
        if config.get(key) is not None and not isinstance(config[key], dict):
            raise ExportError(f"config.json: {key} {json.dumps(config[key])} must be an object or null")
    rope = config.get("rope_scaling") or config.get("rope_parameters") or {}
    if any(isinstance(v, dict) for v in rope.values()):
        raise ExportError("config.json: per-layer-type rope_parameters are not supported")
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if not isinstance(rope_type, str):
        raise ExportError(f"config.json: rope_type {json.dumps(rope_type)} must be a string")

    def pick(key, default):
        value = rope_value(config, rope, key)
        return hf_number(default if value is None else value, key)

    return rope, rope_type, pick("rope_theta", HF_DEFAULTS["rope_theta"]), pick("partial_rotary_factor", 1.0)


def rope_value(config, rope, key):
    """config[key] or rope[key] (they must agree when both are set), else None."""
    inner, outer = rope.get(key), config.get(key)
    if inner is not None and outer is not None and inner != outer:
        raise ExportError(f"config.json: {key} is {outer} at top level but {inner} in the rope dict")
    return inner if inner is not None else outer


def fraction_for(rotated_pairs, head_dim, near):
    """The float32 p closest to `near` with floor(p * head_dim / 2) == rotated_pairs exactly.

    run.c and the paper count rotated pairs as floor(p * head_dim / 2); a p such as
    float32(1/3) may land just below the integer and lose a pair, so step it up
    (or down) one float32 at a time until the exact product has the right floor.
    """
    p = np.float32(near)
    while float(p) * head_dim / 2 < rotated_pairs:
        p = np.nextafter(p, np.float32(2))
    while math.floor(float(p) * head_dim / 2) > rotated_pairs:
        p = np.nextafter(p, np.float32(-1))
    return float(p)


# What each rope_type reads from the rope dict (transformers' modeling_rope_utils.py), besides
# rope_type / type, rope_theta and partial_rotary_factor; other keys are ignored, with a warning.
# original_max_position_embeddings is kept for every rule: it is the length run.c's rules are relative to.
HF_RULE_KEYS = {
    "linear": {"factor", "original_max_position_embeddings"},
    "proportional": {"factor", "original_max_position_embeddings"},
    "yarn": {"factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow",
             "mscale", "mscale_all_dim", "truncate"},
    "llama3": {"factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"},
    "longrope": {"factor", "original_max_position_embeddings", "attention_factor", "short_factor", "long_factor"},
}
HF_REFUSED_TYPES = {
    "dynamic": "dynamic NTK recomputes the base from the current sequence length, which a frequency table "
               "fixed at load time cannot follow; remove rope_scaling from config.json, export, and run "
               "with run's --rope-scaling ntk (or yarn) --rope-factor F instead",
}


def rope_number(rope, key, rope_type, low=0.0, low_ok=False):
    """rope[key] as a finite float > low (>= low when low_ok), also finite in float32."""
    value = rope.get(key)
    if value is None:
        raise ExportError(f"config.json: rope_type '{rope_type}' needs {key!r}"
                          + (" (it is null)" if key in rope else ""))
    x = hf_number(value, f"{rope_type} {key}")
    if not (math.isfinite(f32(x)) and (x >= low if low_ok else x > low)):
        raise ExportError(f"config.json: {rope_type} {key} {value!r} must be finite and {'>=' if low_ok else '>'} "
                          f"{low:g}")
    return x


def hf_original_len(config, rope, rope_type, default):
    """original_max_position_embeddings: in the rope dict or, as transformers 5 also reads it, top level."""
    value = rope_value(config, rope, "original_max_position_embeddings")
    if value is None:
        return default
    if not is_int(value) or not 0 < value <= INT32_MAX:
        raise ExportError(f"config.json: {rope_type} original_max_position_embeddings {value!r} must be a "
                          "positive int32")
    return value


def yarn_mscale(scale, mscale=1.0):
    """transformers' get_mscale: YaRN's attention factor 0.1 * mscale * ln(s) + 1, or 1 for s <= 1."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def hf_linear(config, rope, max_len, rope_type="linear"):
    """linear (transformers' _compute_linear_scaling_rope_parameters): every frequency / factor."""
    factor = rope_number(rope, "factor", rope_type)
    if not (math.isfinite(f32(factor)) and factor >= 1):
        raise ExportError(f"config.json: {rope_type} factor {show(factor)} must be finite and >= 1 (a factor below 1 "
                          "compresses positions instead of stretching them; transformers only warns, run.c refuses)")
    return dict(rule=RULE_LINEAR, factor=factor, original_len=hf_original_len(config, rope, rope_type, 0))


def hf_proportional(config, rope, max_len):
    """proportional (transformers' p-RoPE): its optional factor divides every frequency: linear."""
    if "factor" in rope and f32(rope_number(rope, "factor", "proportional")) != 1:
        return hf_linear(config, rope, max_len, "proportional")
    return dict(original_len=hf_original_len(config, rope, "proportional", 0))  # factor 1: no rule


def hf_yarn(config, rope, max_len):
    """yarn, as transformers' _compute_yarn_parameters reads its parameters.

    The correction range is floored / ceiled (truncate, default true); factor null means
    max_position_embeddings / original_max_position_embeddings; original_max_position_embeddings
    defaults to max_position_embeddings; beta_fast / beta_slow 0 or null mean 32 / 1; the
    attention factor, when not given, is get_mscale(s, mscale) / get_mscale(s, mscale_all_dim)
    when both are set (non-zero), else get_mscale(s) = 0.1 ln s + 1 (stored as 0, the default).
    """
    truncate = rope.get("truncate", True)  # transformers: a null truncate is false
    if truncate is not None and not isinstance(truncate, bool):
        raise ExportError(f"config.json: yarn truncate {json.dumps(truncate)} must be true or false (a JSON boolean)")
    if not truncate:
        raise ExportError(f"config.json: yarn with \"truncate\": {json.dumps(rope['truncate'])} is not supported: "
                          "run.c's yarn floors and ceils the correction range (transformers' truncate: true)")
    original = hf_original_len(config, rope, "yarn", max_len)
    implicit = max_len / original
    if "factor" not in rope:
        raise ExportError("config.json: rope_type 'yarn' needs 'factor' (transformers requires the key; "
                          "null means max_position_embeddings / original_max_position_embeddings)")
    if rope["factor"] is None:
        factor = implicit
    else:
        factor = rope_number(rope, "factor", "yarn")
        if implicit not in (factor, 1):
            warn(f"yarn factor {show(factor)} differs from max_position_embeddings / "
                 f"original_max_position_embeddings = {max_len} / {original} = {show(implicit)}; the factor is "
                 "used, as transformers does now (releases before its PR #40320 used the ratio)")
    if not (math.isfinite(f32(factor)) and factor >= 1):
        raise ExportError(f"config.json: yarn factor {show(factor)} must be finite and >= 1")
    # transformers: rope.get("beta_fast") or 32, so 0 and null are the default too (stored as 0)
    betas = {key: rope_number(rope, key, "yarn", low_ok=True) if rope.get(key) is not None else 0.0
             for key in ("beta_fast", "beta_slow")}
    if (betas["beta_fast"] or 32) < (betas["beta_slow"] or 1):
        raise ExportError(f"config.json: yarn beta_fast {show(betas['beta_fast'] or 32)} is below beta_slow "
                          f"{show(betas['beta_slow'] or 1)}: the rule would divide the fast pairs and keep the slow "
                          "ones (transformers only warns; run.c refuses it)")
    mscales = [rope_number(rope, key, "yarn", -math.inf) if rope.get(key) is not None else 0.0
               for key in ("mscale", "mscale_all_dim")]
    if rope.get("attention_factor") is not None:
        attention = rope_number(rope, "attention_factor", "yarn")
    elif all(mscales):
        mscale, mscale_all_dim = mscales
        denominator = yarn_mscale(factor, mscale_all_dim)
        attention = yarn_mscale(factor, mscale) / denominator if denominator else math.inf
        if not (math.isfinite(f32(attention)) and f32(attention) > 0):
            raise ExportError(f"config.json: yarn mscale {mscale:g} / mscale_all_dim {mscale_all_dim:g} give the "
                              f"attention factor {attention:g}; it must be finite and > 0")
    else:
        attention = 0.0  # the default, 0.1 ln s + 1
    return dict(rule=RULE_YARN, factor=factor, original_len=original, yarn_beta_fast=betas["beta_fast"],
                yarn_beta_slow=betas["beta_slow"], rope_attention_factor=attention)


def hf_llama3(config, rope, max_len):
    """llama3 (transformers' _compute_llama3_parameters): factor, low/high_freq_factor are required."""
    factor = rope_number(rope, "factor", "llama3", 1.0, low_ok=True)
    low = rope_number(rope, "low_freq_factor", "llama3")
    high = rope_number(rope, "high_freq_factor", "llama3")
    if not f32(high) > f32(low):
        raise ExportError(f"config.json: llama3 high_freq_factor {show(high)} must be > low_freq_factor {show(low)}")
    return dict(rule=RULE_LLAMA3, factor=factor, original_len=hf_original_len(config, rope, "llama3", max_len),
                llama3_low_freq_factor=low, llama3_high_freq_factor=high)


def hf_longrope(config, rope, max_len):
    """longrope (transformers' _compute_longrope_parameters; Phi-3 128k, Phi-4-mini): every
    rotated pair's frequency divided by short_factor[i] within the original length, by
    long_factor[i] beyond it; cos and sin times the attention factor: the explicit one,
    else sqrt(1 + ln s / ln original) for s = factor (or max_position_embeddings /
    original) > 1, else 1. The factors go into the file as the tensor rope_factors."""
    original = hf_original_len(config, rope, "longrope", max_len)
    lists = []
    for key in ("short_factor", "long_factor"):
        values = rope.get(key)
        if not (isinstance(values, list) and values and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(f32(v)) and f32(v) > 0
                for v in values)):
            raise ExportError(f"config.json: longrope {key} must be a list of finite numbers > 0")
        lists.append([float(v) for v in values])
    if len(lists[0]) != len(lists[1]):
        raise ExportError(f"config.json: longrope short_factor has {len(lists[0])} entries, long_factor {len(lists[1])}")
    factor = rope.get("factor")
    s = rope_number(rope, "factor", "longrope") if factor is not None else max_len / original
    attention = rope.get("attention_factor")
    if attention is not None:
        attention = rope_number(rope, "attention_factor", "longrope")
    else:
        attention = math.sqrt(1.0 + math.log(s) / math.log(original)) if s > 1 and original > 1 else 1.0
    return dict(rule=RULE_LONGROPE, factor=max(s, 1.0), original_len=original, rope_attention_factor=attention,
                longrope_factors=lists)


def hf_rope(config, head_dim, max_len):
    """(theta, p, scaling, rotary_dim) for a Hugging Face config; rotary_dim tells the row permutation.

    scaling holds the arguments of Config.set_scaling ({} for none); max_len is
    max_position_embeddings.

    rope_type "default": standard RoPE, or with partial_rotary_factor f < 1 GPT-NeoX's
        partial rotary: the first rotary_dim = int(head_dim * f) dims rotate as pairs
        (i, i + rotary_dim/2) at base^(-2i / rotary_dim). That is p-RoPE with
        p = rotary_dim / head_dim and theta = base^(head_dim / rotary_dim), since
        theta^(-2i / head_dim) = base^(-2i / rotary_dim).
    rope_type "linear", "yarn", "llama3": the same rotation (and the same conversion of
        partial_rotary_factor), with the scaling rule and its parameters in the header.
    rope_type "proportional" (transformers' p-RoPE, Gemma 4's global layers): pairs
        (i, i + head_dim/2) for i < int(f * head_dim // 2) rotate at
        base^(-2i / head_dim), the others not; every frequency is divided by "factor",
        which is the linear rule (rope_scaling 1) when the factor is not 1.
    """
    rope, rope_type, base, f = hf_rope_parameters(config)
    if not (base > 0 and math.isfinite(base)):  # before partial rotary raises it to a power
        raise ExportError(f"config.json: rope_theta {base}: must be finite and > 0 in float32, as it is stored")
    if rope_type in HF_REFUSED_TYPES:
        raise ExportError(f"rope_type '{rope_type}' is not supported: {HF_REFUSED_TYPES[rope_type]}")
    if rope_type != "default" and rope_type not in HF_RULE_KEYS:
        raise ExportError(f"rope_type {rope_type!r} is not supported: this format stores 'default' (with optional "
                          "partial_rotary_factor), 'proportional', 'linear', 'yarn' and 'llama3'")
    if not 0 <= f <= 1:
        raise ExportError(f"config.json: partial_rotary_factor {f} must be in [0, 1]")
    if rope_type == "default":
        scaling = {}
    else:
        ignored = set(rope) - HF_RULE_KEYS[rope_type] - {"rope_type", "type", "rope_theta", "partial_rotary_factor"}
        if ignored:
            warn(f"rope_type '{rope_type}' does not use {', '.join(sorted(ignored))} (transformers ignores "
                 "them too)")
        parse = {"linear": hf_linear, "proportional": hf_proportional, "yarn": hf_yarn, "llama3": hf_llama3,
                 "longrope": hf_longrope}
        scaling = parse[rope_type](config, rope, max_len)
    if rope_type == "proportional":
        pairs = int(f * head_dim // 2)
        return base, fraction_for(pairs, head_dim, f), scaling, head_dim
    rotary_dim = int(head_dim * f)
    if rotary_dim == head_dim:
        return base, 1.0, scaling, head_dim
    if rotary_dim % 2:
        raise ExportError(f"config.json: partial_rotary_factor {f} gives an odd rotary dimension {rotary_dim}")
    p = fraction_for(rotary_dim // 2, head_dim, rotary_dim / head_dim)
    try:
        theta = base ** (head_dim / rotary_dim) if rotary_dim else base
    except OverflowError:
        theta = math.inf
    if not math.isfinite(f32(theta)):
        raise ExportError(f"partial_rotary_factor {f}: the equivalent theta {base}^{head_dim}/{rotary_dim} "
                          "overflows float32")
    return theta, p, scaling, rotary_dim


def pair_permutation(head_dim, rotary_dim):
    """Row order per head that turns pairs (i, i + rotary_dim/2) into adjacent pairs (2i, 2i+1).

    new row 2i <- old row i, new row 2i+1 <- old row i + rotary_dim/2 for
    i < rotary_dim/2; rows from rotary_dim on do not rotate and keep their place.
    """
    half = rotary_dim // 2
    order = np.arange(head_dim)
    order[0:rotary_dim:2] = np.arange(half)
    order[1:rotary_dim:2] = np.arange(half) + half
    return order


def permute_heads(w, n_heads, order):
    """Reorder the rows of each head of a (n_heads * head_dim, dim) matrix."""
    head_dim = len(order)
    return w.reshape(n_heads, head_dim, -1)[:, order, :].reshape(n_heads * head_dim, -1)


# ----------------------------------------------------------------------------
# Reading a Hugging Face checkpoint directory


# The one map of the Hugging Face names of the tensors the format stores (ROPE name: name; {i}
# the layer), as a Llama checkpoint names them and Gemma 4's own; the text model of a multimodal
# checkpoint has another prefix for "model." (hf_text_model_names, read_gemma4). A family's own
# names are in its record (Family.fused, Family.expert_tensors) or below (HF_FOUR_NORMS); Gemma
# 4's router and experts in read_gemma4. A GGUF map (token_embd, blk.{i}.attn_q, ...) is to
# stand beside this one.
HF_TENSORS = {
    "token_embedding": "model.embed_tokens.weight",
    "rms_final": "model.norm.weight",
    "wcls": "lm_head.weight",
    "rms_att": "model.layers.{i}.input_layernorm.weight",
    "wq": "model.layers.{i}.self_attn.q_proj.weight",
    "wk": "model.layers.{i}.self_attn.k_proj.weight",
    "wv": "model.layers.{i}.self_attn.v_proj.weight",
    "wo": "model.layers.{i}.self_attn.o_proj.weight",
    "rms_ffn": "model.layers.{i}.post_attention_layernorm.weight",
    "w1": "model.layers.{i}.mlp.gate_proj.weight",
    "w2": "model.layers.{i}.mlp.down_proj.weight",
    "w3": "model.layers.{i}.mlp.up_proj.weight",
    # version 2's optional tensors
    "bq": "model.layers.{i}.self_attn.q_proj.bias",
    "bk": "model.layers.{i}.self_attn.k_proj.bias",
    "bv": "model.layers.{i}.self_attn.v_proj.bias",
    "q_norm": "model.layers.{i}.self_attn.q_norm.weight",
    "k_norm": "model.layers.{i}.self_attn.k_norm.weight",
    # Gemma 4's
    "layer_scalars": "model.layers.{i}.layer_scalar",
    "rms_pre_experts": "model.layers.{i}.pre_feedforward_layernorm_2.weight",
    "rms_post_dense": "model.layers.{i}.post_feedforward_layernorm_1.weight",
    "rms_post_experts": "model.layers.{i}.post_feedforward_layernorm_2.weight",
    "per_layer_embedding": "model.embed_tokens_per_layer.weight",
    "per_layer_projection_in": "model.per_layer_model_projection.weight",
    "per_layer_projection_norm": "model.per_layer_projection_norm.weight",
    "per_layer_gate": "model.layers.{i}.per_layer_input_gate.weight",
    "per_layer_projection_out": "model.layers.{i}.per_layer_projection.weight",
    "rms_per_layer": "model.layers.{i}.post_per_layer_input_norm.weight",
}
# Gemma 2, 3 and 4 (four norms per layer): post_attention_layernorm is the attention output's
# norm, pre_feedforward_layernorm the one before the feed-forward
HF_FOUR_NORMS = {"rms_ffn": "model.layers.{i}.pre_feedforward_layernorm.weight",
                 "rms_post_att": "model.layers.{i}.post_attention_layernorm.weight",
                 "rms_post_ffn": "model.layers.{i}.post_feedforward_layernorm.weight"}
NORM_TENSORS = {"rms_att", "rms_ffn", "rms_final", "q_norm", "k_norm", "rms_post_att", "rms_post_ffn"}


def hf_pieces(ours, shape, n_layers, post_norms=False):
    """[(Hugging Face tensor name, its expected shape)] that make up one ROPE tensor."""
    name = {**HF_TENSORS, **HF_FOUR_NORMS}[ours] if post_norms else HF_TENSORS[ours]
    if "{i}" in name:  # a piece from each layer
        return [(name.format(i=i), list(shape[1:])) for i in range(n_layers)]
    return [(name, list(shape))]


def permute_head_columns(w, n_heads, order):
    """Reorder the columns of each head of a (dim, n_heads * head_dim) matrix (Gemma 4's wo on the
    layers whose values are the permuted key projection)."""
    head_dim = len(order)
    return w.reshape(-1, n_heads, head_dim)[:, :, order].reshape(-1, n_heads * head_dim)


def lazy_tensor(file, name, heads=None, order=None, plus_one=False, rows=None, column_order=None):
    """A function that reads one stored tensor in its stored type (see weight_type_of; rows
    permuted per head if asked; plus_one: Gemma's norm weight w as 1 + w in float32, the
    sum Gemma's RMSNorm computes in float32; rows: (first, end), a band of a fused matrix;
    column_order: (heads, order), the columns permuted per head)."""
    def load():
        w = file.raw(name)[1]
        if rows is not None:
            w = w[rows[0]:rows[1]]
        if plus_one:
            w = widen(w) + np.float32(1)
        if column_order is not None:
            w = permute_head_columns(w, *column_order)
        return w if order is None else permute_heads(w, heads, order)
    load.source = name  # what a refusal of its values names
    return load


def checked_tensor(files, ours, name, expected, matrix_types):
    """The file that holds tensor `name` (a piece of our tensor `ours`), refusing now, before
    anything is written, a tensor that is missing, of a shape other than `expected` (a list) or
    not of a float type; a matrix's stored type is added to the set matrix_types. Every
    Hugging Face reader (read_hf, read_gemma4) checks its pieces with it."""
    if name not in files:
        raise ExportError(f"missing tensor {name}")
    stored = files[name].entries[name]["shape"]
    if stored != expected:
        raise ExportError(f"tensor {name} has shape {stored}, expected {expected}")
    dtype, _ = files[name].raw(name)
    if ours in MATRIX_TENSORS:
        matrix_types.add(SAFETENSORS_TYPES[dtype])
    return files[name]


def matrices_type(matrix_types):
    """The matrices' stored type: the one type they all share, else "f32" (exact for all of
    them, said on stderr)."""
    if len(matrix_types) > 1:
        warn("the matrices are stored in more than one type; writing float32 (exact for all of them)")
    return next(iter(matrix_types)) if len(matrix_types) == 1 else "f32"


def text_config(config):
    """(the text model's config, True when config.json is a multimodal one): a multimodal config.json
    (Gemma 3 4B and larger, Gemma 4) nests its text model's in text_config, which takes the keys
    Family.inherited of the whole where it has none; the other towers are left out (said on stderr)."""
    outer_type = config.get("model_type")
    text_type = nested_family(outer_type)
    if text_type is None:
        return dict(config), False
    inner = config.get("text_config")
    if not isinstance(inner, dict):
        raise ExportError(f"config.json: model_type '{outer_type}' without a text_config object")
    inner = dict(inner)
    inner.setdefault("model_type", text_type)
    if inner["model_type"] != text_type:
        raise ExportError(f"config.json: text_config's model_type {inner['model_type']!r} is not '{text_type}'")
    for key in FAMILIES[text_type].inherited:
        if key in config and key not in inner:
            inner[key] = config[key]
    inner.pop("architectures", None)
    return inner, True


def hf_text_model_names(files):
    """For a multimodal Gemma 3 checkpoint: a function from a text model's tensor name
    (model.layers..., lm_head.weight) to the name this checkpoint stores it under
    (language_model.model... in transformers 4.5x, model.language_model... later)."""
    for model, head in (("language_model.model.", "language_model.lm_head."),
                        ("model.language_model.", "lm_head."), ("model.", "lm_head.")):
        if model + "embed_tokens.weight" in files:
            return lambda name: (model + name[len("model."):] if name.startswith("model.")
                                 else head + name[len("lm_head."):])
    raise ExportError("multimodal gemma3 checkpoint: no text model's embed_tokens.weight found")


def fused_piece(c, name, fused, expected):
    """Phi-3: (the fused tensor's name, the rows (first, end) of the band that is the tensor `name`,
    the fused shape), for fused = Family.fused's (fused tensor, band)."""
    fused_name, part = fused
    layer_prefix = name[:name.index("self_attn.") if "self_attn." in name else name.index("mlp.")]
    if fused_name.startswith("self_attn."):
        sizes = [c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim, c.n_kv_heads * c.head_dim]
    else:
        sizes = [c.hidden_dim, c.hidden_dim]
    first = sum(sizes[:part])
    return layer_prefix + fused_name, (first, first + sizes[part]), [sum(sizes), expected[1]]


def config_from_json(config):
    """(the text model's config dict, its Config with the rotary settings, the rotary dim that
    tells the row permutation) of a config.json: every value it gives checked as it is read."""
    config = text_config(config)[0]
    c = hf_config(config)
    c.rope_theta, c.rope_fraction, scaling, rotary_dim = hf_rope(config, c.head_dim, c.seq_len)
    c.longrope_factors = scaling.pop("longrope_factors", None)
    c.set_scaling(**scaling)
    if c.longrope_factors is not None:
        if len(c.longrope_factors[0]) != rotated_pairs(c):
            raise ExportError(f"config.json: longrope has {len(c.longrope_factors[0])} factors per set for "
                              f"{rotated_pairs(c)} rotated pairs")
        try:
            check_rope_angles(c)
        except ExportError as e:
            raise ExportError(f"config.json: {e}")
    return config, c, rotary_dim


# ----------------------------------------------------------------------------
# Gemma 4 (model_type gemma4, its text_config; or gemma4_text): docs/format.md's per-layer
# records, v norm, layer scalars and per-layer inputs. The norms are stored as trained (x * w,
# no Gemma 3 "1 + w"); q . k is scaled by 1.

G4_SLIDING, G4_FULL = "sliding_attention", "full_attention"
GEMMA4_DEFAULT_ROPE = {G4_SLIDING: {"rope_type": "default", "rope_theta": 10000.0},
                       G4_FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0}}
# Gemma4TextConfig's published defaults (transformers' configuration_gemma4.py) for the keys read
# here: a key config.json does not give takes its default, and gemma4_defaults_note says so
# (layer_types None: five sliding layers to one full)
GEMMA4_DEFAULTS = {"hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 30, "num_attention_heads": 8,
                   "num_key_value_heads": 4, "head_dim": 256, "global_head_dim": 512, "vocab_size": 262144,
                   "vocab_size_per_layer_input": 262144, "hidden_size_per_layer_input": 256, "sliding_window": 512,
                   "rms_norm_eps": 1e-6, "max_position_embeddings": 131072, "num_kv_shared_layers": 0,
                   "tie_word_embeddings": True, "attention_k_eq_v": False, "use_double_wide_mlp": False,
                   "enable_moe_block": False, "final_logit_softcapping": None, "rope_parameters": GEMMA4_DEFAULT_ROPE,
                   "layer_types": None}
# the keys whose null transformers also reads as their default (the booleans, the two it computes)
GEMMA4_NULL_IS_DEFAULT = {"tie_word_embeddings", "attention_k_eq_v", "use_double_wide_mlp", "enable_moe_block",
                          "rope_parameters", "layer_types"}
# where the text decoder's tensors are: (prefix of model.*, the classifier's name)
GEMMA4_PREFIXES = [("model.language_model.", "lm_head.weight"),              # Gemma4ForConditionalGeneration
                   ("language_model.model.", "language_model.lm_head.weight"),
                   ("model.", "lm_head.weight")]                             # Gemma4ForCausalLM


def gemma4_int(t, key, low=1):
    """A config integer, >= low; Gemma4TextConfig's default when config.json does not give the key. A
    null hidden_size_per_layer_input or num_kv_shared_layers is 0 (none), as transformers reads it;
    any other null is refused (transformers' typed config refuses it too)."""
    value = t[key] if key in t else GEMMA4_DEFAULTS.get(key)
    if value is None and key in ("hidden_size_per_layer_input", "num_kv_shared_layers"):
        value = 0
    if not is_int(value) or not low <= value <= INT32_MAX:
        raise ExportError(f"config.json: {key} {json.dumps(value)} must be an integer >= {low}")
    return value


def gemma4_refusals(t):
    """What this format cannot carry, refused before anything is read or written."""
    bidirectional = t.get("use_bidirectional_attention")
    if bidirectional == "all":
        raise ExportError("config.json: use_bidirectional_attention 'all' is not supported: run.c's attention is "
                          "causal (text tokens attend to earlier ones only)")
    if bidirectional not in (None, "vision"):  # "vision": images only; text stays causal
        raise ExportError(f"config.json: use_bidirectional_attention {json.dumps(bidirectional)} is not supported "
                          "(only null and 'vision')")
    if json_bool(t, "attention_bias", False):
        raise ExportError("config.json: attention_bias true: Gemma 4 with attention biases is not supported")
    per_layer = gemma4_int(t, "hidden_size_per_layer_input", 0)
    if per_layer and gemma4_int(t, "vocab_size_per_layer_input") != gemma4_int(t, "vocab_size"):
        raise ExportError(f"config.json: vocab_size_per_layer_input {gemma4_int(t, 'vocab_size_per_layer_input')} "
                          f"differs from vocab_size {gemma4_int(t, 'vocab_size')}: the format's per-layer embedding "
                          "has one row per token")


def gemma4_layer_types(t, n_layers):
    """layer_types as Gemma4TextConfig makes them: given, or five sliding to one full; the last
    layer full attention."""
    types = t.get("layer_types")
    if types is None:
        types = [G4_SLIDING if (i + 1) % 6 else G4_FULL for i in range(n_layers)]
    if not (isinstance(types, list) and len(types) == n_layers and all(x in (G4_SLIDING, G4_FULL) for x in types)):
        raise ExportError(f"config.json: layer_types must be a list of {n_layers} 'sliding_attention' or "
                          "'full_attention'")
    types = list(types)
    if types[-1] != G4_FULL:
        say_later("note: Gemma 4's last layer is full attention (as transformers makes it), whatever layer_types says")
        types[-1] = G4_FULL
    return types


def gemma4_rope(t, kind, head_dim, seq_len):
    """(theta, p, scaling, rotary_dim) of one layer kind's rope_parameters[kind]."""
    params = t.get("rope_parameters")
    params = GEMMA4_DEFAULT_ROPE if params is None else params
    if not isinstance(params, dict) or not isinstance(params.get(kind), dict):
        raise ExportError(f"config.json: rope_parameters must hold a {kind!r} object (Gemma 4's settings per layer "
                          "kind)")
    rope = params[kind]
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if kind == G4_FULL and rope_type != "proportional" and head_dim != gemma4_int(t, "head_dim"):
        raise ExportError(f"config.json: the full-attention layers' rope_type {rope_type!r}: transformers computes "
                          "it over head_dim, not the full layers' global_head_dim; only 'proportional' is supported")
    try:
        theta, p, scaling, rotary_dim = hf_rope({"rope_parameters": rope}, head_dim, seq_len)
    except ExportError as e:
        raise ExportError(f"rope_parameters.{kind}: {str(e).removeprefix('config.json: ')}")
    if scaling.get("rule") == RULE_LONGROPE:
        raise ExportError(f"config.json: rope_parameters.{kind}: longrope is not supported for Gemma 4")
    return theta, p, scaling, rotary_dim


def gemma4_config(t):
    """(Config with Gemma 4's per-layer records, the layer kinds, {rope setting: the row order of
    its heads}) of a text config (text_config's)."""
    gemma4_refusals(t)
    check_architecture(t)  # hidden_activation, experts, sliding_window's type
    dim, n_layers = gemma4_int(t, "hidden_size"), gemma4_int(t, "num_hidden_layers")
    n_heads, n_kv_heads = gemma4_int(t, "num_attention_heads"), gemma4_int(t, "num_key_value_heads")
    head_dim = gemma4_int(t, "head_dim")
    global_head_dim = t.get("global_head_dim", GEMMA4_DEFAULTS["global_head_dim"]) or head_dim
    if not is_int(global_head_dim) or global_head_dim < 1:
        raise ExportError(f"config.json: global_head_dim {json.dumps(global_head_dim)} must be a positive integer")
    for key, size in (("head_dim", head_dim), ("global_head_dim", global_head_dim)):  # before the row orders
        if head_size_problem(size, n_heads):
            raise ExportError(f"config.json: {key} {size}: {head_size_problem(size, n_heads)}")
    intermediate = gemma4_int(t, "intermediate_size")
    seq_len = gemma4_int(t, "max_position_embeddings")
    kinds = gemma4_layer_types(t, n_layers)
    window = gemma4_sliding_window(t, kinds)
    k_eq_v = json_bool(t, "attention_k_eq_v", GEMMA4_DEFAULTS["attention_k_eq_v"])
    global_kv_heads = n_kv_heads
    if k_eq_v:
        if not t.get("num_global_key_value_heads"):
            raise ExportError("config.json: attention_k_eq_v needs num_global_key_value_heads")
        global_kv_heads = gemma4_int(t, "num_global_key_value_heads")
    n_shared = gemma4_int(t, "num_kv_shared_layers", 0)
    if n_shared >= n_layers:
        raise ExportError(f"config.json: num_kv_shared_layers {n_shared} leaves no layer of the {n_layers} that "
                          "computes its own keys and values")
    first_shared = n_layers - n_shared
    double_wide = json_bool(t, "use_double_wide_mlp", GEMMA4_DEFAULTS["use_double_wide_mlp"]) and n_shared > 0
    # 26B-A4B: experts beside every layer's feed-forward
    moe = json_bool(t, "enable_moe_block", GEMMA4_DEFAULTS["enable_moe_block"])
    c = Config(dim=dim, hidden_dim=intermediate, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads,
               vocab_size=gemma4_int(t, "vocab_size"), seq_len=seq_len,
               shared_classifier=json_bool(t, "tie_word_embeddings", GEMMA4_DEFAULTS["tie_word_embeddings"]),
               norm_eps=hf_number(t.get("rms_norm_eps", GEMMA4_DEFAULTS["rms_norm_eps"]), "rms_norm_eps"))
    c.head_size = global_head_dim  # the first setting's (full) layers' head size
    c.qk_norm = c.post_norms = c.v_norm = c.layer_scalars = True
    c.activation = ACTIVATIONS.index("geglu-tanh")
    if moe:  # the experts' fields (routing 3: Gemma4TextRouter's)
        c.n_experts, c.n_experts_used = gemma4_int(t, "num_experts"), gemma4_int(t, "top_k_experts")
        c.expert_hidden, c.routing = gemma4_int(t, "moe_intermediate_size"), ROUTING_GEMMA4
        if c.n_experts_used > c.n_experts:
            raise ExportError(f"config.json: top_k_experts {c.n_experts_used} is above the {c.n_experts} experts")
    dtype = hf_dtype(t)
    c.embedding_multiplier = float(narrow_scalar(math.sqrt(dim), dtype))  # as Gemma4TextScaledWordEmbedding
    c.attention_scale = 1.0  # Gemma4TextAttention.scaling (0 would mean 1 / sqrt(head_size))
    if t.get("final_logit_softcapping") is not None:
        c.final_softcap = hf_positive(t["final_logit_softcapping"], "final_logit_softcapping", "a cap; null for none")
    per_layer = gemma4_int(t, "hidden_size_per_layer_input", 0)
    if per_layer:
        c.per_layer_dim = per_layer
        c.per_layer_multiplier = float(narrow_scalar(math.sqrt(per_layer), dtype))
    # the first setting: the full layers' (p-RoPE over global_head_dim); the second: the sliding layers'
    theta, p, scaling, full_rotary = gemma4_rope(t, G4_FULL, global_head_dim, seq_len)
    c.rope_theta, c.rope_fraction = theta, p
    c.set_scaling(**scaling)
    orders = {LAYER_ROPE_FIRST: pair_permutation(global_head_dim, full_rotary)}
    if G4_SLIDING in kinds:
        theta2, p2, scaling2, sliding_rotary = gemma4_rope(t, G4_SLIDING, head_dim, seq_len)
        if scaling2.get("rule", RULE_NONE) != RULE_NONE:
            raise ExportError("config.json: rope_parameters.sliding_attention: a scaling rule on the sliding layers "
                              "is not supported (export.py stores their theta and p only)")
        c.rope2 = {"rope_theta": theta2, "rope_fraction": p2}
        orders[LAYER_ROPE_SECOND] = pair_permutation(head_dim, sliding_rotary)
    records = []
    for i, kind in enumerate(kinds):
        full = kind == G4_FULL
        source = 0
        if i >= first_shared:  # KV sharing: the last unshared layer of its kind
            earlier = [j for j in range(first_shared) if kinds[j] == kind]
            if not earlier:
                raise ExportError(f"config.json: KV-shared layer {i} ({kind}) has no earlier unshared {kind} layer")
            source = earlier[-1] + 1
        records.append((LAYER_ROPE_FIRST if full else LAYER_ROPE_SECOND,
                        0 if full else window,
                        global_head_dim if full else head_dim,
                        global_kv_heads if full and k_eq_v else n_kv_heads,
                        intermediate * (2 if double_wide and i >= first_shared else 1),
                        source,
                        int(full and k_eq_v and not source),
                        int(moe)))
    c.layers = records
    gemma4_defaults_note(t, c, kinds)
    return c, kinds, orders


def gemma4_sliding_window(t, kinds):
    """The sliding layers' window (0 without sliding layers). A null one with sliding layers is
    refused: transformers refuses it too (its typed config wants an integer, and its sliding mask
    raises without one); taking 512 or full attention would silently change the model."""
    if G4_SLIDING not in kinds:
        return 0
    if "sliding_window" in t and t["sliding_window"] is None:
        layers = [i for i, kind in enumerate(kinds) if kind == G4_SLIDING]
        raise ExportError(f"config.json: sliding_window null, but layer_types has {len(layers)} sliding layers "
                          f"({', '.join(map(str, layers[:4]))}{', ...' if len(layers) > 4 else ''}): their window "
                          "is not given (transformers refuses it too)")
    return gemma4_int(t, "sliding_window")


def gemma4_defaults_note(t, c, kinds):
    """One note line (on success) naming the keys config.json does not give that Gemma4TextConfig's
    published defaults fill: the model they make is not necessarily the checkpoint's."""
    unused = {"vocab_size_per_layer_input"} if not c.per_layer_dim else set()
    if G4_SLIDING not in kinds:
        unused.add("sliding_window")
    taken = [key for key in GEMMA4_DEFAULTS if key not in unused
             and (key not in t or (t[key] is None and key in GEMMA4_NULL_IS_DEFAULT))]
    if taken:
        values = ["five sliding layers to one full" if key == "layer_types" else json.dumps(GEMMA4_DEFAULTS[key])
                  for key in taken]
        say_later(f"note: config.json gives no {', '.join(taken)}: Gemma4TextConfig's published defaults taken "
                  f"({', '.join(f'{key} {value}' for key, value in zip(taken, values))})")


def check_gemma4_parts(t, c, files, prefix):
    """Refuse a config.json that contradicts the checkpoint's tensors about a part the model may
    have or not, naming both: exported as the config says, the part's weights would be dropped
    (or looked for in vain). The parts: the per-layer inputs, the experts, and the full layers'
    value projection (none with attention_k_eq_v)."""
    shapes = layer_shapes(c)
    full = next((l for l, s in enumerate(shapes) if s.rope == LAYER_ROPE_FIRST and s.source == l), None)
    parts = [("hidden_size_per_layer_input", c.per_layer_dim > 0, prefix + "embed_tokens_per_layer.weight",
              "the per-layer inputs"),
             ("enable_moe_block", c.n_experts > 0, prefix + "layers.0.router.proj.weight", "the experts")]
    if full is not None:
        parts.append(("attention_k_eq_v", not shapes[full].values, f"{prefix}layers.{full}.self_attn.v_proj.weight",
                      "the full layers' value projection"))
    for key, configured, name, what in parts:
        if configured == (name in files):
            continue
        value = json.dumps(t[key]) if key in t else f"{json.dumps(GEMMA4_DEFAULTS[key])} (its default: not given)"
        if configured:
            raise ExportError(f"config.json: {key} {value}, but the checkpoint has no {name} ({what})")
        raise ExportError(f"config.json: {key} {value}, but the checkpoint has {what} ({name}): exported as the "
                          "config says, they would be dropped")


def check_gemma4_head_sizes(c, files, prefix):
    """Refuse head sizes the checkpoint's do not match, naming the config key: a layer's q_norm
    holds one weight per dimension of its heads (the sliding layers' head_dim, the full layers'
    global_head_dim)."""
    checked = set()
    for l, s in enumerate(layer_shapes(c)):
        key = "global_head_dim" if s.rope == LAYER_ROPE_FIRST else "head_dim"
        name = f"{prefix}layers.{l}.self_attn.q_norm.weight"
        if key in checked or name not in files:
            continue
        checked.add(key)
        stored = files[name].entries[name]["shape"]
        if stored != [s.head_size]:
            raise ExportError(f"config.json: {key} {s.head_size}: the checkpoint's heads of layer {l} are not "
                              f"{s.head_size} wide ({name} has shape {stored})")


def gemma4_tensors(c, orders, source):
    """{ROPE name: [pieces]} of a Gemma 4 model, from `source` (a Hugging Face checkpoint's or a GGUF
    file's): source.piece(ours, name, shape, heads, order, column_order) reads one piece, checked;
    source.name(ours, layer) and source.own(layer, name) name them; source.scalar(layer) is the
    layer scalar; source.experts(layer, tensors) adds a layer's experts. See read_gemma4."""
    dim, nh, L, P, V = c.dim, c.n_heads, c.n_layers, c.per_layer_dim, c.vocab_size
    shapes = layer_shapes(c)
    tensors = {name: [] for name, _ in tensor_shapes(c)}
    tensors["token_embedding"] = [source.piece("token_embedding", source.name("token_embedding"), (V, dim))]
    tensors["rms_final"] = [source.piece("rms_final", source.name("rms_final"), (dim,))]
    if not c.shared_classifier:
        tensors["wcls"] = [source.piece("wcls", source.name("wcls"), (V, dim))]
    for l, s in enumerate(shapes):
        order, hs, own = orders[s.rope], s.head_size, s.source == l
        q_dim, kv_dim = nh * hs, s.n_kv_heads * hs

        def add(ours, shape, own_name=None, **kw):
            """Layer l's piece of our tensor: named in HF_TENSORS, or own_name within the layer."""
            name = source.own(l, own_name) if own_name else source.name(ours, l)
            tensors[ours].append(source.piece(ours, name, shape, **kw))

        add("rms_att", (dim,))
        add("rms_post_att", (dim,))
        add("rms_ffn", (dim,))
        add("rms_post_ffn", (dim,))
        add("wq", (q_dim, dim), heads=nh, order=order)
        add("q_norm", (hs,), heads=1, order=order)
        if own:
            add("wk", (kv_dim, dim), heads=s.n_kv_heads, order=order)
            add("k_norm", (hs,), heads=1, order=order)
            if not s.values:
                add("wv", (kv_dim, dim))
        permuted_values = shapes[s.source].values  # the cache's values are the permuted key projection
        add("wo", (dim, q_dim), column_order=(nh, order) if permuted_values else None)
        add("w1", (s.hidden_dim, dim))
        add("w2", (dim, s.hidden_dim))
        add("w3", (s.hidden_dim, dim))
        tensors["layer_scalars"].append(source.scalar(l))
        if s.experts:  # 26B-A4B: the router, the experts (gate and up fused, gate first) and their norms
            E = c.n_experts
            add("router", (E, dim), "router.proj.weight")
            source.experts(l, tensors)
            add("router_scale", (dim,), "router.scale")
            add("expert_scale", (E,), "router.per_expert_scale")
            add("rms_pre_experts", (dim,))
            add("rms_post_dense", (dim,))
            add("rms_post_experts", (dim,))
        if P:
            add("per_layer_gate", (P, dim))
            add("per_layer_projection_out", (dim, P))
            add("rms_per_layer", (dim,))
    if P:
        for ours, shape in (("per_layer_embedding", (V, L * P)), ("per_layer_projection_in", (L * P, dim)),
                            ("per_layer_projection_norm", (P,))):
            tensors[ours] = [source.piece(ours, source.name(ours), shape)]
    return tensors


def read_gemma4(model_dir, t, multimodal):
    """Read a Gemma 4 checkpoint (its text decoder): (Config, {name: [loaders]}, the matrices' type).

    Every layered tensor is the layers' pieces back to back (docs/format.md): q's and k's rows
    (and q_norm, k_norm) in adjacent pairs per head with the layer's head size; wk and k_norm of
    the layers with their own cache only (the KV-shared layers' k_proj, v_proj and k_norm, which
    published checkpoints still carry, are not used); wv of those whose values are not the keys.
    On a layer whose values are the key projection (attention_k_eq_v, full layers), run.c takes
    them in wk's permuted row order, so the attention output of every head arrives permuted: wo's
    columns are permuted per head the same way (on the layers that read such a cache)."""
    c, kinds, orders = gemma4_config(t)
    files = open_safetensors(model_dir)
    found = [(p, head) for p, head in GEMMA4_PREFIXES if p + "embed_tokens.weight" in files]
    if not found:
        raise ExportError("gemma4 checkpoint: no embed_tokens.weight under model.language_model. or model.")
    prefix, head_name = found[0]
    if not c.shared_classifier and head_name not in files:
        c.shared_classifier = True  # transformers ties it then
    c.check()
    check_gemma4_head_sizes(c, files, prefix)
    check_gemma4_parts(t, c, files, prefix)
    matrix_types = set()

    class Source:
        """Where read_gemma4's tensors are: this checkpoint's safetensors."""
        @staticmethod
        def piece(ours, name, shape, heads=None, order=None, column_order=None):
            file = checked_tensor(files, ours, name, list(shape), matrix_types)
            return lazy_tensor(file, name, heads, order, column_order=column_order)

        @staticmethod
        def name(ours, layer=None):
            """Our tensor's name in this checkpoint (the text decoder's under prefix)."""
            if ours == "wcls":
                return head_name
            return prefix + names[ours].format(i=layer).removeprefix("model.")

        @staticmethod
        def own(layer, name):
            """A tensor of layer's that HF_TENSORS does not name (the router's, the experts')."""
            return f"{prefix}layers.{layer}.{name}"

        @staticmethod
        def scalar(layer):
            name = Source.name("layer_scalars", layer)
            if name not in files:
                return np.ones(1, np.float32)  # transformers' buffer default
            stored = files[name].entries[name]["shape"]
            if math.prod(stored) != 1:
                raise ExportError(f"tensor {name} has shape {stored}, expected [1]")
            return lambda: widen(files[name].raw(name)[1]).reshape(1)

        @staticmethod
        def experts(layer, tensors):
            """The experts' pieces (gate and up fused, gate first), one loader per expert."""
            E, H, dim = c.n_experts, c.expert_hidden, c.dim
            tensors["expert_w1"] += expert_pieces(Source.own(layer, "experts.gate_up_proj"), (E, 2 * H, dim), 0, H)
            tensors["expert_w2"] += expert_pieces(Source.own(layer, "experts.down_proj"), (E, dim, H), 0, dim)
            tensors["expert_w3"] += expert_pieces(Source.own(layer, "experts.gate_up_proj"), (E, 2 * H, dim), H, 2 * H)

    def expert_pieces(name, shape, first, end):
        """Rows first..end of each expert of a stacked (experts, rows, cols) tensor, one loader each."""
        Source.piece("expert_w1", name, shape)  # its presence, shape and dtype, checked now
        def loader(e):
            def load():
                return files[name].raw(name)[1][e, first:end]
            load.source = f"{name}[{e}]"  # what a refusal of its values names
            return load
        return [loader(e) for e in range(shape[0])]

    names = {**HF_TENSORS, **HF_FOUR_NORMS}
    tensors = gemma4_tensors(c, orders, Source)
    source_type = matrices_type(matrix_types)
    if multimodal:
        say_later("note: gemma4: the text decoder is exported; the vision and audio towers are left out")
    return c, tensors, source_type


# ----------------------------------------------------------------------------
# Reading a GGUF file (llama.cpp's format): its metadata as the config.json it came from, its
# tensors by name. The container itself is read by read_gguf_file (below); here GGUF's names
# and conventions are mapped onto the families' table, so that a GGUF file meets the same
# family logic as a Hugging Face directory (config_from_json), not a copy of it. What GGUF
# stores differently (docs/gguf.md):
#   - llama.cpp's `llama` and `smollm3` architectures have q and k in adjacent pairs already (the
#     converter permutes them): they are this format's order and are copied as they are; every
#     other architecture keeps Hugging Face's halves, permuted here as read_hf permutes them;
#   - gemma, gemma2 and gemma3 store norms as 1 + w (computed in float32), which is what this
#     format stores for Gemma; gemma4 stores w, as this format does;
#   - keys llama.cpp does not write are taken as llama.cpp's code takes them (gguf_config, GEMMA_27B_LAYERS);
#   - Llama 3's scaling is a rope_freqs tensor of per-pair divisors (gguf_llama3_rule).

# The tensors' GGUF names (ROPE name: name; {i} the layer), beside HF_TENSORS
GGUF_TENSORS = {
    "token_embedding": "token_embd.weight",
    "rms_final": "output_norm.weight",
    "wcls": "output.weight",
    "rms_att": "blk.{i}.attn_norm.weight",
    "wq": "blk.{i}.attn_q.weight",
    "wk": "blk.{i}.attn_k.weight",
    "wv": "blk.{i}.attn_v.weight",
    "wo": "blk.{i}.attn_output.weight",
    "rms_ffn": "blk.{i}.ffn_norm.weight",  # Gemma 2, 3: pre_feedforward_layernorm, the same place
    "w1": "blk.{i}.ffn_gate.weight",
    "w2": "blk.{i}.ffn_down.weight",
    "w3": "blk.{i}.ffn_up.weight",
    "bq": "blk.{i}.attn_q.bias",
    "bk": "blk.{i}.attn_k.bias",
    "bv": "blk.{i}.attn_v.bias",
    "q_norm": "blk.{i}.attn_q_norm.weight",
    "k_norm": "blk.{i}.attn_k_norm.weight",
    "rms_post_att": "blk.{i}.post_attention_norm.weight",
    "rms_post_ffn": "blk.{i}.post_ffw_norm.weight",
    "router": "blk.{i}.ffn_gate_inp.weight",
    "expert_w1": "blk.{i}.ffn_gate_exps.weight",
    "expert_w2": "blk.{i}.ffn_down_exps.weight",
    "expert_w3": "blk.{i}.ffn_up_exps.weight",
}
# Phi-3's fused tensors: (GGUF name, which band of its rows) as Family.fused's
GGUF_FUSED = {"wq": ("blk.{i}.attn_qkv.weight", 0), "wk": ("blk.{i}.attn_qkv.weight", 1),
              "wv": ("blk.{i}.attn_qkv.weight", 2), "w1": ("blk.{i}.ffn_up.weight", 0),
              "w3": ("blk.{i}.ffn_up.weight", 1)}
# the architectures whose q and k rows llama.cpp's converter permutes into adjacent pairs (its
# LLAMA_ROPE_TYPE_NORM models): this format's order; the others keep Hugging Face's halves
GGUF_ADJACENT_PAIRS = {"llama", "smollm3"}
# the GGUF tensor types this format holds as they are, by their ggml names
GGUF_KINDS = {"F32": "f32", "BF16": "bf16", "F16": "f16", **{k.ggml: name for name, k in BLOCK_KINDS.items()}}
GGUF_NUMPY = {"F32": "<f4", "BF16": "<u2", "F16": "<f2"}


def gguf_family(g):
    """(model_type, Family) of a GGUF file's general.architecture: llama.cpp's `llama` is Llama's
    (Mistral's and SmolLM2's too: their files say no more), Mixtral's when it has experts."""
    arch = g.metadata.get("general.architecture")
    if not isinstance(arch, str):
        raise ExportError(f"{g.path}: general.architecture is missing or not a string")
    names = [t for t, f in FAMILIES.items() if f.gguf == arch]
    if not names:
        known = sorted({f.gguf for f in FAMILIES.values()})
        raise ExportError(f"{g.path}: general.architecture {arch!r} is not supported (only {', '.join(known)})")
    if arch == "llama":
        names = ["mixtral" if gguf_value(g, "llama.expert_count", int, 0) else "llama"]
    return names[0], FAMILIES[names[0]]


def gguf_value(g, key, kind, default=None):
    """A metadata value of the Python kind int, float, bool or str (an int is a float too), or
    default when the file has no such key; one line naming the key otherwise."""
    if key not in g.metadata:
        if default is None:
            raise ExportError(f"{g.path}: metadata key {key} is missing")
        return default
    value = g.metadata[key]
    ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        ok, value = True, float(value)
    if not ok:
        raise ExportError(f"{g.path}: metadata {key} is {value!r}, expected {kind.__name__}")
    return value


def gguf_list(g, key):
    """A metadata array as a Python list (a numeric array's values as ints, floats or bools), or
    None when the key is absent or not an array."""
    value = g.metadata.get(key)
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value if isinstance(value, list) else None


def gguf_positive(g, key, default=None, limit=INT32_MAX):
    """A metadata integer in [1, limit] (run.c's limit on what it sizes: checked here, before
    anything is built per layer or per head)."""
    value = gguf_value(g, key, int, default)
    if not 0 < value <= limit:
        raise ExportError(f"{g.path}: metadata {key} {value} must be in [1, {limit}]"
                          + (" (run.c's limit)" if limit != INT32_MAX else ""))
    return value


def gguf_tensor(g, name, what="tensor"):
    """The GGUF tensor `name` (one line when the file has none)."""
    if name not in g.tensors:
        raise ExportError(f"{g.path}: {what} {name} is missing")
    return g.tensors[name]


# What llama.cpp's code takes for the keys its converter does not write, by architecture
# (docs/gguf.md): Gemma 2's and 3's query scale is 1/sqrt(head_dim) but for their 27B models
# (46 and 62 layers: 1/sqrt(hidden / heads)); Gemma 3's layers slide but every sixth; SmolLM3's
# every fourth layer is NoPE (configuration_smollm3.py's default, which hf_layers applies);
# Qwen3-MoE renormalizes the chosen experts' weights. Mistral's sliding window does not reach
# the file (its architecture is `llama`): llama.cpp attends over the whole context, and so does
# the converted file.
GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}


def gguf_rope_scaling(g, arch):
    """The rope_scaling dict of config.json that the file's rope.scaling keys describe, or None
    (Llama 3's and Phi-3's factor tensors are read by gguf_llama3_rule and gguf_longrope)."""
    kind = gguf_value(g, f"{arch}.rope.scaling.type", str, "none")
    original = gguf_value(g, f"{arch}.rope.scaling.original_context_length", int, 0)
    if kind == "none":
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": gguf_value(g, f"{arch}.rope.scaling.factor", float)}
    if kind == "yarn":
        rope = {"rope_type": "yarn", "factor": gguf_value(g, f"{arch}.rope.scaling.factor", float)}
        if original:
            rope["original_max_position_embeddings"] = original
        return rope
    if kind == "longrope":
        return None  # phi3: gguf_longrope
    raise ExportError(f"{g.path}: metadata {arch}.rope.scaling.type {kind!r} is not supported (only none, linear, "
                      "yarn, and Llama 3's and Phi-3's factor tensors)")


def gguf_float_tensor(g, name):
    """A small F32 tensor's values (rope_freqs, the longrope factors) as float64s."""
    t = gguf_tensor(g, name)
    if t.type_name != "F32" or len(t.shape) != 1:
        raise ExportError(f"{g.path}: tensor {name} must be a one-dimensional F32 tensor (it is {t.type_name} "
                          f"{list(t.shape)})")
    values = gguf_stored(g, name)[1].astype(np.float64)
    if not np.all(np.isfinite(values)) or not np.all(values > 0):
        raise ExportError(f"{g.path}: tensor {name}: every factor must be finite and > 0")
    return values


def gguf_llama3_rule(g, base, head_dim, rope_freqs):
    """The llama3 rule a rope_freqs tensor encodes. llama.cpp divides pair i's frequency by
    rope_freqs[i], which its converter computed from config.json's factor, low_freq_factor,
    high_freq_factor and original_max_position_embeddings L (the 2025 converter read L at the
    top level only, default 8192; later ones in rope_scaling too): 1 for wavelengths below
    L / high, the factor above L / low, a smooth blend between. The rule is the one whose
    divisors these are (each within 2^-20 of the stored float32: the converter's float32
    arithmetic), the factor the largest divisor, tried: low 1 and high 4 (every Llama 3.x) with
    L 8192, with the L each blended divisor gives, and with an L between the kept and the divided
    wavelengths when none is blended (every such L gives the same frequencies); then low 1 with
    high and L solved from two blended divisors. None fits: one line naming the tensor."""
    if len(rope_freqs) != head_dim // 2:
        raise ExportError(f"{g.path}: tensor rope_freqs has {len(rope_freqs)} entries for {head_dim // 2} pairs")
    factor = float(rope_freqs.max())
    with np.errstate(over="ignore", invalid="ignore"):
        wavelen = 2 * math.pi * base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if not (base > 0 and np.all(np.isfinite(wavelen))):
        raise ExportError(f"{g.path}: metadata llama.rope.freq_base {base} gives wavelengths that are not finite "
                          "numbers")

    def divisors(low, high, original):
        smooth = (original / wavelen - low) / (high - low)
        with np.errstate(divide="ignore"):
            mid = 1 / ((1 - smooth) / factor + smooth)
        return np.where(wavelen < original / high, 1.0, np.where(wavelen > original / low, factor, mid))

    candidates = [(1.0, 4.0, 8192)]
    middle = np.flatnonzero((rope_freqs > 1) & (rope_freqs < factor))
    blend = (1 / rope_freqs - 1 / factor) / (1 - 1 / factor) if factor > 1 else np.zeros_like(rope_freqs)
    candidates += [(1.0, 4.0, round(wavelen[i] * (3 * blend[i] + 1))) for i in middle]
    divided = wavelen[rope_freqs == factor]
    if not len(middle) and len(divided):
        candidates.append((1.0, 4.0, math.floor(divided.min())))
    if len(middle) >= 2:  # blend_i = (L / w_i - 1) / (high - 1): a line in 1 / w_i
        a, b = np.polyfit(1 / wavelen[middle], blend[middle], 1)
        if a > 0 and b < 0:
            high = 1 - 1 / b
            candidates.append((1.0, float(high), round(a * (high - 1))))
    for low, high, original in candidates:
        if high > low and original > 0 and np.allclose(divisors(low, high, original), rope_freqs, rtol=2**-20, atol=0):
            return {"rope_type": "llama3", "factor": factor, "low_freq_factor": low, "high_freq_factor": high,
                    "original_max_position_embeddings": original}
    raise ExportError(f"{g.path}: tensor rope_freqs: its per-pair divisors are not the llama3 rule's for any "
                      "low/high frequency factors and original length tried")


def gguf_longrope(g, arch, config, head_dim):
    """Phi-3's longrope (rope_factors_short / _long tensors, their original length and attention
    factor keys) as config.json's rope_scaling."""
    short = gguf_float_tensor(g, "rope_factors_short.weight")
    long = gguf_float_tensor(g, "rope_factors_long.weight")
    if len(short) != len(long):
        raise ExportError(f"{g.path}: rope_factors_short has {len(short)} entries, rope_factors_long {len(long)}")
    rope = {"rope_type": "longrope", "short_factor": [float(x) for x in short],
            "long_factor": [float(x) for x in long]}
    original = gguf_value(g, f"{arch}.rope.scaling.original_context_length", int)
    config["original_max_position_embeddings"] = original
    if f"{arch}.rope.scaling.attn_factor" in g.metadata:
        rope["attention_factor"] = gguf_value(g, f"{arch}.rope.scaling.attn_factor", float)
    return rope


def gguf_config(g):
    """The config.json dict (model_type and the keys config_from_json reads) that a GGUF file's
    metadata and tensor shapes describe, as llama.cpp reads them."""
    model_type, family = gguf_family(g)
    arch = family.gguf
    embedding = gguf_tensor(g, GGUF_TENSORS["token_embedding"])
    if len(embedding.shape) != 2:
        raise ExportError(f"{g.path}: tensor token_embd.weight has shape {list(embedding.shape)}; expected "
                          "(vocab, embedding_length)")
    dim = gguf_positive(g, f"{arch}.embedding_length", limit=RUN_LIMITS["dim"])
    n_heads = gguf_positive(g, f"{arch}.attention.head_count", limit=RUN_LIMITS["dim"])
    n_layers = gguf_positive(g, f"{arch}.block_count", limit=RUN_LIMITS["n_layers"])
    per_layer = lambda key, read: 1 if family.layer_records and gguf_list(g, key) is not None else read(key)
    config = {
        "model_type": model_type, "architectures": [family.architecture],
        "hidden_size": dim, "num_hidden_layers": n_layers, "num_attention_heads": n_heads,
        # Gemma 4's lists of per-layer values are read by gguf_gemma4_config
        "num_key_value_heads": per_layer(f"{arch}.attention.head_count_kv", lambda k: gguf_positive(g, k, n_heads)),
        "intermediate_size": per_layer(f"{arch}.feed_forward_length", lambda k: gguf_positive(g, k)),
        "max_position_embeddings": gguf_positive(g, f"{arch}.context_length"),
        "rms_norm_eps": gguf_value(g, f"{arch}.attention.layer_norm_rms_epsilon", float),
        "rope_theta": gguf_value(g, f"{arch}.rope.freq_base", float, 10000.0),
        "vocab_size": int(embedding.shape[0]),
        "tie_word_embeddings": GGUF_TENSORS["wcls"] not in g.tensors,
    }
    if embedding.shape[1] != dim:
        raise ExportError(f"{g.path}: tensor token_embd.weight has rows of {embedding.shape[1]}, but "
                          f"{arch}.embedding_length is {dim}")
    key_length = gguf_value(g, f"{arch}.attention.key_length", int, 0)
    value_length = gguf_value(g, f"{arch}.attention.value_length", int, key_length)
    if key_length != value_length:
        raise ExportError(f"{g.path}: metadata {arch}.attention.key_length {key_length} differs from value_length "
                          f"{value_length}; this format has one head size")
    head_dim = key_length or dim // n_heads
    if key_length:
        config["head_dim"] = key_length
    rotary = gguf_value(g, f"{arch}.rope.dimension_count", int, head_dim)
    if rotary != head_dim:
        if arch != "phi3" or not 0 < rotary < head_dim:
            raise ExportError(f"{g.path}: metadata {arch}.rope.dimension_count {rotary} differs from the head size "
                              f"{head_dim}; partial rotation is read for phi3 only")
        config["partial_rotary_factor"] = rotary / head_dim
    window = gguf_value(g, f"{arch}.attention.sliding_window", int, 0)
    if window and (family.sliding in ("all", "alternate", "pattern") or family.layer_records):
        config["sliding_window"] = window
    for key, ours in (("attn_logit_softcapping", "attn_logit_softcapping"),
                      ("final_logit_softcapping", "final_logit_softcapping")):
        if f"{arch}.{key}" in g.metadata:
            config[ours] = gguf_value(g, f"{arch}.{key}", float)
    if family.gemma_block or family.layer_records:
        # the embedding times sqrt(hidden_size) (and Gemma 4's per-layer one times sqrt(P)): llama.cpp
        # takes sqrtf in float32, where transformers rounds it to the checkpoint's dtype
        config["torch_dtype"] = "float32"
        config["hidden_activation"] = "gelu_pytorch_tanh"
    if family.post_norms:  # query_pre_attn_scalar: llama.cpp's rule
        scale_by_width = n_layers == GEMMA_27B_LAYERS.get(arch)
        config["query_pre_attn_scalar"] = dim // n_heads if scale_by_width else head_dim
    if family.local_rope:
        config["rope_local_base_freq"] = gguf_value(g, f"{arch}.rope.freq_base_swa", float, 10000.0)
        config["sliding_window_pattern"] = gguf_positive(g, f"{arch}.attention.sliding_window_pattern", 6)
    if family.experts and not family.layer_records:
        experts = [l for l in range(n_layers) if GGUF_TENSORS["router"].format(i=l) in g.tensors]
        config[family.experts] = gguf_positive(g, f"{arch}.expert_count", limit=RUN_LIMITS["n_experts"])
        config["num_experts_per_tok"] = gguf_positive(g, f"{arch}.expert_used_count", limit=RUN_LIMITS["n_experts"])
        if family.dense_layers:  # Qwen3-MoE: the layers without a router keep their feed-forward
            config["moe_intermediate_size"] = gguf_positive(g, f"{arch}.expert_feed_forward_length")
            config["norm_topk_prob"] = True
            config["mlp_only_layers"] = [l for l in range(n_layers) if l not in experts]
        elif len(experts) != n_layers:
            missing = next(l for l in range(n_layers) if l not in experts)
            raise ExportError(f"{g.path}: tensor {GGUF_TENSORS['router'].format(i=missing)} is missing")
    rope_freqs = gguf_float_tensor(g, "rope_freqs.weight") if "rope_freqs.weight" in g.tensors else None
    if family.layer_records:
        pass  # Gemma 4's rope_freqs: gguf_gemma4_config
    elif rope_freqs is not None:
        if arch != "llama":
            raise ExportError(f"{g.path}: tensor rope_freqs.weight is read for the llama architecture only")
        config["rope_scaling"] = gguf_llama3_rule(g, config["rope_theta"], head_dim, rope_freqs)
    elif "rope_factors_long.weight" in g.tensors:
        config["rope_scaling"] = gguf_longrope(g, arch, config, head_dim)
    else:
        config["rope_scaling"] = gguf_rope_scaling(g, arch)
    return config


# Gemma 4's own GGUF names (ROPE name: name), beside GGUF_TENSORS; 26B-A4B's router and experts:
# GGUF_GEMMA4_OWN (read_gemma4's names within a layer: GGUF's), and the experts' gate and up
# projections fused in ffn_gate_up_exps (gate rows first), as in the checkpoint
GGUF_GEMMA4_TENSORS = {
    "rms_pre_experts": "blk.{i}.pre_ffw_norm_2.weight",
    "rms_post_dense": "blk.{i}.post_ffw_norm_1.weight",
    "rms_post_experts": "blk.{i}.post_ffw_norm_2.weight",
    "layer_scalars": "blk.{i}.layer_output_scale.weight",
    "per_layer_gate": "blk.{i}.inp_gate.weight",
    "per_layer_projection_out": "blk.{i}.proj.weight",
    "rms_per_layer": "blk.{i}.post_norm.weight",
    "per_layer_embedding": "per_layer_token_embd.weight",
    "per_layer_projection_in": "per_layer_model_proj.weight",
    "per_layer_projection_norm": "per_layer_proj_norm.weight",
}


GGUF_GEMMA4_OWN = {"router.proj.weight": "ffn_gate_inp.weight", "router.scale": "ffn_gate_inp.scale",
                   "router.per_expert_scale": "ffn_down_exps.scale"}


def gguf_gemma4_config(g, config):
    """Gemma 4's text config (gemma4_config's keys) from a gemma4 GGUF's metadata, added to the
    common keys gguf_config read. The converter writes the sliding and full layers' head sizes as
    key_length_swa and key_length, the layer kinds as sliding_window_pattern (true: sliding),
    per-layer feed-forward widths when the KV-shared layers' are doubled, per-layer KV head counts
    when the full layers have their own, and the full layers' proportional RoPE as a rope_freqs
    tensor whose unrotated pairs are 1e30 (divided by 1e30, a frequency is 0: they do not turn)."""
    arch, n_layers = "gemma4", config["num_hidden_layers"]
    if "gemma4.expert_count" in g.metadata:  # 26B-A4B: experts beside every layer's feed-forward
        config["enable_moe_block"] = True
        config["num_experts"] = gguf_positive(g, f"{arch}.expert_count", limit=RUN_LIMITS["n_experts"])
        config["top_k_experts"] = gguf_positive(g, f"{arch}.expert_used_count", limit=RUN_LIMITS["n_experts"])
        config["moe_intermediate_size"] = gguf_positive(g, f"{arch}.expert_feed_forward_length")
    kinds = gguf_list(g, f"{arch}.attention.sliding_window_pattern")
    if not (isinstance(kinds, list) and len(kinds) == n_layers and all(isinstance(k, bool) for k in kinds)):
        raise ExportError(f"{g.path}: metadata {arch}.attention.sliding_window_pattern must be {n_layers} booleans")
    config["layer_types"] = [G4_SLIDING if k else G4_FULL for k in kinds]
    config["global_head_dim"] = config.pop("head_dim", config["hidden_size"] // config["num_attention_heads"])
    config["head_dim"] = gguf_positive(g, f"{arch}.attention.key_length_swa", config["global_head_dim"])
    if gguf_value(g, f"{arch}.attention.value_length_swa", int, config["head_dim"]) != config["head_dim"]:
        raise ExportError(f"{g.path}: metadata {arch}.attention.value_length_swa differs from key_length_swa")
    n_shared = gguf_value(g, f"{arch}.attention.shared_kv_layers", int, 0)
    if not 0 <= n_shared < n_layers:
        raise ExportError(f"{g.path}: metadata {arch}.attention.shared_kv_layers {n_shared} must be in [0, {n_layers})")
    config["num_kv_shared_layers"] = n_shared
    widths = gguf_list(g, f"{arch}.feed_forward_length")
    if widths is not None:  # doubled on the KV-shared layers
        base = widths[0] if widths else 0
        doubled = [base if i < n_layers - n_shared else 2 * base for i in range(n_layers)]
        if widths not in ([base] * n_layers, doubled) or not (is_int(base) and base > 0):
            raise ExportError(f"{g.path}: metadata {arch}.feed_forward_length {widths}: neither one width nor "
                              f"one doubled on the {n_shared} KV-shared layers")
        config["intermediate_size"], config["use_double_wide_mlp"] = base, widths != [base] * n_layers
    heads = gguf_list(g, f"{arch}.attention.head_count_kv")
    if heads is not None:  # the full layers' own KV head count
        full = {h for h, k in zip(heads, kinds) if not k}
        sliding = {h for h, k in zip(heads, kinds) if k}
        if len(heads) != n_layers or len(full) > 1 or len(sliding) > 1 or not all(is_int(h) and h > 0 for h in heads):
            raise ExportError(f"{g.path}: metadata {arch}.attention.head_count_kv {heads}: one count for the sliding "
                              "layers and one for the full layers")
        config["num_key_value_heads"] = next(iter(sliding), heads[0])
        config["num_global_key_value_heads"] = next(iter(full), heads[0])
    full_layers = [l for l in range(n_layers - n_shared) if not kinds[l]]
    if full_layers and f"blk.{full_layers[0]}.attn_v.weight" not in g.tensors:
        config["attention_k_eq_v"] = True  # 31B: the full layers' values are their keys
    config["hidden_size_per_layer_input"] = gguf_value(g, f"{arch}.embedding_length_per_layer_input", int, 0)
    if config["hidden_size_per_layer_input"]:
        config["vocab_size_per_layer_input"] = int(gguf_tensor(g, GGUF_GEMMA4_TENSORS["per_layer_embedding"]).shape[0])
    rotated = 1.0
    if "rope_freqs.weight" in g.tensors:
        freqs = gguf_float_tensor(g, "rope_freqs.weight")
        pairs = int(np.sum(freqs == 1))
        if len(freqs) != config["global_head_dim"] // 2 or not np.all(freqs[:pairs] == 1) or not np.all(freqs[pairs:] >= 1e30):
            raise ExportError(f"{g.path}: tensor rope_freqs.weight: a Gemma 4 file's is 1 for the rotated pairs, "
                              "then 1e30 for the others")
        rotated = 2 * pairs / config["global_head_dim"]
    config["rope_parameters"] = {
        G4_SLIDING: {"rope_type": "default", "rope_theta": gguf_value(g, f"{arch}.rope.freq_base_swa", float, 10000.0)},
        G4_FULL: {"rope_type": "proportional", "partial_rotary_factor": rotated,
                  "rope_theta": config.pop("rope_theta")}}
    config.pop("rope_scaling", None)
    config.pop("query_pre_attn_scalar", None)
    config.pop("sliding_window_pattern", None)
    config.pop("rope_local_base_freq", None)
    return config


def gguf_explicit_values(c):
    """Give each layer whose values are its keys (attention_k_eq_v: the layer spec's values 1) an
    explicit wv instead: its values field set to 0 in c.layers; returns those layers. A GGUF's
    attn_k is the key projection in the checkpoint's own row order (llama.cpp's converter does
    not permute Gemma's rows), so it is that wv as stored, and wo is then read as stored too:
    with values 1, run's values would arrive in wk's permuted order and wo's columns would have
    to be permuted to match, which a block type cannot be (its blocks run along a row). Done for
    every such GGUF, float or blocks, so that a block file and the float32 file of its
    dequantized weights convert to the same layout; the layers that share such a layer's cache
    (kv_source) then read values in the stored order as well."""
    keyed = {l for l, s in enumerate(layer_shapes(c)) if s.values}
    c.layers = [tuple(r[:6]) + (0,) + tuple(r[7:]) if l in keyed else r for l, r in enumerate(c.layers)]
    return keyed


def read_gguf_gemma4(g, config):
    """A gemma4 GGUF's Config and tensors, through gemma4_config and gemma4_tensors as read_gemma4
    reads a Hugging Face checkpoint (but with explicit values: gguf_explicit_values); its kinds of
    matrices."""
    c, kinds, orders = gemma4_config(gguf_gemma4_config(g, config))
    c.shared_classifier = config["tie_word_embeddings"]
    c.check()
    keyed = gguf_explicit_values(c)
    names = {**GGUF_TENSORS, **GGUF_GEMMA4_TENSORS}
    found = set()

    class Source:
        """Where gemma4_tensors' pieces are: this GGUF file."""
        @staticmethod
        def piece(ours, name, shape, heads=None, order=None, column_order=None):
            """One piece, checked (gguf_piece). column_order is never asked for here: no layer of a
            GGUF's file has values that are its keys (gguf_explicit_values)."""
            if column_order is not None:
                raise ExportError(f"{g.path}: tensor {name}: its columns would be permuted (a layer whose values "
                                  "are its keys), which export.py never does for a GGUF file")
            piece = gguf_piece(g, name, shape, None, heads, order)
            if ours in MATRIX_TENSORS:
                found.add(piece.kind if isinstance(piece, Blocks) else weight_type_of(piece))
            return piece

        @staticmethod
        def name(ours, layer=None):
            """Our tensor's GGUF name; the wv of a layer whose values are its keys is its attn_k."""
            return names["wk" if ours == "wv" and layer in keyed else ours].format(i=layer)

        @staticmethod
        def own(layer, name):
            return f"blk.{layer}.{GGUF_GEMMA4_OWN[name]}"

        @staticmethod
        def scalar(layer):
            return gguf_piece(g, Source.name("layer_scalars", layer), (1,))

        @staticmethod
        def experts(layer, tensors):
            """The layer's experts: gate (expert_w1) and up (expert_w3) rows of ffn_gate_up_exps, and
            ffn_down_exps."""
            E, H, dim = c.n_experts, c.expert_hidden, c.dim
            fused = f"blk.{layer}.ffn_gate_up_exps.weight"
            both = gguf_piece(g, fused, (E, 2 * H, dim))
            for ours, band in (("expert_w1", slice(0, H)), ("expert_w3", slice(H, 2 * H))):
                if isinstance(both, Blocks):
                    blocks = both.data.reshape(E, 2 * H, -1)[:, band]
                    piece = Blocks(both.kind, (E, H, dim), np.ascontiguousarray(blocks).reshape(-1), fused)
                else:
                    piece = np.ascontiguousarray(both[:, band])
                found.add(piece.kind if isinstance(piece, Blocks) else weight_type_of(piece))
                tensors[ours].append(piece)
            tensors["expert_w2"].append(Source.piece("expert_w2", f"blk.{layer}.ffn_down_exps.weight", (E, dim, H)))

    return c, gemma4_tensors(c, orders, Source), found


def gguf_stored(g, name):
    """(kind, array) of a tensor as this format holds it, unwidened: float32, bf16 as uint16
    bits, f16 as float16, with the tensor's shape; a block type (Q8_0, Q4_0, ..., Q6_K) as its
    structured blocks (BLOCK_KINDS' storage), (rows..., blocks per row): rows stay whole, so they can
    be cut into bands or permuted. Any other type: one line naming the tensor and its type."""
    t = gguf_tensor(g, name)
    kind = GGUF_KINDS.get(t.type_name)
    if kind is None:
        raise ExportError(f"{g.path}: tensor {name} is {t.type_name}; this format holds {', '.join(GGUF_KINDS)}")
    data = g.tensor_data(name)
    if kind in BLOCK_KINDS:  # a row's blocks along the last axis (the container checked rows are whole blocks)
        block = BLOCK_KINDS[kind]
        return kind, data.view(block.storage).reshape(tuple(t.shape[:-1]) + (t.shape[-1] // block.weights,))
    return kind, data.view(GGUF_NUMPY[t.type_name]).reshape(t.shape)


def check_block_scales(g, name, kind, blocks):
    """Refuse a block tensor with a non-finite f16 scale (d; Q4_1's and Q5_1's m, Q4_K's and Q5_K's
    dmin: its weights would not be numbers), naming the tensor, the scale and the block."""
    for field in BLOCK_KINDS[kind].scales:
        values = blocks[field].reshape(-1)
        bad = ~np.isfinite(values)
        if bad.any():
            what = "scale" if field == "d" else f"{field} scale"
            raise ExportError(f"{g.path}: tensor {name}: the {what} of {BLOCK_KINDS[kind].ggml} block "
                              f"{int(np.argmax(bad))} is {values[np.argmax(bad)]}; scales must be finite")


def gguf_piece(g, name, expected, rows=None, heads=None, order=None):
    """One piece of a ROPE tensor: GGUF tensor `name` (rows: a band of it), checked against the
    shape the metadata gives (`expected`), its rows permuted per head if asked (whole rows: a
    block type's blocks run along a row, so they are never split)."""
    t = gguf_tensor(g, name)
    shape = list(t.shape)
    if rows is not None:
        shape[0] = rows[1] - rows[0]
    if shape != list(expected) or (rows is not None and rows[1] > t.shape[0]):
        raise ExportError(f"{g.path}: tensor {name} has shape {list(t.shape)}, but the metadata gives "
                          f"{list(expected)}{' (a band of its rows)' if rows else ''}")
    kind, array = gguf_stored(g, name)
    if rows is not None:
        array = array[rows[0]:rows[1]]
    if order is not None:
        array = permute_heads(array, heads, order)
    if kind in BLOCK_KINDS:
        check_block_scales(g, name, kind, array)
        return Blocks(kind, tuple(expected), np.ascontiguousarray(array).view(np.uint8).reshape(-1), name)
    return array


def gguf_pieces(g, c, family, ours, shape):
    """[(GGUF name, its expected shape, rows)] that make up one ROPE tensor."""
    if c.n_experts and (ours in ("w1", "w2", "w3") or ours.startswith("expert_") or ours == "router"):
        layers = layer_shapes(c)
        dense = [(l, s) for l, s in enumerate(layers) if not s.experts]
        sparse = [l for l, s in enumerate(layers) if s.experts]
        E, hidden = c.n_experts, c.expert_hidden
        shapes = {"router": [E, c.dim], "expert_w1": [E, hidden, c.dim], "expert_w3": [E, hidden, c.dim],
                  "expert_w2": [E, c.dim, hidden]}
        if ours in ("w1", "w3"):
            return [(GGUF_TENSORS[ours].format(i=l), [s.hidden_dim, c.dim], None) for l, s in dense]
        if ours == "w2":
            return [(GGUF_TENSORS[ours].format(i=l), [c.dim, s.hidden_dim], None) for l, s in dense]
        return [(GGUF_TENSORS[ours].format(i=l), shapes[ours], None) for l in sparse]
    if family.fused and ours in family.fused:  # Phi-3: a band of rows of a fused tensor
        fused, part = GGUF_FUSED[ours]
        if fused.startswith("blk.{i}.attn"):
            sizes = [c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim, c.n_kv_heads * c.head_dim]
        else:
            sizes = [c.hidden_dim, c.hidden_dim]
        first = sum(sizes[:part])
        return [(fused.format(i=i), list(shape[1:]), (first, first + sizes[part])) for i in range(c.n_layers)]
    name = GGUF_TENSORS[ours]
    if "{i}" in name:
        return [(name.format(i=i), list(shape[1:]), None) for i in range(c.n_layers)]
    return [(name, list(shape), None)]


def read_gguf(path, template_name=None, with_tokenizer=True):
    """Read a GGUF file: (Config, {name: [pieces]}, the matrices' type, the TOKN section's bytes, or
    None without_tokenizer).

    Its metadata becomes the config.json it stands for (gguf_config), read by config_from_json as
    a Hugging Face directory's is; its tensors are copied as they are stored (F32, F16, BF16,
    and the blocks Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K), never widened or requantized."""
    g = read_gguf_file(reading(path))
    config = gguf_config(g)
    model_type = config["model_type"]
    family = FAMILIES[model_type]
    try:
        if family.layer_records:  # Gemma 4
            c, tensors, kinds = read_gguf_gemma4(g, config)
        else:
            config, c, rotary_dim = config_from_json(config)
            c.shared_classifier = config["tie_word_embeddings"]
            c.check()
    except ExportError as e:
        if str(e).startswith(path):
            raise
        raise ExportError(f"{path}: its metadata, read as config.json: {str(e).removeprefix('config.json: ')}")
    if family.layer_records:
        return c, tensors, (kinds.pop() if len(kinds) == 1 else None), gguf_tokenizer_section(g, c, template_name,
                                                                                               with_tokenizer)
    # llama's and smollm3's q and k rows are in adjacent pairs already; the others' in halves
    order = None if family.gguf in GGUF_ADJACENT_PAIRS else pair_permutation(c.head_dim, rotary_dim)
    heads = {"wq": c.n_heads, "wk": c.n_kv_heads, "bq": c.n_heads, "bk": c.n_kv_heads, "q_norm": 1, "k_norm": 1}
    tensors, kinds = {}, set()
    for ours, shape in tensor_shapes(c):
        if ours == "rope_factors":
            tensors[ours] = np.asarray(c.longrope_factors, dtype=np.float32)
            continue
        pieces = []
        for name, expected, rows in gguf_pieces(g, c, family, ours, shape):
            permute = order is not None and ours in heads
            piece = gguf_piece(g, name, expected, rows, heads.get(ours), order if permute else None)
            if ours in MATRIX_TENSORS:
                kinds.add(piece.kind if isinstance(piece, Blocks) else weight_type_of(piece))
            elif isinstance(piece, Blocks) or piece.dtype != np.float32:
                raise ExportError(f"{path}: tensor {name} is {g.tensors[name].type_name}; this format stores norms, "
                                  "biases and factors as float32 (F32)")
            pieces.append(piece)
        tensors[ours] = pieces
    return c, tensors, (kinds.pop() if len(kinds) == 1 else None), gguf_tokenizer_section(g, c, template_name,
                                                                                           with_tokenizer)


def gguf_tokenizer_section(g, c, template_name, wanted=True):
    """The TOKN section of a GGUF file's tokenizer (its tokenizer.ggml.* keys), checked against the
    model; None when not wanted (--legacy, which has no tokenizer section: said on stderr)."""
    if not wanted:
        warn("llama2.c's legacy format has no tokenizer section: the GGUF file's tokenizer is left out (give run "
             "a tokenizer with -z)")
        return None
    return tokenizer_bytes(gguf_tokenizer(g.metadata, c.vocab_size, template_name, g.path))


def read_hf(model_dir):
    """Read a Hugging Face Llama directory: (Config, {name: [functions that load a piece]}, the
    matrices' stored type: "bf16" or "f16" when they all share it, else "f32")."""
    config_path = os.path.join(model_dir, "config.json")
    if not os.path.isfile(config_path):
        raise ExportError(f"{model_dir}: no config.json")
    config = read_json(config_path)
    text, multimodal = text_config(config)
    family = family_of(text.get("model_type"))
    if family is not None and family.layer_records:  # Gemma 4
        return read_gemma4(model_dir, text, multimodal)
    config, c, rotary_dim = config_from_json(config)
    files = open_safetensors(model_dir)
    rename = hf_text_model_names(files) if multimodal else (lambda name: name)
    if rename("lm_head.weight") not in files:
        c.shared_classifier = True  # no lm_head: the embedding is the classifier
    c.check()
    if rotary_dim != c.head_dim:
        f = hf_rope_parameters(config)[3]
        say_later(f"partial_rotary_factor {f} (GPT-NeoX semantics) stored exactly as p-RoPE "
                  f"with theta = {show(c.rope_theta)}, p = {show(c.rope_fraction)}")
    order = pair_permutation(c.head_dim, rotary_dim)
    # the rows of each query and key head (and their biases and norm weights) into adjacent pairs
    heads = {"wq": c.n_heads, "wk": c.n_kv_heads, "bq": c.n_heads, "bk": c.n_kv_heads, "q_norm": 1, "k_norm": 1}
    tensors, matrix_types = {}, set()
    for ours, shape in tensor_shapes(c):
        if ours == "rope_factors":  # from config.json, not a stored tensor
            tensors[ours] = np.asarray(c.longrope_factors, dtype=np.float32)
            continue
        pieces = []
        moe = c.n_experts and (ours in ("w1", "w2", "w3") or ours in family.expert_tensors)
        named = moe_pieces(c, ours, family.expert_tensors) if moe else hf_pieces(ours, shape, c.n_layers, c.post_norms)
        for name, expected in named:
            name = rename(name)
            rows = None
            if family.fused and ours in family.fused:  # Phi-3: this tensor is a band of rows of a fused one
                name, rows, expected = fused_piece(c, name, family.fused[ours], expected)
            file = checked_tensor(files, ours, name, expected, matrix_types)
            pieces.append(lazy_tensor(file, name, heads.get(ours), order if ours in heads else None,
                                      c.gemma_norms and ours in NORM_TENSORS, rows))
        tensors[ours] = pieces
    return c, tensors, matrices_type(matrix_types)


# ----------------------------------------------------------------------------
# Reading a GGUF file: the container (docs/gguf.md, "The format")
#
#   "GGUF" | u32 version (2 or 3) | u64 tensor_count | u64 metadata_kv_count
#   kv:     string key | u32 value type | value (scalar | STRING: u64 length + bytes |
#           ARRAY: u32 element type, u64 count, elements)
#   tensor: string name | u32 n_dims | u64 ne[n_dims] (fastest first) | u32 ggml type |
#           u64 offset (relative to the data section, a multiple of the alignment)
#   zeros to a multiple of the alignment (general.alignment, else 32) | tensor data
#
# Everything little-endian. The file is untrusted: every count and length is checked against
# the bytes that remain before anything is read or allocated, and every problem is an
# ExportError of one line naming the file and the key or tensor. Only the container is read
# here; what the keys and tensors mean (the architecture, the tokenizer) is read on top of it.

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)  # 1 had 32-bit counts and lengths (llama.cpp refuses it); 2 and 3 share one layout
GGUF_DEFAULT_ALIGNMENT = 32
GGUF_MAX_KEY_BYTES = 65535  # the spec's limit on a key
GGML_MAX_DIMS = 4  # ggml.h
GGML_MAX_NAME = 64  # ggml.h: a tensor name has fewer bytes (with its NUL, 64)
GGUF_MAX_ELEMENTS = 2**63 - 1  # ne's product must fit an int64 (gguf.cpp)

# value types (gguf.h's gguf_type): id -> (name, numpy dtype of a scalar or array element)
GGUF_UINT8, GGUF_INT8, GGUF_UINT16, GGUF_INT16, GGUF_UINT32, GGUF_INT32, GGUF_FLOAT32, GGUF_BOOL, \
    GGUF_STRING, GGUF_ARRAY, GGUF_UINT64, GGUF_INT64, GGUF_FLOAT64 = range(13)
GGUF_VALUE_TYPES = {
    GGUF_UINT8: ("UINT8", "<u1"), GGUF_INT8: ("INT8", "<i1"), GGUF_UINT16: ("UINT16", "<u2"),
    GGUF_INT16: ("INT16", "<i2"), GGUF_UINT32: ("UINT32", "<u4"), GGUF_INT32: ("INT32", "<i4"),
    GGUF_FLOAT32: ("FLOAT32", "<f4"), GGUF_BOOL: ("BOOL", "<u1"), GGUF_STRING: ("STRING", None),
    GGUF_ARRAY: ("ARRAY", None), GGUF_UINT64: ("UINT64", "<u8"), GGUF_INT64: ("INT64", "<i8"),
    GGUF_FLOAT64: ("FLOAT64", "<f8"),
}
GGUF_SCALAR_FORMATS = {GGUF_UINT8: "<B", GGUF_INT8: "<b", GGUF_UINT16: "<H", GGUF_INT16: "<h", GGUF_UINT32: "<I",
                       GGUF_INT32: "<i", GGUF_FLOAT32: "<f", GGUF_BOOL: "<B", GGUF_UINT64: "<Q", GGUF_INT64: "<q",
                       GGUF_FLOAT64: "<d"}

# ggml types (ggml.h's ggml_type; sizes as gguf-py's GGML_QUANT_SIZES, docs/gguf.md; 39..42 from
# the 2026 tree): id -> (name, elements per block, bytes per block). A tensor's row (ne[0]) is
# whole blocks; the format holds F32, F16, BF16 and the blocks of BLOCK_KINDS (Q8_0, Q4_0, Q4_1,
# Q5_0, Q5_1, Q4_K, Q5_K, Q6_K), the others are here so that the reader can refuse them by name.
GGMLType = collections.namedtuple("GGMLType", "name block block_bytes")
GGML_TYPES = {
    0: GGMLType("F32", 1, 4), 1: GGMLType("F16", 1, 2), 2: GGMLType("Q4_0", 32, 18), 3: GGMLType("Q4_1", 32, 20),
    6: GGMLType("Q5_0", 32, 22), 7: GGMLType("Q5_1", 32, 24), 8: GGMLType("Q8_0", 32, 34),
    9: GGMLType("Q8_1", 32, 40), 10: GGMLType("Q2_K", 256, 84), 11: GGMLType("Q3_K", 256, 110),
    12: GGMLType("Q4_K", 256, 144), 13: GGMLType("Q5_K", 256, 176), 14: GGMLType("Q6_K", 256, 210),
    15: GGMLType("Q8_K", 256, 292), 16: GGMLType("IQ2_XXS", 256, 66), 17: GGMLType("IQ2_XS", 256, 74),
    18: GGMLType("IQ3_XXS", 256, 98), 19: GGMLType("IQ1_S", 256, 50), 20: GGMLType("IQ4_NL", 32, 18),
    21: GGMLType("IQ3_S", 256, 110), 22: GGMLType("IQ2_S", 256, 82), 23: GGMLType("IQ4_XS", 256, 136),
    24: GGMLType("I8", 1, 1), 25: GGMLType("I16", 1, 2), 26: GGMLType("I32", 1, 4), 27: GGMLType("I64", 1, 8),
    28: GGMLType("F64", 1, 8), 29: GGMLType("IQ1_M", 256, 56), 30: GGMLType("BF16", 1, 2),
    34: GGMLType("TQ1_0", 256, 54), 35: GGMLType("TQ2_0", 256, 66), 39: GGMLType("MXFP4", 32, 17),
    40: GGMLType("NVFP4", 64, 36), 41: GGMLType("Q1_0", 128, 18), 42: GGMLType("Q2_0", 64, 18),
}
GGML_BLOCK_SIZES = {t.name: (t.block, t.block_bytes) for t in GGML_TYPES.values()}
GGML_TYPE_IDS = {t.name: type_id for type_id, t in GGML_TYPES.items()}
# ids ggml once had and removed (llama.cpp refuses them): named in the refusal
GGML_REMOVED_TYPES = {4: "Q4_2", 5: "Q4_3", 31: "Q4_0_4_4", 32: "Q4_0_4_8", 33: "Q4_0_8_8", 36: "IQ4_NL_4_4",
                      37: "IQ4_NL_4_8", 38: "IQ4_NL_8_8"}
GGUF_FLOAT_VIEWS = {"F32": "<f4", "F16": "<f2", "BF16": "<u2"}  # BF16 as raw uint16 bits, as elsewhere here


def shown(name, limit=80):
    """A key or tensor name for an error line: as it is when printable, else escaped (a name may
    hold a newline); cut after limit characters."""
    text = name if name.isprintable() else ascii(name)[1:-1]
    return text if len(text) <= limit else text[:limit] + f"... ({len(name)} characters)"


@dataclasses.dataclass
class GGUFTensor:
    """One tensor's info: ne as stored (fastest first), shape as numpy's (reversed ne), offset
    absolute in the file, nbytes its data's."""
    name: str
    ggml_type: int
    type_name: str
    ne: tuple
    shape: tuple
    offset: int
    nbytes: int


class GGUFFile:
    """A GGUF file read by read_gguf_file: its version, alignment, metadata (key -> value), the
    value types (key -> type id, or (GGUF_ARRAY, element type id)), the tensors (name ->
    GGUFTensor, in file order), and its bytes mapped read-only."""

    def __init__(self, path, version, alignment, metadata, value_types, tensors, data_start, size, data):
        self.path, self.version, self.alignment = path, version, alignment
        self.metadata, self.value_types, self.tensors = metadata, value_types, tensors
        self.data_start, self.size = data_start, size
        self._data = data  # the mmap: the arrays below are views into it, nothing is read whole

    def tensor_data(self, name):
        """A tensor's bytes: a read-only uint8 array backed by the file's memory map."""
        t = self.tensors[name]
        return np.frombuffer(self._data, dtype=np.uint8, count=t.nbytes, offset=t.offset)

    def float_tensor(self, name):
        """An F32, F16 or BF16 tensor as a read-only array of its shape: float32, float16, or
        uint16 holding the bf16 bits. Other types are refused (naming the type)."""
        t = self.tensors[name]
        if t.type_name not in GGUF_FLOAT_VIEWS:
            raise ExportError(f"{self.path}: tensor {shown(name)} is {t.type_name}; only F32, F16 and BF16 are "
                              "viewed as floats")
        return self.tensor_data(name).view(GGUF_FLOAT_VIEWS[t.type_name]).reshape(t.shape)


class GGUFCursor:
    """Reads the header's fields in order from the mapped file, each checked against the end."""

    def __init__(self, path, data):
        self.path, self.data, self.pos, self.size = path, data, 0, len(data)

    def need(self, n, what):
        """Refuse n bytes for `what` when fewer remain (n may be any Python int: a length read
        from the file, up to 2**64)."""
        if n > self.size - self.pos:
            raise ExportError(f"{self.path}: {what} ({n} bytes at byte {self.pos}) runs past the end of the file "
                              f"({self.size} bytes)")

    def count(self, n, things, where=None):
        """Refuse a count of things (each at least a byte) greater than the bytes that remain: a
        count near 2**64 is named as such, not as the field after the last thing that fits."""
        if n > self.size - self.pos:
            where = f"{where}: " if where else ""
            raise ExportError(f"{self.path}: {where}{n} {things} cannot fit in the {self.size - self.pos} bytes "
                              f"left of the file (from byte {self.pos})")

    def unpack(self, fmt, what):
        """One little-endian struct field."""
        n = struct.calcsize(fmt)
        self.need(n, what)
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += n
        return value

    def raw(self, n, what):
        """n bytes (checked first)."""
        self.need(n, what)
        value = self.data[self.pos:self.pos + n]
        self.pos += n
        return value

    def name(self, what, limit):
        """A key or tensor name: u64 length, then that many bytes of UTF-8, not empty, at most limit bytes."""
        n = self.unpack("<Q", f"{what}'s length")
        if n == 0:
            raise ExportError(f"{self.path}: {what} is empty")
        if n > limit:
            raise ExportError(f"{self.path}: {what} has {n} bytes; at most {limit} are allowed")
        raw = self.raw(n, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ExportError(f"{self.path}: {what} is not valid UTF-8 ({raw[:40]!r})")

    def string(self, what):
        """A string value: u64 length and the bytes, as str (bytes that are not UTF-8 kept as
        surrogates: str.encode("utf-8", "surrogateescape") gives them back)."""
        n = self.unpack("<Q", f"{what}: the string's length")
        return self.raw(n, f"{what}: the string").decode("utf-8", "surrogateescape")


def gguf_scalar(cur, value_type, where):
    """One scalar value of value_type (not STRING or ARRAY) as a Python int, float or bool."""
    value = cur.unpack(GGUF_SCALAR_FORMATS[value_type], f"{where}: the {GGUF_VALUE_TYPES[value_type][0]} value")
    if value_type == GGUF_BOOL:
        if value not in (0, 1):
            raise ExportError(f"{cur.path}: {where}: the BOOL value is {value}, not 0 or 1")
        return bool(value)
    return value


def gguf_array(cur, where):
    """An ARRAY value: (element type, list of str or read-only numpy array). Arrays of arrays are
    refused (llama.cpp refuses them too; no key holds one)."""
    elem = cur.unpack("<I", f"{where}: the array's element type")
    if elem not in GGUF_VALUE_TYPES:
        raise ExportError(f"{cur.path}: {where}: unknown array element type {elem} (GGUF value types are 0..12)")
    if elem == GGUF_ARRAY:
        raise ExportError(f"{cur.path}: {where}: an array of arrays (nested arrays are not read, as llama.cpp "
                          "does not read them)")
    count = cur.unpack("<Q", f"{where}: the array's count")
    if elem == GGUF_STRING:
        cur.count(count, "strings", where)
        return elem, [cur.string(f"{where}[{i}]") for i in range(count)]
    dtype = np.dtype(GGUF_VALUE_TYPES[elem][1])
    start = cur.pos
    cur.raw(dtype.itemsize * count, f"{where}: an array of {count} {GGUF_VALUE_TYPES[elem][0]}")
    values = np.frombuffer(cur.data, dtype=dtype, count=count, offset=start)
    if elem == GGUF_BOOL:
        bad = np.flatnonzero(values > 1)
        if bad.size:
            raise ExportError(f"{cur.path}: {where}[{bad[0]}]: the BOOL value is {values[bad[0]]}, not 0 or 1")
        values = values.view(np.bool_)
    return elem, values


def gguf_metadata(cur, count):
    """The key-value pairs: (metadata, value_types), duplicates refused."""
    cur.count(count, "key-value pairs")
    metadata, value_types = {}, {}
    for i in range(count):
        key = cur.name(f"key {i}", GGUF_MAX_KEY_BYTES)
        where = f"key {shown(key)}"
        if key in metadata:
            raise ExportError(f"{cur.path}: {where} appears twice")
        value_type = cur.unpack("<I", f"{where}: the value type")
        if value_type not in GGUF_VALUE_TYPES:
            raise ExportError(f"{cur.path}: {where}: unknown value type {value_type} (GGUF value types are 0..12)")
        if value_type == GGUF_ARRAY:
            elem, metadata[key] = gguf_array(cur, where)
            value_types[key] = (GGUF_ARRAY, elem)
        else:
            metadata[key] = cur.string(where) if value_type == GGUF_STRING else gguf_scalar(cur, value_type, where)
            value_types[key] = value_type
    return metadata, value_types


def gguf_alignment(path, metadata, value_types):
    """general.alignment: a UINT32 power of two; 32 when absent."""
    if "general.alignment" not in metadata:
        return GGUF_DEFAULT_ALIGNMENT
    value_type, value = value_types["general.alignment"], metadata["general.alignment"]
    if value_type != GGUF_UINT32:
        kind = "an ARRAY" if isinstance(value_type, tuple) else f"a {GGUF_VALUE_TYPES[value_type][0]}"
        raise ExportError(f"{path}: key general.alignment is {kind}; GGUF stores it as a UINT32")
    if value == 0 or value & (value - 1):
        raise ExportError(f"{path}: key general.alignment is {value}; it must be a power of two")
    return value


def gguf_tensor_type(path, name, type_id):
    """A tensor's GGMLType, or the refusal of its id by name and number."""
    if type_id in GGML_TYPES:
        return GGML_TYPES[type_id]
    if type_id in GGML_REMOVED_TYPES:
        raise ExportError(f"{path}: tensor {shown(name)}: ggml type {type_id} ({GGML_REMOVED_TYPES[type_id]}) was "
                          "removed from ggml and is not read")
    raise ExportError(f"{path}: tensor {shown(name)}: unknown ggml type {type_id}")


def gguf_tensor_info(cur, alignment, names):
    """One tensor info: (name, ggml type id, its GGMLType, ne, nbytes, relative offset), checked."""
    name = cur.name(f"tensor {len(names)}'s name", GGML_MAX_NAME - 1)
    where = f"tensor {shown(name)}"
    if name in names:
        raise ExportError(f"{cur.path}: {where} appears twice")
    n_dims = cur.unpack("<I", f"{where}: n_dims")
    if not 1 <= n_dims <= GGML_MAX_DIMS:
        raise ExportError(f"{cur.path}: {where}: n_dims is {n_dims}; it must be in [1, {GGML_MAX_DIMS}]")
    ne = tuple(cur.unpack("<q", f"{where}: ne[{i}]") for i in range(n_dims))
    if any(d <= 0 for d in ne):
        raise ExportError(f"{cur.path}: {where}: ne {list(ne)} has a dimension <= 0")
    elements = math.prod(ne)  # Python ints: no overflow
    if elements > GGUF_MAX_ELEMENTS:
        raise ExportError(f"{cur.path}: {where}: ne {list(ne)} holds {elements} elements, more than 2**63 - 1")
    type_id = cur.unpack("<I", f"{where}: the ggml type")
    kind = gguf_tensor_type(cur.path, name, type_id)
    if ne[0] % kind.block:
        raise ExportError(f"{cur.path}: {where}: its rows of {ne[0]} elements are not whole {kind.name} blocks "
                          f"of {kind.block}")
    nbytes = elements // kind.block * kind.block_bytes
    offset = cur.unpack("<Q", f"{where}: the offset")
    if offset % alignment:
        raise ExportError(f"{cur.path}: {where}: offset {offset} is not a multiple of the alignment {alignment}")
    return name, type_id, kind, ne, nbytes, offset


def gguf_check_layout(path, tensors, size):
    """Refuse tensors whose data runs past the end of the file or overlaps another's (gaps, as
    the alignment makes, are allowed)."""
    previous = None
    for t in sorted(tensors.values(), key=lambda t: (t.offset, t.nbytes)):
        end = t.offset + t.nbytes
        if end > size:
            raise ExportError(f"{path}: tensor {shown(t.name)}: data [{t.offset}, {end}) is past the end of the "
                              f"file ({size} bytes)")
        if previous is not None and t.offset < previous.offset + previous.nbytes:
            raise ExportError(f"{path}: tensors {shown(previous.name)} and {shown(t.name)} overlap (data "
                              f"[{previous.offset}, {previous.offset + previous.nbytes}) and [{t.offset}, {end}))")
        previous = t


def read_gguf_file(path):
    """Read a GGUF file's container (docs/gguf.md): a GGUFFile, every field checked; the tensor
    data stays in the file, mapped read-only."""
    size = os.path.getsize(reading(path))
    if size < 4:
        raise ExportError(f"{path}: only {size} bytes: too short for a GGUF file")
    with open(path, "rb") as f:
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    cur = GGUFCursor(path, data)
    if cur.raw(4, "the magic") != GGUF_MAGIC:
        raise ExportError(f"{path}: not a GGUF file (its first bytes are not \"GGUF\")")
    version = cur.unpack("<I", "the version")
    if version not in GGUF_VERSIONS:
        if version & 0xFFFF == 0 and (version >> 24) in GGUF_VERSIONS:
            raise ExportError(f"{path}: a big-endian GGUF file (version {version >> 24} byte-swapped); only "
                              "little-endian files are read")
        if version == 1:
            raise ExportError(f"{path}: GGUF version 1 (32-bit counts) is not supported, as llama.cpp no longer "
                              "reads it; convert the model again with a current llama.cpp")
        raise ExportError(f"{path}: GGUF version {version} is not supported (only 2 and 3)")
    n_tensors = cur.unpack("<Q", "the tensor count")
    n_kv = cur.unpack("<Q", "the key-value count")
    metadata, value_types = gguf_metadata(cur, n_kv)
    alignment = gguf_alignment(path, metadata, value_types)
    cur.count(n_tensors, "tensor infos")
    infos = {}
    for _ in range(n_tensors):
        name, *info = gguf_tensor_info(cur, alignment, infos)
        infos[name] = info
    data_start = cur.pos + -cur.pos % alignment
    tensors = {}
    for name, (type_id, kind, ne, nbytes, offset) in infos.items():
        tensors[name] = GGUFTensor(name, type_id, kind.name, ne, ne[::-1], data_start + offset, nbytes)
    gguf_check_layout(path, tensors, size)
    return GGUFFile(path, version, alignment, metadata, value_types, tensors, data_start, size, data)


def is_gguf_file(path):
    """True for a regular file whose first bytes are GGUF's magic."""
    if not os.path.isfile(path):
        return False
    with open(path, "rb") as f:
        return f.read(4) == GGUF_MAGIC


# ----------------------------------------------------------------------------
# Writing: ROPE and llama2.c legacy


class Progress:
    """A progress line on stderr while a file of more than PROGRESS_BYTES is written.

    One line, rewritten in place with a carriage return (at most twice a second),
    and ended with a newline when the last tensor is written or the write stops.
    """

    def __init__(self, path, total_bytes, n_tensors):
        self.path, self.total, self.n_tensors = path, total_bytes, n_tensors
        self.enabled = total_bytes > PROGRESS_BYTES
        self.written = self.tensors = 0
        self.shown_at = -math.inf
        self.open = False  # a line without its newline is on stderr

    def add(self, n_bytes, tensor_done=False):
        """Count n_bytes written (and one more tensor done); redraw the line if it is time."""
        self.written += n_bytes
        self.tensors += tensor_done
        if not self.enabled:
            return
        last = self.tensors == self.n_tensors
        now = time.monotonic()
        if last or now - self.shown_at >= 0.5:
            self.shown_at = now
            print(f"\rexport.py: writing {self.path}: {self.tensors}/{self.n_tensors} tensors, "
                  f"{self.written / 1e6:.0f}/{self.total / 1e6:.0f} MB", end="\n" if last else "",
                  file=sys.stderr, flush=True)
            self.open = not last

    def close(self):
        """End an unfinished line (the write stopped early), so that what follows starts a line."""
        if self.open:
            print(file=sys.stderr, flush=True)
            self.open = False


def check_finite(array, name):
    """Refuse a NaN or infinite weight (of any weight type), naming the tensor and where: run would
    compute NaN from it."""
    bad = (array & 0x7F80) == 0x7F80 if array.dtype == np.uint16 else ~np.isfinite(array)  # bf16: exponent all ones
    if bad.any():
        at = np.unravel_index(np.argmax(bad), array.shape)
        value = widen(np.asarray(array[at]).reshape(1))[0]
        raise ExportError(f"tensor {name}: the weight at {list(map(int, at))} is {value}; NaN and infinite weights "
                          "are refused (every output would be NaN)")


def write_tensor(f, pieces, progress, weight_type="f32", name=""):
    """Write a tensor, little-endian, as weight_type (f32, bf16, f16 or a block type): an array, a Blocks,
    or a list of arrays / Blocks / loaders, in any weight type (see weight_type_of; other float
    arrays as float32). A Blocks of weight_type is written as it is; of another type, widened to
    float32 (exactly) and converted as an array. A NaN or infinite weight is refused, naming the
    tensor it was read from."""
    pieces = pieces if isinstance(pieces, list) else [pieces]
    if not pieces:  # a layer's piece of no weights (with a type table)
        progress.add(0, tensor_done=True)
    for i, piece in enumerate(pieces):
        array = piece() if callable(piece) else piece
        if isinstance(array, Blocks):
            check_piece_finite(array, array.source or name)
            if array.kind == weight_type:  # as it is, never rounded again
                f.write(memoryview(np.ascontiguousarray(array.data)).cast("B"))
                progress.add(len(array.data), tensor_done=i == len(pieces) - 1)
                continue
            array = array.widened()
        if not isinstance(array, np.ndarray) or array.dtype not in (np.float32, np.float16, np.uint16):
            array = np.asarray(array, dtype=np.float32)
        check_finite(array, getattr(piece, "source", name))
        array = convert_weights(array, weight_type, name)
        storage = BLOCK_KINDS[weight_type].storage if weight_type in BLOCK_KINDS else NUMPY_STORAGE[weight_type]
        data = memoryview(np.ascontiguousarray(array, dtype=storage).view(np.uint8).reshape(-1)).cast("B")
        f.write(data)
        progress.add(len(data), tensor_done=i == len(pieces) - 1)


def rope_version(weight_type, c=None, tokenizer=None):
    """The version a file needs: 1 (exactly as before) for float32 weights, the Llama
    block and no tokenizer inside, else 2 (weight_type None: a type per piece, 2)."""
    plain = weight_type == "f32" and not (c and c.needs_block_fields()) and tokenizer is None
    return ROPE_VERSION if plain else ROPE_VERSION_2


def layer_table_place(c, tensors_end):
    """(offset, bytes) of the per-layer table: the first multiple of 64 after the last
    tensor, 8 bytes per layer; (0, 0) when the file has none."""
    if c.layers is None:
        return 0, 0
    record = LAYER_RECORD_WIDE if c.wide_records else LAYER_RECORD
    return tensors_end + -tensors_end % TENSOR_ALIGNMENT, record.size * c.n_layers


def type_table_place(c, tensors_end):
    """(offset, bytes) of the type table (weight_type 4): the first multiple of 64 after the
    per-layer table, or after the last tensor when there is none; one byte per matrix piece."""
    offset, size = layer_table_place(c, tensors_end)
    end = offset + size if size else tensors_end
    return end + -end % TENSOR_ALIGNMENT, sum(len(shapes) for shapes in matrix_piece_shapes(c).values())


def rope_header(c, weight_type="f32", version=ROPE_VERSION, tensors_end=0, tokenizer_offset=0, tokenizer_bytes=0):
    """The 256-byte ROPE header (docs/format.md); version 2 adds head_size, the
    weight_type field (None: 4, a type per piece, and the type table's place in bytes
    216..231), a reserved field, the tokenizer section's offset and size, the
    block options, the per-layer table's place and the second RoPE setting (none:
    bytes 152..191 zero)."""
    fields = ROPE_HEADER.pack(ROPE_MAGIC, version, c.dim, c.hidden_dim, c.n_layers, c.n_heads,
                              c.n_kv_heads, c.vocab_size, c.seq_len, int(c.shared_classifier),
                              c.norm_eps, c.rope_theta, c.rope_fraction, c.rope_factor,
                              c.rope_scaling, c.rope_original_len, *(getattr(c, name) for name, _, _ in RULE_FIELDS))
    if version == ROPE_VERSION_2:
        code = WEIGHT_TYPE_PER_PIECE if weight_type is None else WEIGHT_TYPE_CODES[weight_type]
        fields += ROPE_V2_FIELDS.pack(c.head_size, code, 0, tokenizer_offset, tokenizer_bytes)
        fields += ROPE_V2_BLOCK.pack(c.block_flags, c.activation, c.embedding_multiplier, c.attention_scale,
                                     c.attention_softcap, c.final_softcap, *layer_table_place(c, tensors_end))
        if c.rope2 is not None:  # the fields not given are ROPE2_DEFAULTS
            fields += ROPE_V2_SECOND.pack(*({**ROPE2_DEFAULTS, **c.rope2}[name] for name in ROPE2_FIELDS))
        if c.per_layer_dim:  # Gemma 4's per-layer inputs (bytes 192..199)
            fields += bytes(PER_LAYER_BYTES_AT - len(fields))
            fields += ROPE_V2_PER_LAYER.pack(c.per_layer_dim, c.per_layer_multiplier)
        if c.n_experts:  # a mixture of experts (bytes 200..215)
            fields += bytes(EXPERTS_BYTES_AT - len(fields))
            fields += ROPE_V2_EXPERTS.pack(c.n_experts, c.n_experts_used, c.expert_hidden, c.routing)
        if weight_type is None:  # the type table (bytes 216..231)
            fields += bytes(TYPE_TABLE_BYTES_AT - len(fields))
            fields += ROPE_V2_TYPE_TABLE.pack(*type_table_place(c, tensors_end))
    return fields + bytes(HEADER_BYTES - len(fields))


def rope_layout(c, weight_type, version, piece_types=None):
    """[(name, shape, type, offset)] of a ROPE file's tensors, where the last one ends, and
    the file's size (the per-layer table and the type table after them, if any): back to back
    in version 1 (float32), each at a multiple of 64 bytes in version 2. piece_types ({name:
    [type of each piece]} of matrix_piece_shapes; weight_type None): a file with a type table,
    each matrix piece its own entry, of its own type, at its own multiple of 64."""
    alignment = 1 if version == ROPE_VERSION else TENSOR_ALIGNMENT
    pieces = matrix_piece_shapes(c) if piece_types is not None else {}
    layout, at = [], HEADER_BYTES
    for name, shape in tensor_shapes(c):
        kinds = piece_types[name] if name in pieces else [weight_type if name in MATRIX_TENSORS else "f32"]
        for piece_shape, kind in zip(pieces.get(name, [shape]), kinds):
            at += -at % alignment
            layout.append((name, piece_shape, kind, at))
            at += tensor_bytes(kind, math.prod(piece_shape))
    offset, size = type_table_place(c, at) if piece_types is not None else layer_table_place(c, at)
    return layout, at, (offset + size if size else at)


def typed_pieces(c, tensors):
    """For write_rope's weight_type None: (the one type every matrix piece is given in, or None,
    {name: [type of each piece]} of matrix_piece_shapes, the tensors with each matrix as the list of
    its pieces' parts). A piece of no weights given in no type is float32."""
    shapes = matrix_piece_shapes(c)
    cuts = {name: cut_into_pieces(name, tensors[name], shapes[name]) for name in shapes}
    for name, cut in cuts.items():  # run's rule, per piece: a block piece's rows are whole blocks
        for i, ((kind, _), shape) in enumerate(zip(cut, shapes[name])):
            if math.prod(shape) and not_whole_blocks(kind, shape[-1]):
                raise ExportError(f"tensor {name}: piece {i} is {kind}, but its rows of {shape[-1]} weights are not "
                                  f"whole {BLOCK_KINDS[kind].weights}-weight blocks (run refuses such a file)")
    kinds = {kind for cut in cuts.values() for kind, _ in cut if kind is not None}
    parts = {name: [part for _, piece_parts in cut for part in piece_parts] for name, cut in cuts.items()}
    piece_types = {name: [kind or "f32" for kind, _ in cut] for name, cut in cuts.items()}
    per_piece = {name: [piece_parts for _, piece_parts in cut] for name, cut in cuts.items()}
    one = kinds.pop() if len(kinds) == 1 else "f32" if not kinds else None
    return one, piece_types, {**tensors, **(parts if one else per_piece)}


def write_rope(f, c, tensors, path="-", weight_type="f32", tokenizer=None):
    """Write a ROPE file: header, then the tensors in the README's order, the matrices and
    the embedding as weight_type; the per-layer table after them when the model has one;
    with a tokenizer (the TOKN section's bytes), version 2 with the section at the first
    multiple of 64 after those, ending the file.

    weight_type None: each matrix piece keeps the type it is given in (a Blocks' kind, an array's
    type: float32, uint16 bf16 bits, float16). A layered matrix may be given as one piece per layer
    (per layer with experts for the router and the experts), or as today (stacked, a list of pieces
    such as moe_pieces' n_experts per layer): its pieces are matched to the file's by their weights'
    count (cut_into_pieces). All in one type: the ordinary file of that type, byte for byte; else
    weight_type 4, each piece at its own multiple of 64, and the type table after the tensors (and
    the per-layer table)."""
    piece_types = None
    if weight_type is None:
        weight_type, piece_types, tensors = typed_pieces(c, tensors)
        if weight_type is not None:
            piece_types = None
    version = rope_version(weight_type, c, tokenizer)
    layout, tensors_end, size = rope_layout(c, weight_type, version, piece_types)
    tok_at = size + -size % TENSOR_ALIGNMENT if tokenizer is not None else 0
    tok_bytes = len(tokenizer) if tokenizer is not None else 0
    progress = Progress(path, tok_at + tok_bytes if tokenizer is not None else size, len(layout))
    try:
        f.write(rope_header(c, weight_type, version, tensors_end, tok_at, tok_bytes))
        progress.add(HEADER_BYTES)
        written = HEADER_BYTES
        piece_of = collections.Counter()  # with a type table: each matrix's pieces written so far
        for name, shape, kind, offset in layout:
            f.write(bytes(offset - written))  # zero padding up to the tensor's 64-byte boundary
            written = offset
            tensor = tensors[name]
            if piece_types is not None and name in piece_types:
                tensor = tensor[piece_of[name]]
                piece_of[name] += 1
            write_tensor(f, tensor, progress, kind, name)
            written += tensor_bytes(kind, math.prod(shape))
        if c.layers is not None:  # the per-layer table: (rope, window) per layer, or Gemma 4's eight fields
            offset, table_bytes = layer_table_place(c, tensors_end)
            f.write(bytes(offset - written))
            record = LAYER_RECORD_WIDE if c.wide_records else LAYER_RECORD
            f.write(b"".join(record.pack(*fields) for fields in c.layers))
            written = offset + table_bytes
        if piece_types is not None:  # the type table: each matrix piece's type code, in file order
            offset, table_bytes = type_table_place(c, tensors_end)
            f.write(bytes(offset - written))
            f.write(bytes(WEIGHT_TYPE_CODES[kind] for name, _, kind, _ in layout if name in MATRIX_TENSORS))
            written = offset + table_bytes
        if tokenizer is not None:
            f.write(bytes(tok_at - written))  # zero padding to the section's 64-byte boundary
            f.write(tokenizer)
    finally:
        progress.close()


def llama2c_freq_cis(head_dim, seq_len):
    """(cos, sin) tables (seq_len, head_dim/2) as llama2.c's model.py precompute_freqs_cis.

    In float32 as torch does it: freqs = 1 / 10000^(arange(0, hd, 2) / hd), angles =
    outer(t, freqs). cos and sin are the correctly rounded float32 values; the
    torch build that wrote llama2.c's files used a libm (Intel MKL's vsCos/vsSin
    on Linux) that is off by one unit in the last place in about 5% of entries,
    which NumPy cannot reproduce. run.c never reads these tables.
    """
    exponents = np.arange(0, head_dim, 2)[: head_dim // 2].astype(np.float32) / np.float32(head_dim)
    powers = (LLAMA2C_THETA ** exponents.astype(np.float64)).astype(np.float32)
    freqs = np.float32(1.0) / powers
    angles = np.outer(np.arange(seq_len, dtype=np.float32), freqs)  # float32 products
    return np.cos(angles.astype(np.float64)).astype(np.float32), np.sin(angles.astype(np.float64)).astype(np.float32)


def check_legacy(c):
    """Refuse what llama2.c's legacy format cannot carry; warn about norm_eps and the original length."""
    no_rule = c.rule == RULE_NONE and f32(c.rope_attention_factor) in (0, 1)
    if f32(c.rope_theta) != LLAMA2C_THETA or f32(c.rope_fraction) != 1 or not no_rule:
        raise ExportError(f"--legacy: llama2.c's legacy format has no rotary settings: it needs theta 10000, "
                          f"p 1 and no scaling rule (this model: theta {show(c.rope_theta)}, "
                          f"p {show(c.rope_fraction)}, rope {describe_rope(c)})")
    if c.needs_block_fields():
        raise ExportError("--legacy: llama2.c's legacy format holds Llama's block only; this model's needs ROPE "
                          "version 2's block fields (its head size, block flags, activation, scales, per-layer table "
                          "or second RoPE setting; leave out --legacy)")
    if f32(c.norm_eps) != f32(LLAMA2C_NORM_EPS):
        warn(f"norm_eps {show(c.norm_eps)} is not stored in llama2.c's legacy format; its readers use 1e-05")
    if c.rope_original_len not in (0, c.seq_len):
        warn(f"rope_original_len {c.rope_original_len} (the trained length a run-time scaling rule is relative "
             f"to) is not stored in llama2.c's legacy format; converted back, it becomes seq_len {c.seq_len}")


def write_legacy(f, c, tensors, path="-"):
    """Write llama2.c's legacy format: seven int32, tensors, freq_cis after rms_final."""
    shapes = legacy_shapes(c)
    progress = Progress(path, LEGACY_HEADER.size + 4 * n_floats(shapes), len(shapes))
    try:
        vocab = c.vocab_size if c.shared_classifier else -c.vocab_size
        f.write(LEGACY_HEADER.pack(c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, vocab, c.seq_len))
        progress.add(LEGACY_HEADER.size)
        cos, sin = llama2c_freq_cis(c.head_dim, c.seq_len)
        tables = {"freq_cis_real": cos, "freq_cis_imag": sin}
        for name, _ in shapes:
            write_tensor(f, tables[name] if name in tables else tensors[name], progress)
    finally:
        progress.close()


def output_target(path):
    """The file an output path names: itself, or where its symlinks lead (written through).

    Refuses an empty path, a directory, and anything that is not a regular file (a FIFO,
    a device, a socket): the rename that makes the write atomic would replace it.
    """
    if path == "":
        raise ExportError("the output path is empty")
    target = os.path.realpath(path) if os.path.islink(path) else path
    if os.path.isdir(target):
        raise ExportError(f"{path}: is a directory")
    if os.path.exists(target) and not os.path.isfile(target):
        raise ExportError(f"{path}: is not a regular file (a FIFO, a device or a socket); write to a file")
    return target


def check_not_an_input(path, target):
    """Refuse an output that is a file this run read (config.json, a tokenizer file, a shard,
    the index, the checkpoint): the rename would replace the input with the output. Compared
    as (device, inode), so that a hard link, a symlink or another spelling of the path is
    caught too; an output that does not exist yet cannot be an input."""
    try:
        out = os.stat(target)
    except OSError:
        return
    for source in INPUTS:
        try:
            st = os.stat(source)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (out.st_dev, out.st_ino):
            raise ExportError(f"{path}: is the input file {source}; export.py never writes over its inputs (give "
                              "another output path)")


def write_atomically(path, write):
    """Call write(file) on a temporary file next to the output, then rename it to the output.

    Every failure names the path the user gave, never the temporary file.
    """
    target = output_target(path)
    check_not_an_input(path, target)
    tmp = f"{target}.tmp{os.getpid()}"
    try:
        try:
            with open(tmp, "wb") as f:
                write(f)
            os.replace(tmp, target)
        except OSError as e:
            raise ExportError(f"{path}: cannot write: {e.strerror}")
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def export_checkpoint(args):
    """Read a checkpoint (HF directory, llama2.c or ROPE file) and write ROPE or legacy."""
    if os.path.isdir(args.input):
        c, tensors, source_type = read_hf(args.input)
        template = args.template
        tokenizer = None if args.legacy else hf_tokenizer(args.input, c.vocab_size, template)
    elif is_gguf_file(args.input):
        c, tensors, source_type, tokenizer = read_gguf(args.input, args.template, with_tokenizer=not args.legacy)
    elif os.path.isfile(args.input):
        c, tensors, source_type, tokenizer = read_flat_checkpoint(args.input)
        if args.template is not None:
            raise ExportError("--template applies to a tokenizer: a Hugging Face directory's, or --tokenizer's")
    else:
        raise ExportError(f"{args.input}: no such file or directory")
    weight_type = "f32" if args.legacy else args.dtype or source_type  # llama2.c's formats are float32
    if weight_type in QUANTIZERS:
        check_block_rows(c, weight_type)
    elif weight_type not in ("f32", None, *BLOCK_KINDS) and weight_type != source_type:
        say_later(f"narrowing the matrices and the embedding from {source_type or 'their types'} to {weight_type} "
                  f"(rounded to nearest even)")
    if args.rope_theta is not None:
        c.rope_theta = args.rope_theta
    if args.rope_fraction is not None:
        pairs = rotated_pairs(c)
        c.rope_fraction = args.rope_fraction
        if c.rope_scaling == RULE_LONGROPE and rotated_pairs(c) != pairs:
            raise FlagError(f"--rope-fraction {args.rope_fraction:g}: this model's longrope factors are defined per "
                            f"rotated pair of the model as trained ({pairs} pairs); p {show(args.rope_fraction)} "
                            f"would rotate {rotated_pairs(c)}")
    if args.rope_theta is not None or args.rope_fraction is not None:
        try:  # the file's values passed: a failure now is the flags' (a theta whose angles overflow)
            c.check()
        except ExportError as e:
            raise FlagError(f"--rope-theta / --rope-fraction: {e}")
    if args.legacy:
        check_legacy(c)
        left_out = os.path.isdir(args.input) and find_tokenizer(args.input)
        if left_out:
            reading(left_out)  # not read, but still the model's file: not to be written over
        if tokenizer is not None or left_out:
            warn("llama2.c's legacy format has no tokenizer section: the tokenizer is left out (convert it with "
                 "--tokenizer and give it to run with -z)")
        write_atomically(args.output, lambda f: write_legacy(f, c, tensors, args.output))
    else:
        Q8_STATS.__init__()
        write_atomically(args.output, lambda f: write_rope(f, c, tensors, args.output, weight_type, tokenizer))
        if weight_type in QUANTIZERS and Q8_STATS.quantized:  # not when a GGUF's blocks were copied as they are
            bf16_size = rope_layout(c, "bf16", ROPE_VERSION_2)[2]
            say_later(f"quantized the matrices and the embedding to {weight_type} (llama.cpp's "
                      f"{QUANTIZER_SOURCE[weight_type]}): "
                      f"{os.path.getsize(args.output)} bytes, {os.path.getsize(args.output) / bf16_size:.3f} of "
                      f"bf16's {bf16_size}; the largest change of a weight is {Q8_STATS.worst:.3g} of its block's "
                      f"largest magnitude" + (f" (in {Q8_STATS.where})" if Q8_STATS.where else ""))
    kind = ("llama2.c legacy" if args.legacy else "ROPE" if rope_version(weight_type, c, tokenizer) == ROPE_VERSION
            else f"ROPE v2, {weight_type or 'per-piece'} weights" + (", with its tokenizer" if tokenizer is not None
                                                                     else ""))
    print(f"wrote {args.output} ({kind}): dim {c.dim}, "
          f"hidden {c.hidden_dim}, {c.n_layers} layers, {c.n_heads} heads ({c.n_kv_heads} kv), "
          f"vocab {c.vocab_size}, seq_len {c.seq_len}, shared classifier {int(c.shared_classifier)}, "
          f"eps {show(c.norm_eps)}, theta {show(c.rope_theta)}, p {show(c.rope_fraction)}, "
          f"rope {describe_rope(c)}")


# ----------------------------------------------------------------------------
# Tokenizer: SentencePiece's ModelProto (protobuf, parsed by hand) -> tokenizer.bin
#
# ModelProto: field 1 = repeated SentencePiece {1: piece (string), 2: score (float),
# 3: type (enum)}; field 2 = TrainerSpec {41: bos_id (default 1), 42: eos_id (default 2)}.
# tokenizer.bin (llama2.c): int32 max_token_length, then per token float32 score,
# int32 length, the UTF-8 bytes.

WIRE_VARINT, WIRE_FIXED64, WIRE_BYTES, WIRE_FIXED32 = 0, 1, 2, 5
MODEL_PIECES, MODEL_TRAINER_SPEC, MODEL_NORMALIZER_SPEC = 1, 2, 3
PIECE_TEXT, PIECE_SCORE, PIECE_TYPE = 1, 2, 3
TRAINER_MODEL_TYPE, TRAINER_BYTE_FALLBACK, TRAINER_BOS_ID, TRAINER_EOS_ID = 3, 35, 41, 42
NORMALIZER_NAME, NORMALIZER_DUMMY_PREFIX, NORMALIZER_REMOVE_SPACES = 1, 3, 4
SP_MODEL_BPE = 2  # TrainerSpec.model_type: 1 unigram (the default), 2 bpe, 3 word, 4 char
DEFAULT_BOS_ID, DEFAULT_EOS_ID = 1, 2
SPACE_MARK = "\u2581"  # SentencePiece's "▁", which stands for a space


def read_varint(buf, pos):
    """(value, next position) of the base-128 varint at pos."""
    value = shift = 0
    while True:
        if pos >= len(buf):
            raise ExportError("tokenizer model: truncated varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, pos
        if shift > 63:
            raise ExportError("tokenizer model: varint longer than 10 bytes")


def protobuf_fields(buf):
    """Yield (field number, value) of a protobuf message: int for varints, bytes otherwise."""
    pos = 0
    while pos < len(buf):
        key, pos = read_varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == WIRE_VARINT:
            value, pos = read_varint(buf, pos)
        elif wire in (WIRE_FIXED64, WIRE_FIXED32, WIRE_BYTES):
            if wire == WIRE_BYTES:
                size, pos = read_varint(buf, pos)
            else:
                size = 8 if wire == WIRE_FIXED64 else 4
            if pos + size > len(buf):
                raise ExportError(f"tokenizer model: field {field} runs past the end of its message")
            value, pos = bytes(buf[pos:pos + size]), pos + size
        else:
            raise ExportError(f"tokenizer model: unsupported protobuf wire type {wire} (field {field})")
        yield field, value


def as_int32(varint):
    """A varint holding an int32 (negative ones are 10 bytes, two's complement)."""
    return varint - 2**64 if varint >= 2**63 else varint


class SentencePieceModel:
    """What export.py reads from a SentencePiece ModelProto."""

    def __init__(self):
        self.pieces = []  # [(text, score, SentencePiece type: 1 normal .. 6 byte)]
        self.bos_id, self.eos_id = DEFAULT_BOS_ID, DEFAULT_EOS_ID
        self.model_type = 1  # TrainerSpec's default: unigram
        self.byte_fallback = False
        self.normalizer, self.add_dummy_prefix, self.remove_extra_whitespaces = "", True, True


def read_sentencepiece_model(path):
    """The pieces and the trainer and normalizer settings of a SentencePiece model file.

    ModelProto: field 1 = repeated SentencePiece {1: piece, 2: score (float), 3: type
    (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte)}; field 2 =
    TrainerSpec {3: model_type, 35: byte_fallback, 41: bos_id, 42: eos_id}; field 3 =
    NormalizerSpec {1: name, 3: add_dummy_prefix, 4: remove_extra_whitespaces}.
    """
    with open(reading(path), "rb") as f:
        buf = f.read()
    m = SentencePieceModel()
    try:
        for field, value in protobuf_fields(buf):
            if field == MODEL_PIECES and isinstance(value, bytes):
                text, score, kind = "", 0.0, 1
                for sub, sub_value in protobuf_fields(value):
                    if sub == PIECE_TEXT and isinstance(sub_value, bytes):
                        text = sub_value.decode("utf-8", errors="strict")
                    elif sub == PIECE_SCORE and isinstance(sub_value, bytes) and len(sub_value) == 4:
                        score = struct.unpack("<f", sub_value)[0]
                    elif sub == PIECE_TYPE and isinstance(sub_value, int):
                        kind = sub_value
                m.pieces.append((text, score, kind))
            elif field == MODEL_TRAINER_SPEC and isinstance(value, bytes):
                for sub, sub_value in protobuf_fields(value):
                    if sub == TRAINER_BOS_ID and isinstance(sub_value, int):
                        m.bos_id = as_int32(sub_value)
                    elif sub == TRAINER_EOS_ID and isinstance(sub_value, int):
                        m.eos_id = as_int32(sub_value)
                    elif sub == TRAINER_MODEL_TYPE and isinstance(sub_value, int):
                        m.model_type = sub_value
                    elif sub == TRAINER_BYTE_FALLBACK and isinstance(sub_value, int):
                        m.byte_fallback = bool(sub_value)
            elif field == MODEL_NORMALIZER_SPEC and isinstance(value, bytes):
                for sub, sub_value in protobuf_fields(value):
                    if sub == NORMALIZER_NAME and isinstance(sub_value, bytes):
                        m.normalizer = sub_value.decode("utf-8", errors="replace")
                    elif sub == NORMALIZER_DUMMY_PREFIX and isinstance(sub_value, int):
                        m.add_dummy_prefix = bool(sub_value)
                    elif sub == NORMALIZER_REMOVE_SPACES and isinstance(sub_value, int):
                        m.remove_extra_whitespaces = bool(sub_value)
    except UnicodeDecodeError:
        raise ExportError(f"{path}: a piece is not valid UTF-8")
    if not m.pieces:
        raise ExportError(f"{path}: no pieces: not a SentencePiece model")
    return m


def check_piece(i, piece, score, max_bytes=MAX_LLAMA2C_PIECE_BYTES):
    """(piece, score) of token i, checked as run.c reads it: at most max_bytes bytes, a finite float32 score."""
    if len(piece) > max_bytes:
        raise ExportError(f"tokenizer piece {i} has {len(piece)} bytes, more than run.c's limit of {max_bytes}")
    if not math.isfinite(f32(score)):
        raise ExportError(f"tokenizer piece {i} has the score {score}, which is not finite (in float32)")
    return piece, score


def export_tokenizer(model_path, out_path):
    """Write llama2.c's tokenizer.bin, as llama2.c's tokenizer.py export does."""
    m = read_sentencepiece_model(model_path)
    tokens = []
    for i, (text, score, _) in enumerate(m.pieces):
        if i == m.bos_id:
            text = "\n<s>\n"
        elif i == m.eos_id:
            text = "\n</s>\n"
        tokens.append(check_piece(i, text.replace(SPACE_MARK, " ").encode("utf-8"), score))
    max_token_length = max(len(b) for b, _ in tokens)
    if max_token_length < 1:
        raise ExportError(f"{model_path}: every piece is empty (run.c needs a max_token_length of at least 1)")

    def write(f):
        f.write(struct.pack("<i", max_token_length))
        for b, score in tokens:
            f.write(struct.pack("<fi", score, len(b)))
            f.write(b)

    write_atomically(out_path, write)
    print(f"wrote {out_path}: {len(tokens)} tokens, max token length {max_token_length}")


# ----------------------------------------------------------------------------
# Tokenizer section ("TOKN", docs/format.md): a model's own tokenizer, for run.c
#
# Three kinds, all BPE: 1 SentencePiece's tokenizer.model (merge the pair whose
# concatenation scores highest), 2 byte-level BPE from a tokenizer.json (GPT-2's byte
# alphabet, a pre-tokenizer pattern, merges by rank), 3 a SentencePiece-style
# tokenizer.json ('▁' for a space, byte fallback, merges by rank). Everything run.c
# needs is in the file: pieces, merges, the special tokens and chat template, and for
# byte-level kinds the Unicode tables the patterns and the NFC normalizer use.

TOKN_MAGIC = 0x4E4B4F54  # the bytes "TOKN"
TOKN_VERSION = 1
TOKN_HEADER_BYTES = 128
# magic, version, kind, n_tokens, max_token_length, bos_id, add_bos, eot_id, n_eos,
# eos_ids[8], pretokenizer, flags, chat_template, n_merges, n_class_ranges,
# n_decompositions, n_compositions, n_ccc_ranges (bytes 0..99); 100..127 reserved (zero)
TOKN_HEADER = struct.Struct("<I8i8iiIi5i")
KIND_SENTENCEPIECE, KIND_BYTE_LEVEL, KIND_SP_JSON = 1, 2, 3
KIND_NAMES = {KIND_SENTENCEPIECE: "SentencePiece BPE (tokenizer.model)", KIND_BYTE_LEVEL: "byte-level BPE",
              KIND_SP_JSON: "SentencePiece-style BPE (tokenizer.json)"}
# piece types: never produced from user text (control), matched whole before BPE
# (user-defined), <0xXX> (byte), never produced (unused)
TYPE_NORMAL, TYPE_CONTROL, TYPE_USER, TYPE_BYTE, TYPE_UNUSED = range(5)
SP_TYPES = {1: TYPE_NORMAL, 2: TYPE_CONTROL, 3: TYPE_CONTROL, 4: TYPE_USER, 5: TYPE_UNUSED, 6: TYPE_BYTE}
PRE_NONE, PRE_GPT2, PRE_LLAMA3, PRE_QWEN2, PRE_O200K = range(5)
PRE_NAMES = ["none", "gpt2", "llama3 (cl100k)", "qwen2", "o200k"]
FLAG_DUMMY_PREFIX = 1       # SentencePiece: a space before non-empty text
FLAG_BYTE_FALLBACK = 2      # characters with no piece become <0xXX> pieces
FLAG_IGNORE_MERGES = 4      # a pre-token that is a piece is one token (Llama 3)
FLAG_SPLIT_DIGITS = 8       # every digit its own pre-token before the pattern (SmolLM2)
FLAG_NFC = 16               # normalize the text to NFC first (Qwen)
FLAG_PREFIX_EACH_SEGMENT = 32  # the dummy prefix goes before every text segment between user-defined pieces
FLAG_SPLIT_NEWLINES = 64    # kind 3: BPE within runs of newlines and runs of other characters (Gemma 4 GGUF)
TEMPLATE_NAMES = ["none", "llama2", "llama3", "chatml", "gemma", "zephyr", "mistral", "qwen2.5", "smollm2", "gemma4",
                  "gemma4-large"]
MAX_END_TOKENS = 8
MAX_PIECE_BYTES = 65536  # run.c's limit on a TOKN piece

# The pre-tokenizer patterns run.c implements as hand-written scanners, exactly as the
# models' tokenizer.json files spell them (GPT-2's is ByteLevel's built-in use_regex pattern).
PATTERNS = {
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+": PRE_GPT2,
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+": PRE_LLAMA3,
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+": PRE_QWEN2,
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+": PRE_O200K,
}
# Chat templates, recognised by markers only that family's template writes (checked in this order)
TEMPLATE_MARKERS = [
    ("gemma4", ["<|turn>", "<turn|>"]),
    ("llama3", ["<|start_header_id|>", "<|eot_id|>"]),
    ("chatml", ["<|im_start|>", "<|im_end|>"]),
    ("gemma", ["<start_of_turn>", "<end_of_turn>"]),
    ("zephyr", ["<|user|>", "<|assistant|>"]),
    ("llama2", ["[INST]", "<<SYS>>"]),
    ("mistral", ["[INST]", "[/INST]"]),
]
TEMPLATE_NOT = {"zephyr": ["<|end|>"], "mistral": ["<<SYS>>"]}  # Phi-3's <|end|>; Llama 2's <<SYS>>
# Gemma 4 26B-A4B/31B: thinking off, the generation prompt also writes an empty thought channel
# after "<|turn>model\n" (E2B/E4B's does not): run's gemma4-large
GEMMA4_LARGE_MARKER = "{{- '<|channel>thought\\n<channel|>' -}}"
# ChatML templates that write a default system prompt when none is given (Qwen3's writes none: chatml)
CHATML_DEFAULT_SYSTEM = [("qwen2.5", "You are Qwen, created by Alibaba Cloud"),
                         ("smollm2", "You are a helpful AI assistant named SmolLM, trained by Hugging Face")]
# the token that closes a turn, for the templates that have their own
TEMPLATE_EOT = {"llama3": "<|eot_id|>", "chatml": "<|im_end|>", "gemma": "<end_of_turn>", "qwen2.5": "<|im_end|>",
                "smollm2": "<|im_end|>", "gemma4": "<turn|>", "gemma4-large": "<turn|>"}
# special tokens of a template that a tokenizer.json may list as plain vocabulary (Gemma 1)
TEMPLATE_SPECIALS = {"llama3": ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
                     "chatml": ["<|im_start|>", "<|im_end|>"], "gemma": ["<start_of_turn>", "<end_of_turn>"],
                     "qwen2.5": ["<|im_start|>", "<|im_end|>"], "smollm2": ["<|im_start|>", "<|im_end|>"],
                     "gemma4": ["<|turn>", "<turn|>"], "gemma4-large": ["<|turn>", "<turn|>"]}


class Tokenizer:
    """What a TOKN section holds (docs/format.md), before it is packed."""

    def __init__(self, kind, source):
        self.kind, self.source = kind, source   # source: the file it came from, for messages
        self.pieces = []    # [(bytes, type, score)], index = token id
        self.merges = np.zeros((0, 2), np.int32)  # (left_id, right_id), rank = row
        self.bos_id, self.add_bos, self.eot_id, self.eos_ids = -1, 0, -1, []
        self.pretokenizer, self.flags, self.chat_template = PRE_NONE, 0, 0
        self.names = {}     # token text as the tokenizer files spell it -> id
        self.merged = set()  # ids some merge produces
        self.post_bos = None  # the id the tokenizer file itself puts before a text (None: none)
        self.sp_eos = None    # a tokenizer.model's own eos id
        self.template_flag = False  # the chat template came from --template (else tokenizer_config.json)

    def describe(self):
        """One line: the kind, the scheme, the flags and the special tokens."""
        flags = [name for bit, name in [(FLAG_DUMMY_PREFIX, "dummy prefix"), (FLAG_BYTE_FALLBACK, "byte fallback"),
                                        (FLAG_IGNORE_MERGES, "ignore_merges"), (FLAG_SPLIT_DIGITS, "split digits"),
                                        (FLAG_NFC, "NFC"), (FLAG_PREFIX_EACH_SEGMENT, "prefix each segment"),
                                        (FLAG_SPLIT_NEWLINES, "split newlines")]
                 if self.flags & bit]
        scheme = f", pre-tokenizer {PRE_NAMES[self.pretokenizer]}" if self.kind == KIND_BYTE_LEVEL else ""
        return (f"{KIND_NAMES[self.kind]}{scheme}{''.join(', ' + f for f in flags)}; {len(self.pieces)} tokens, "
                f"{len(self.merges)} merges; bos {self.bos_id}{' (added)' if self.add_bos else ''}, "
                f"eos {' '.join(map(str, self.eos_ids))}, eot {self.eot_id}, "
                f"template {TEMPLATE_NAMES[self.chat_template]}")


def gpt2_byte_alphabet():
    """{character: byte} of GPT-2's bytes_to_unicode: printable bytes stand for themselves,
    the other 68 for the characters U+0100.. in byte order (so that no piece holds a space,
    a control character or an invalid UTF-8 sequence)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def byte_level_bytes(text, alphabet, what):
    """The bytes a byte-level BPE token stands for: each character of GPT-2's alphabet one byte."""
    try:
        return bytes(alphabet[c] for c in text)
    except KeyError as e:
        raise ExportError(f"{what} has {e.args[0]!r}, which is not in GPT-2's byte alphabet")


def token_text(value):
    """A special token as tokenizer_config.json gives it: a string, or {"content": ...}; None if absent."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def json_items(node, key):
    """The members of a Sequence (node[key]) or [node] for a single one; [] for null."""
    if node is None:
        return []
    if not isinstance(node, dict):
        raise ExportError(f"{node!r} is not an object")
    if node.get("type") == "Sequence":
        items = node.get(key)
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise ExportError(f"a Sequence without a list of {key}")
        return [x for item in items for x in json_items(item, key)]
    return [node]


def brief(node):
    """A JSON node, cut short for a one-line message."""
    text = json.dumps(node, ensure_ascii=False)
    return text if len(text) <= 200 else text[:200] + "..."


def json_normalizer(node, kind):
    """(flags, spaces replaced by '▁') of a tokenizer.json normalizer; refuse those run.c lacks."""
    flags, replaces_spaces = 0, False
    for n in json_items(node, "normalizers"):
        t = n.get("type")
        if t == "NFC" and kind == KIND_BYTE_LEVEL:
            flags |= FLAG_NFC
        elif t == "Prepend" and kind == KIND_SP_JSON and n.get("prepend") == SPACE_MARK:
            flags |= FLAG_DUMMY_PREFIX | FLAG_PREFIX_EACH_SEGMENT  # normalizers run on each segment
        elif (t == "Replace" and kind == KIND_SP_JSON and n.get("pattern") == {"String": " "}
              and n.get("content") == SPACE_MARK):
            replaces_spaces = True
        else:
            allowed = "NFC" if kind == KIND_BYTE_LEVEL else "Prepend('▁') and Replace(' ', '▁')"
            raise ExportError(f"normalizer {t or brief(n)} is not supported for {KIND_NAMES[kind]} (run.c "
                              f"implements {allowed})")
    return flags, replaces_spaces


def byte_level_pretokenizer(node):
    """(pretokenizer code, flags) of a byte-level tokenizer.json's pre_tokenizer.

    Accepted: ByteLevel(use_regex true) alone (GPT-2's pattern); Split(Regex P, Isolated)
    then ByteLevel(use_regex false), P one of PATTERNS (o200k's files say Removed with
    invert true, which keeps exactly the matches: the same, since P matches every
    character); Digits(individual_digits true) before either (SmolLM2).
    """
    scheme, flags, byte_level = None, 0, False

    def set_scheme(code, what):
        nonlocal scheme
        if scheme is not None:
            raise ExportError(f"pre_tokenizer has two patterns ({PRE_NAMES[scheme]} and {what}); run.c applies one")
        scheme = code

    for p in json_items(node, "pretokenizers"):
        t = p.get("type")
        if t == "ByteLevel":
            if p.get("add_prefix_space"):
                raise ExportError("pre_tokenizer ByteLevel with add_prefix_space true is not supported")
            byte_level = True
            if p.get("use_regex", True):
                set_scheme(PRE_GPT2, "ByteLevel's own gpt2")
        elif t == "Split":
            pattern = p.get("pattern") if isinstance(p.get("pattern"), dict) else {}
            regex = pattern.get("Regex")
            if not isinstance(regex, str):
                raise ExportError(f"pre_tokenizer Split on {brief(pattern)} is not supported (only the regex "
                                  f"patterns {', '.join(PRE_NAMES[1:])})")
            if regex not in PATTERNS:
                raise ExportError(f"pre_tokenizer pattern {json.dumps(regex, ensure_ascii=False)} is not one run.c "
                                  f"implements ({', '.join(PRE_NAMES[1:])})")
            if (p.get("behavior"), bool(p.get("invert"))) not in (("Isolated", False), ("Removed", True)):
                raise ExportError(f"pre_tokenizer Split with behavior {p.get('behavior')!r}, invert "
                                  f"{p.get('invert')!r} is not supported (only Isolated, or Removed inverted)")
            if byte_level:
                raise ExportError("pre_tokenizer: a Split after ByteLevel is not supported")
            set_scheme(PATTERNS[regex], PRE_NAMES[PATTERNS[regex]])
        elif t == "Digits":
            if not p.get("individual_digits"):
                raise ExportError("pre_tokenizer Digits without individual_digits is not supported")
            if scheme is not None:
                raise ExportError("pre_tokenizer: Digits after the pattern is not supported (only before)")
            flags |= FLAG_SPLIT_DIGITS
        else:
            raise ExportError(f"pre_tokenizer {t or brief(p)} is not supported for byte-level BPE (run.c "
                              "implements ByteLevel, Split with a known pattern, and Digits)")
    if not byte_level:
        raise ExportError("a byte-level tokenizer.json whose pre_tokenizer has no ByteLevel is not supported")
    return (PRE_NONE if scheme is None else scheme), flags


def sp_json_pretokenizer(node, replaces_spaces):
    """(flags, spaces replaced) of a SentencePiece-style tokenizer.json's pre_tokenizer.

    null; Metaspace('▁', split false) with prepend_scheme always / first / never (older
    files: add_prefix_space); Split(String ' ', MergedWithPrevious) after a normalizer
    that has already turned every space into '▁' (Gemma 3), which finds nothing to split.
    """
    flags = 0
    for p in json_items(node, "pretokenizers"):
        t = p.get("type")
        if t == "Metaspace" and p.get("replacement", SPACE_MARK) == SPACE_MARK:
            if p.get("split", True):
                raise ExportError("pre_tokenizer Metaspace with split true is not supported (SentencePiece does "
                                  "not split the text at spaces)")
            scheme = p.get("prepend_scheme", "always" if p.get("add_prefix_space", True) else "never")
            if scheme not in ("always", "first", "never"):
                raise ExportError(f"pre_tokenizer Metaspace prepend_scheme {scheme!r} is not supported")
            if scheme != "never":
                flags |= FLAG_DUMMY_PREFIX | (FLAG_PREFIX_EACH_SEGMENT if scheme == "always" else 0)
            replaces_spaces = True
        elif (t == "Split" and replaces_spaces and p.get("pattern") == {"String": " "}
              and p.get("behavior") == "MergedWithPrevious"):
            continue  # no spaces are left after the normalizer
        else:
            raise ExportError(f"pre_tokenizer {t or brief(p)} is not supported for SentencePiece-style BPE "
                              "(run.c implements Metaspace without split)")
    if not replaces_spaces:
        raise ExportError("a SentencePiece-style tokenizer.json that does not turn spaces into '▁' (by a Replace "
                          "normalizer or a Metaspace pre-tokenizer) is not supported")
    return flags


def post_processor_bos(node, special_ids, n_tokens):
    """The id the post_processor puts before a single text (TemplateProcessing), or None."""
    bos = None
    for p in json_items(node, "processors"):
        t = p.get("type")
        if t == "ByteLevel":
            continue  # offsets only
        if t != "TemplateProcessing":
            raise ExportError(f"post_processor {t or brief(p)} is not supported (only TemplateProcessing and "
                              "ByteLevel)")
        single = p.get("single") or []
        if not isinstance(single, list):
            raise ExportError(f"post_processor TemplateProcessing: single {brief(single)} is not a list")
        names = [item["SpecialToken"].get("id") for item in single
                 if isinstance(item, dict) and isinstance(item.get("SpecialToken"), dict)]
        sequence_at = next((i for i, item in enumerate(single) if isinstance(item, dict) and "Sequence" in item), None)
        if sequence_at is None or len(names) != len(single) - 1 or sequence_at > 1:
            raise ExportError(f"post_processor TemplateProcessing {brief(single)} is not supported (only an "
                              "optional special token before the text)")
        if sequence_at == 1:
            name = names[0]
            if not isinstance(name, str):
                raise ExportError(f"post_processor TemplateProcessing: the special token {brief(name)} is not named "
                                  "by a string")
            specials = p.get("special_tokens") or {}
            entry = specials.get(name) if isinstance(specials, dict) else None
            if not isinstance(specials, dict) or not isinstance(entry, (dict, type(None))):
                raise ExportError(f"post_processor TemplateProcessing special_tokens {brief(specials)} must be an "
                                  "object of objects")
            ids = (entry or {}).get("ids")
            if ids is not None:
                if not (isinstance(ids, list) and len(ids) == 1 and is_int(ids[0]) and 0 <= ids[0] < n_tokens):
                    raise ExportError(f"post_processor TemplateProcessing special_tokens {name!r} ids {brief(ids)}: "
                                      f"must be one token id in [0, {n_tokens})")
                bos = ids[0]
            elif name in special_ids:
                bos = special_ids[name]
            else:
                raise ExportError(f"post_processor adds {name!r}, which is not a token")
        if len(names) > sequence_at:
            say_later(f"warning: post_processor appends {names[sequence_at:]} after the text; run does not append it")
    return bos


def read_tokenizer_json(path):
    """A Tokenizer (kind 2 or 3) from a tokenizer.json's model, normalizer and pre_tokenizer."""
    j = read_json(path)
    model = j.get("model")
    if not isinstance(model, dict):
        raise ExportError(f"{path}: no \"model\" object: not a tokenizer.json")
    model_type = model.get("type", "BPE" if "merges" in model else None)
    if model_type != "BPE":
        raise ExportError(f"{path}: model type {model_type!r} is not supported (only BPE; Unigram, WordPiece and "
                          "WordLevel tokenizers are not)")
    if model.get("dropout") not in (None, 0, 0.0):
        raise ExportError(f"{path}: BPE dropout {model['dropout']!r} is not supported")
    for key in ("continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            raise ExportError(f"{path}: BPE {key} {model[key]!r} is not supported")
    vocab, merges, added = model.get("vocab"), model.get("merges", []), j.get("added_tokens") or []
    if not (isinstance(vocab, dict) and vocab and all(is_int(i) and 0 <= i < INT32_MAX for i in vocab.values())):
        raise ExportError(f"{path}: model.vocab is not a non-empty object of token ids")
    if not isinstance(merges, list) or not isinstance(added, list):
        raise ExportError(f"{path}: model.merges and added_tokens must be lists")
    try:
        decoder = j.get("decoder")
        byte_level = any(p.get("type") == "ByteLevel" for p in json_items(j.get("pre_tokenizer"), "pretokenizers")) \
            or (isinstance(decoder, dict) and decoder.get("type") == "ByteLevel")
        kind = KIND_BYTE_LEVEL if byte_level else KIND_SP_JSON
        tok = Tokenizer(kind, path)
        flags, replaces_spaces = json_normalizer(j.get("normalizer"), kind)
        if kind == KIND_BYTE_LEVEL:
            tok.pretokenizer, more = byte_level_pretokenizer(j.get("pre_tokenizer"))
        else:
            more = sp_json_pretokenizer(j.get("pre_tokenizer"), replaces_spaces)
            if not model.get("byte_fallback"):
                raise ExportError("a SentencePiece-style tokenizer.json without byte_fallback is not supported")
            more |= FLAG_BYTE_FALLBACK
        tok.flags = flags | more | (FLAG_IGNORE_MERGES if model.get("ignore_merges") else 0)
        tok.pieces, tok.names = json_pieces(path, kind, vocab, added)
        tok.merges, tok.merged = merge_pairs(path, merges, vocab)
        tok.post_bos = post_processor_bos(j.get("post_processor"), tok.names, len(tok.pieces))
    except ExportError as e:
        message = str(e)
        raise ExportError(message if message.startswith(f"{path}: ") else f"{path}: {message}")
    return tok


BYTE_PIECE = re.compile(r"<0x[0-9A-F]{2}>")


def utf8(text, what):
    """text as UTF-8 bytes; a lone surrogate (JSON's "\ud800") has none, and is refused naming what."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise ExportError(f"{what} {text!r} is not valid Unicode (it holds a lone surrogate)")


def json_pieces(path, kind, vocab, added):
    """([(bytes, type, 0.0)] by id, {text: id}) from model.vocab and added_tokens.

    Byte-level pieces are stored as the bytes GPT-2's alphabet stands for; SentencePiece-style
    ones with ' ' for '▁'. added_tokens with "special" are control pieces; the others are
    user-defined (transformers splits them out of the text before BPE), except a
    SentencePiece-style one that holds '▁': its literal text cannot be typed in that
    convention, and BPE reaches it from spaces (Gemma 3's runs of '▁').
    """
    alphabet = gpt2_byte_alphabet()
    texts = {i: (text, TYPE_NORMAL) for text, i in vocab.items()}
    if len(texts) != len(vocab):
        raise ExportError(f"{path}: two vocabulary entries share an id")
    names = dict(vocab)
    for a in added:
        if not (isinstance(a, dict) and isinstance(a.get("content"), str) and a["content"]
                and is_int(a.get("id")) and 0 <= a["id"] < INT32_MAX):
            raise ExportError(f"{path}: added token {brief(a)} has no content or id")
        i, content = a["id"], a["content"]
        if i in texts:  # the vocabulary's piece must be the same text (in GPT-2's alphabet, for byte-level)
            same = texts[i][0] == content
            if kind == KIND_BYTE_LEVEL and not same and all(c in alphabet for c in texts[i][0]):
                same = bytes(alphabet[c] for c in texts[i][0]) == content.encode("utf-8")
            if not same:
                raise ExportError(f"{path}: added token {content!r} has id {i}, which the vocabulary gives to "
                                  f"{texts[i][0]!r}")
        if a.get("special"):
            kind_of = TYPE_CONTROL
        else:
            if a.get("lstrip") or a.get("rstrip") or a.get("single_word"):
                raise ExportError(f"{path}: added token {content!r}: lstrip, rstrip and single_word are not "
                                  "supported")
            kind_of = TYPE_NORMAL if kind == KIND_SP_JSON and SPACE_MARK in content else TYPE_USER
        texts[i] = (content, kind_of, True)
        names[content] = i
    n_tokens = max(texts) + 1
    gaps = n_tokens - len(texts)
    if gaps > len(texts):  # before a list of n_tokens pieces is made
        raise ExportError(f"{path}: token id {n_tokens - 1} leaves {gaps} ids without a token, more than there are "
                          "tokens (a corrupt vocabulary?)")
    if gaps:
        say_later(f"warning: {path}: {gaps} ids below {n_tokens} have no token; they are stored as unused pieces")
    pieces = [(b"", TYPE_UNUSED, 0.0)] * n_tokens
    for i, entry in texts.items():
        text, kind_of = entry[0], entry[1]
        is_added = len(entry) == 3
        what = f"{path}: {'added token' if is_added else 'piece'} (id {i})"
        if kind_of in (TYPE_CONTROL, TYPE_USER) and (is_added or kind == KIND_SP_JSON):
            data = utf8(text, what)
        elif kind == KIND_BYTE_LEVEL:
            data = byte_level_bytes(text, alphabet, f"{path}: piece {text!r} (id {i})")
        else:
            data = utf8(text, what).replace(SPACE_MARK.encode("utf-8"), b" ")
            if BYTE_PIECE.fullmatch(text):
                kind_of = TYPE_BYTE
        pieces[i] = (data, kind_of, 0.0)
    return pieces, names


def merge_pairs(path, merges, vocab):
    """((n, 2) int32 array of (left_id, right_id) by rank, set of merged ids) from model.merges.

    Both serialisations: "left right" strings (older files) and ["left", "right"] pairs.
    Refuses a merge naming a token not in the vocabulary or whose concatenation is not one.
    """
    pairs = np.empty((len(merges), 2), np.int32)
    merged = set()
    for rank, m in enumerate(merges):
        parts = m.split(" ") if isinstance(m, str) else m
        if not (isinstance(parts, list) and len(parts) == 2 and all(isinstance(x, str) for x in parts)):
            raise ExportError(f"{path}: merge {rank} {m!r} is not two tokens")
        left, right = parts
        for part in parts:
            if part not in vocab:
                raise ExportError(f"{path}: merge {rank} ({left!r} {right!r}) names {part!r}, which is not in "
                                  "the vocabulary")
        if left + right not in vocab:
            raise ExportError(f"{path}: merge {rank} ({left!r} {right!r}) makes {left + right!r}, which is not in "
                              "the vocabulary")
        pairs[rank] = vocab[left], vocab[right]
        merged.add(vocab[left + right])
    return pairs, merged


def read_sentencepiece_tokenizer(path):
    """A Tokenizer (kind 1) from a SentencePiece tokenizer.model (BPE, identity normalizer)."""
    m = read_sentencepiece_model(path)
    if m.model_type != SP_MODEL_BPE:
        names = {1: "unigram", 2: "bpe", 3: "word", 4: "char"}
        raise ExportError(f"{path}: SentencePiece model type {names.get(m.model_type, m.model_type)} is not "
                          "supported (only bpe: run.c merges pairs by score)")
    if m.normalizer not in ("", "identity") or m.remove_extra_whitespaces:
        raise ExportError(f"{path}: SentencePiece normalizer {m.normalizer or 'nmt_nfkc'!r} (remove_extra_whitespaces "
                          f"{str(m.remove_extra_whitespaces).lower()}) is not supported (only identity, without "
                          "removing spaces)")
    tok = Tokenizer(KIND_SENTENCEPIECE, path)
    tok.flags = (FLAG_DUMMY_PREFIX if m.add_dummy_prefix else 0) | (FLAG_BYTE_FALLBACK if m.byte_fallback else 0)
    for i, (text, score, sp_type) in enumerate(m.pieces):
        if sp_type not in SP_TYPES:
            raise ExportError(f"{path}: piece {i} has type {sp_type}, not a SentencePiece piece type")
        if not math.isfinite(f32(score)):
            raise ExportError(f"{path}: piece {i} has score {score}, which is not finite")
        tok.pieces.append((text.replace(SPACE_MARK, " ").encode("utf-8"), SP_TYPES[sp_type], score))
        tok.names.setdefault(text, i)
    tok.merged = {i for i, (_, t, _) in enumerate(tok.pieces) if t == TYPE_NORMAL}
    n = len(m.pieces)
    tok.post_bos = m.bos_id if 0 <= m.bos_id < n else None
    tok.sp_eos = m.eos_id if 0 <= m.eos_id < n else None
    return tok


def tokenizer_sidecars(tokenizer_path):
    """(tokenizer_config, generation_config, config) dicts beside a tokenizer file ({} when absent)."""
    folder = os.path.dirname(os.path.abspath(tokenizer_path))
    found = []
    for name in ("tokenizer_config.json", "generation_config.json", "config.json"):
        path = os.path.join(folder, name)
        found.append(read_json(path) if os.path.isfile(path) else {})
    chat_jinja = os.path.join(folder, "chat_template.jinja")
    if not found[0].get("chat_template") and os.path.isfile(chat_jinja):
        with open(reading(chat_jinja), encoding="utf-8") as f:
            found[0]["chat_template"] = f.read()
    return found


def classify_template(template):
    """The TEMPLATE_NAMES index of a chat_template string (or named list), 0 if none or unrecognised."""
    if isinstance(template, list):  # [{"name": "default", "template": "..."}, {"name": "tool_use", ...}]
        named = {t.get("name"): t.get("template") for t in template
                 if isinstance(t, dict) and isinstance(t.get("name"), str)}
        template = named.get("default", next(iter(named.values()), None))
    if not isinstance(template, str) or not template:
        return 0, "no chat_template"
    if "<|turn>" in template and GEMMA4_LARGE_MARKER in template:
        return TEMPLATE_NAMES.index("gemma4-large"), ""
    for name, markers in TEMPLATE_MARKERS:
        if all(m in template for m in markers) and not any(m in template for m in TEMPLATE_NOT.get(name, [])):
            if name == "chatml":
                name = next((n for n, sentence in CHATML_DEFAULT_SYSTEM if sentence in template), name)
            return TEMPLATE_NAMES.index(name), ""
    return 0, "its chat_template is none of " + ", ".join(TEMPLATE_NAMES[1:])


def set_special_tokens(tok, template_name=None):
    """bos, add_bos, eos_ids, eot_id and chat_template from the files beside the tokenizer.

    bos: tokenizer_config's bos_token and add_bos_token when it says, else the token the
    post_processor puts first (Llama 3); eos: generation_config.json's eos_token_id (an
    int or a list), else tokenizer_config's eos_token, else config.json's eos_token_id
    (else the SentencePiece model's eos); eot: the recognised template's closing token, else
    the first of <|eot_id|>, <|im_end|>, <end_of_turn> the vocabulary has, else eos.
    """
    tc, gen, cfg = tokenizer_sidecars(tok.source)
    n = len(tok.pieces)

    def named(text, where):
        if text not in tok.names:
            raise ExportError(f"{where}: {text!r} is not a token of {tok.source}")
        return tok.names[text]

    bos_text = token_text(tc.get("bos_token"))
    bos_named = named(bos_text, "tokenizer_config.json bos_token") if bos_text else None
    if isinstance(tc.get("add_bos_token"), bool):
        tok.add_bos = int(bool(tc["add_bos_token"]))
        tok.bos_id = bos_named if bos_named is not None else tok.post_bos
    else:
        tok.add_bos = int(tok.post_bos is not None)
        tok.bos_id = tok.post_bos if tok.post_bos is not None else bos_named
    if tok.bos_id is None:
        tok.bos_id = -1
    if tok.add_bos and tok.bos_id < 0:
        raise ExportError("tokenizer_config.json: add_bos_token is true but there is no bos_token")

    ids, where = gen.get("eos_token_id"), "generation_config.json eos_token_id"
    if ids is None and token_text(tc.get("eos_token")):
        ids, where = named(token_text(tc.get("eos_token")), "tokenizer_config.json eos_token"), \
            "tokenizer_config.json eos_token"
    if ids is None:
        ids, where = cfg.get("eos_token_id"), "config.json eos_token_id"
    if ids is None:
        ids, where = tok.sp_eos, f"{tok.source} eos_id"
    if ids is None:
        raise ExportError(f"{tok.source}: no end-of-sequence token (no generation_config.json eos_token_id, "
                          "tokenizer_config.json eos_token or config.json eos_token_id beside it)")
    ids = ids if isinstance(ids, list) else [ids]
    if not ids or not all(is_int(i) and 0 <= i < n for i in ids):
        raise ExportError(f"{where} {ids!r}: must be token ids in [0, {n})")
    tok.eos_ids = list(dict.fromkeys(ids))
    if len(tok.eos_ids) > MAX_END_TOKENS:
        raise ExportError(f"{where}: {len(tok.eos_ids)} end tokens; run stops at up to {MAX_END_TOKENS}")

    set_template_and_eot(tok, tc.get("chat_template"), template_name)
    mark_special_pieces(tok)


def set_template_and_eot(tok, template, template_name=None, eot_id=None):
    """tok.chat_template from template_name (--template) or the chat template text; tok.eot_id:
    eot_id when given, else the recognised template's closing token, else the first of
    <|eot_id|>, <|im_end|>, <end_of_turn> the vocabulary has, else eos."""
    tok.template_flag = template_name is not None
    if template_name is not None:
        tok.chat_template = TEMPLATE_NAMES.index(template_name)
    else:
        tok.chat_template, why = classify_template(template)
        if not tok.chat_template:
            say_later(f"note: chat template: none stored ({why}); run -m chat will ask for --template "
                      f"({', '.join(TEMPLATE_NAMES[1:])})")
    if eot_id is not None:
        tok.eot_id = eot_id
        return
    closer = TEMPLATE_EOT.get(TEMPLATE_NAMES[tok.chat_template])
    if closer is None and not tok.chat_template:
        closer = next((t for t in dict.fromkeys(TEMPLATE_EOT.values()) if t in tok.names), None)
    tok.eot_id = tok.names.get(closer, tok.eos_ids[0])


def mark_special_pieces(tok):
    """Make bos, eot, the eos tokens and the template's special tokens control pieces (below)."""
    # the special tokens are control pieces, even where a tokenizer.json lists them as plain
    # vocabulary (Gemma 1's <start_of_turn>), unless text can produce them: a merge makes
    # them, or they are a single character (where BPE starts)
    specials = [tok.bos_id, tok.eot_id, *tok.eos_ids]
    specials += [tok.names[t] for t in TEMPLATE_SPECIALS.get(TEMPLATE_NAMES[tok.chat_template], []) if t in tok.names]
    for i in specials:
        data, kind_of, score = tok.pieces[i] if i >= 0 else (b"", None, None)
        single = len(data.decode("utf-8", errors="replace")) <= 1
        if kind_of in (TYPE_NORMAL, TYPE_USER) and i not in tok.merged and not single:
            tok.pieces[i] = (data, TYPE_CONTROL, score)


# ----------------------------------------------------------------------------
# Unicode tables for run.c's scanners and NFC, from Python's unicodedata

CATEGORY_CLASSES = {"Lu": 1, "Lt": 1, "Ll": 2, "Lm": 4, "Lo": 4, "Mn": 8, "Mc": 8, "Me": 8,
                    "Nd": 16, "Nl": 16, "No": 16}
CLASS_WHITE_SPACE = 32
# \s of Oniguruma (the regex engine of Hugging Face's tokenizers) with Unicode: U+0009..000D,
# U+0085 and the separators Zs, Zl, Zp: the same set as Unicode's White_Space property.
# (JavaScript's \s differs: it adds U+FEFF and leaves out U+0085.)
WHITE_SPACE_CONTROLS = {0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x85}


def ranges_of(values):
    """[(first, last, value)] of the runs of equal non-zero values in a list indexed by code point."""
    out, cp = [], 0
    for value, run in itertools.groupby(values):
        n = sum(1 for _ in run)
        if value:
            out.append((cp, cp + n - 1, value))
        cp += n
    return out


def table(rows):
    """An (n, 3) little-endian uint32 array of rows."""
    return np.array(rows, dtype="<u4").reshape(-1, 3)


@functools.lru_cache(maxsize=None)
def class_ranges():
    """The class table: (first, last, classes bits) for every code point with a class."""
    white = {"Zs", "Zl", "Zp"}
    bits = [CATEGORY_CLASSES.get(category, 0) | (CLASS_WHITE_SPACE if category in white else 0)
            for category in map(unicodedata.category, map(chr, range(0x110000)))]
    for cp in WHITE_SPACE_CONTROLS:
        bits[cp] |= CLASS_WHITE_SPACE
    return table(ranges_of(bits))


@functools.lru_cache(maxsize=None)
def nfc_tables():
    """(decompositions, compositions, ccc ranges): NFC's data (docs/format.md)."""
    decompositions, compositions = [], []
    mappings = map(unicodedata.decomposition, map(chr, range(0x110000)))
    for cp, mapping in enumerate(mappings):
        if mapping and not mapping.startswith("<"):  # canonical (compatibility ones start with <tag>)
            parts = [int(x, 16) for x in mapping.split()]
            if len(parts) > 2:
                raise ExportError(f"unicodedata: U+{cp:04X} decomposes into {len(parts)} code points")
            decompositions.append((cp, parts[0], parts[1] if len(parts) == 2 else 0))
            # a primary composite: two code points, not excluded from composition (NFC keeps it)
            if len(parts) == 2 and unicodedata.normalize("NFC", chr(cp)) == chr(cp):
                compositions.append((parts[0], parts[1], cp))
    ccc = list(map(unicodedata.combining, map(chr, range(0x110000))))
    return table(decompositions), table(sorted(compositions)), table(ranges_of(ccc))


# ----------------------------------------------------------------------------
# Checking and packing a Tokenizer


def check_tokenizer(tok, vocab_size=None):
    """Refuse a Tokenizer that does not fit the TOKN format or run.c's limits (docs/format.md)."""
    where = tok.source
    n = len(tok.pieces)
    if not 0 < n <= INT32_MAX:
        raise ExportError(f"{where}: {n} tokens")
    if vocab_size is not None and n > vocab_size:
        raise ExportError(f"{where}: the tokenizer has {n} tokens but the model only {vocab_size} (a tokenizer of "
                          "another model?)")
    for i, (data, kind_of, score) in enumerate(tok.pieces):
        if len(data) > MAX_PIECE_BYTES:
            raise ExportError(f"{where}: piece {i} is {len(data)} bytes long; the format allows {MAX_PIECE_BYTES}")
        if not math.isfinite(f32(score)):
            raise ExportError(f"{where}: piece {i} has score {score}, which is not finite in float32")
    lengths = [len(d) for d, _, _ in tok.pieces]
    if max(lengths) < 1:
        raise ExportError(f"{where}: every piece is empty")
    seen = {}
    for i, (data, kind_of, _) in enumerate(tok.pieces):
        if kind_of in (TYPE_NORMAL, TYPE_USER, TYPE_BYTE) and data:
            if data in seen:
                raise ExportError(f"{where}: pieces {seen[data]} and {i} are the same bytes {data!r}; run.c finds "
                                  "merged pieces by their bytes")
            seen[data] = i
    if not (-1 <= tok.bos_id < n and tok.add_bos in (0, 1) and -1 <= tok.eot_id < n):
        raise ExportError(f"{where}: bos {tok.bos_id}, add_bos {tok.add_bos} or eot {tok.eot_id} out of range")
    if not (1 <= len(tok.eos_ids) <= MAX_END_TOKENS and all(0 <= i < n for i in tok.eos_ids)):
        raise ExportError(f"{where}: eos ids {tok.eos_ids} must be 1..{MAX_END_TOKENS} ids below {n}")
    if len(tok.merges) and not (tok.merges.min() >= 0 and tok.merges.max() < n):
        raise ExportError(f"{where}: a merge names an id outside [0, {n})")
    check_byte_pieces(tok)
    check_template_tokens(tok)


def check_byte_pieces(tok):
    """Refuse byte pieces run.c cannot read: a byte-level vocabulary needs a one-byte (normal) piece
    for each of the 256 bytes, which BPE starts from; a byte piece of the other kinds is spelled
    <0xXX> with two upper-case hex digits."""
    if tok.kind == KIND_BYTE_LEVEL:
        singles = {data[0] for data, kind_of, _ in tok.pieces if len(data) == 1 and kind_of == TYPE_NORMAL}
        missing = [b for b in range(256) if b not in singles]
        if missing:
            alphabet = {b: ch for ch, b in gpt2_byte_alphabet().items()}
            raise ExportError(f"{tok.source}: the byte-level vocabulary has no piece for byte 0x{missing[0]:02X} "
                              f"({alphabet[missing[0]]!r} in GPT-2's byte alphabet; {len(missing)} of the 256 bytes "
                              "are missing): run.c needs one for every byte")
    for i, (data, kind_of, _) in enumerate(tok.pieces):
        if kind_of == TYPE_BYTE and not BYTE_PIECE.fullmatch(data.decode("latin-1")):
            raise ExportError(f"{tok.source}: piece {i} {data.decode('utf-8', 'replace')!r} is a byte piece but not "
                              "spelled <0xXX> with two upper-case hex digits, as run.c reads byte pieces")


def check_template_tokens(tok):
    """Refuse a chat template whose special tokens the vocabulary lacks (as special pieces, which is
    how run.c finds them): run -m chat would refuse the model, blaming a --template never given."""
    name = TEMPLATE_NAMES[tok.chat_template]
    specials = {data for data, kind_of, _ in tok.pieces if kind_of not in (TYPE_NORMAL, TYPE_BYTE)}
    for text in TEMPLATE_SPECIALS.get(name, []):
        if text.encode("utf-8") not in specials:
            if tok.template_flag:
                raise FlagError(f"--template {name}: {tok.source} has no special token {text!r}; the template does "
                                "not fit this tokenizer")
            raise ExportError(f"{tok.source}: its chat template, recognised from tokenizer_config.json chat_template "
                              f"as {name}, needs the special token {text!r}, which the vocabulary does not have "
                              "(give --template NAME or --template none)")


def drop_tail_beyond(tok, vocab_size):
    """Drop control pieces with ids >= the model's vocab_size (Gemma 3's <image_soft_token>), saying so."""
    n = len(tok.pieces)
    keep = n
    while keep > vocab_size and tok.pieces[keep - 1][1] in (TYPE_CONTROL, TYPE_UNUSED):
        keep -= 1
    if keep < n and keep == vocab_size:
        dropped = [tok.pieces[i][0].decode("utf-8", "replace") for i in range(keep, n)]
        if any(i >= keep for i in [tok.bos_id, tok.eot_id, *tok.eos_ids]):
            return
        say_later(f"note: {n - keep} control token(s) {dropped[:4]} beyond the model's {vocab_size} embedding rows "
                  "are left out (a text model cannot produce them)")
        tok.pieces = tok.pieces[:keep]


def tokenizer_bytes(tok):
    """The TOKN section (docs/format.md) as bytes."""
    if tok.kind == KIND_SENTENCEPIECE:
        tok.merges = np.zeros((0, 2), np.int32)
    tables = [table([])] * 4
    if tok.kind == KIND_BYTE_LEVEL:
        tables[0] = class_ranges()
    if tok.flags & FLAG_NFC:
        tables[1:] = nfc_tables()
    eos = tok.eos_ids + [-1] * (MAX_END_TOKENS - len(tok.eos_ids))
    max_len = max(len(d) for d, _, _ in tok.pieces)
    header = TOKN_HEADER.pack(TOKN_MAGIC, TOKN_VERSION, tok.kind, len(tok.pieces), max_len, tok.bos_id, tok.add_bos,
                              tok.eot_id, len(tok.eos_ids), *eos, tok.pretokenizer, tok.flags, tok.chat_template,
                              len(tok.merges), *(len(t) for t in tables))
    out = [header, bytes(TOKN_HEADER_BYTES - len(header))]
    for data, kind_of, score in tok.pieces:
        out.append(struct.pack("<fii", score, kind_of, len(data)))
        out.append(data + bytes(-len(data) % 4))
    out.append(np.ascontiguousarray(tok.merges, dtype="<i4").tobytes())
    out.extend(np.ascontiguousarray(t, dtype="<u4").tobytes() for t in tables)
    return b"".join(out)


def read_model_tokenizer(path, template_name=None):
    """A checked Tokenizer from a tokenizer.json or tokenizer.model (with its sidecar JSON files)."""
    with open(path, "rb") as f:
        start = f.read(64).lstrip()
    if path.endswith(".json") or start.startswith(b"{"):
        tok = read_tokenizer_json(path)
    else:
        tok = read_sentencepiece_tokenizer(path)
    set_special_tokens(tok, template_name)
    say_later(f"tokenizer {path}: {tok.describe()}")
    return tok


def find_tokenizer(folder):
    """The tokenizer file of a model directory: tokenizer.json, else tokenizer.model, else None."""
    for name in ("tokenizer.json", "tokenizer.model"):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            return path
    return None


def hf_tokenizer(model_dir, vocab_size, template_name=None):
    """The TOKN bytes of a model directory's tokenizer, checked against the model; None if it has none."""
    path = find_tokenizer(model_dir)
    if path is None:
        if template_name is not None:
            raise ExportError(f"{model_dir}: --template given, but there is no tokenizer.json or tokenizer.model")
        print(f"{model_dir} has no tokenizer.json or tokenizer.model: writing the weights alone (run will need "
              "-z TOKENIZER)")
        return None
    tok = read_model_tokenizer(path, template_name)
    drop_tail_beyond(tok, vocab_size)
    check_tokenizer(tok, vocab_size)
    return tokenizer_bytes(tok)


def is_sentencepiece_path(path):
    """True when --tokenizer names a file that is not a tokenizer.json: llama2.c's tokenizer.bin is written."""
    if os.path.isdir(path) or path.endswith(".json"):
        return False
    try:
        with open(path, "rb") as f:
            return not f.read(64).lstrip().startswith(b"{")
    except OSError:
        return True  # export_tokenizer reports it


def export_tokn(path, out_path, template_name=None):
    """Write a standalone TOKN file from a tokenizer.json (or a model directory's tokenizer)."""
    if os.path.isdir(path):
        folder, path = path, find_tokenizer(path)
        if path is None:
            raise ExportError(f"{folder}: no tokenizer.json or tokenizer.model")
    tok = read_model_tokenizer(path, template_name)
    check_tokenizer(tok)
    data = tokenizer_bytes(tok)
    write_atomically(out_path, lambda f: f.write(data))
    print(f"wrote {out_path} (TOKN): {len(tok.pieces)} tokens, {len(tok.merges)} merges, {len(data)} bytes")


# ----------------------------------------------------------------------------
# The tokenizer of a GGUF file: llama.cpp's tokenizer.* metadata keys (docs/gguf.md), read into
# the same Tokenizer a tokenizer.json or tokenizer.model gives. Where the GGUF holds the same
# information, the TOKN bytes are the same as export.py writes from the files llama.cpp's converter
# (convert_hf_to_gguf.py) read. Where it holds other or less information, what a user running the
# GGUF expects (what llama.cpp does with it) is chosen; the differences, by design:
# * [PADn] fillers (type UNUSED, up to config.json's vocab_size) are no tokens of the tokenizer
#   files: inside the vocabulary they become empty unused pieces (as json_pieces stores an id
#   without a token), at its end they are left out (the tokenizer files have fewer tokens than the
#   model's vocab_size; run accepts that).
# * eos: the converter writes one eos id (tokenizer_config.json's eos_token first), where export.py
#   takes generation_config.json's list. Generation ends where llama.cpp ends it: at eos, at
#   tokenizer.ggml.eot_token_id and eom_token_id, and at the tokens llama.cpp's vocabulary loader
#   makes end-of-generation by their text (GGUF_END_TEXTS; llama-vocab.cpp, load: "<|eot_id|>" ...),
#   so Qwen2.5's <|endoftext|> and Llama 3's <|eom_id|> are end tokens as in their
#   generation_config.json.
# * bos: the converter writes config.json's bos_token_id even when nothing adds it (Qwen: 151643,
#   add_bos_token false), where a tokenizer.json without a bos_token gives none; it is kept.
# * add_bos: tokenizer.ggml.add_bos_token when present, else llama.cpp's default: true for a
#   SentencePiece vocabulary and for the Llama 3 pre-tokenizers (llama-vocab.cpp, load), else false.
# * token types: the converter marks a non-special added token that looks special ("<|...|>") as
#   control; run's control pieces are never made from text, as llama.cpp's are not.
# * the pre-tokenizer is known only by its name: GGUF_PRE maps the names whose pattern run.c
#   implements to the code and flags export.py derives from those models' tokenizer.json.
# * tokenizer.ggml.model gemma4 (Gemma 4; llama.cpp's converter conversion/gemma.py
#   Gemma4Model.set_vocab) is what llama.cpp computes for it (llama-vocab.cpp: load, pre-tokenizer
#   gemma4, llm_tokenizer_bpe_session::tokenize), not what the tokenizer.json's own tokenizer does:
#   kind 3 (merge ranks from tokenizer.ggml.merges; the scores are all -1000 and say nothing), spaces
#   '▁' in normal pieces, no dummy prefix, flag split_newlines (BPE within runs of newlines and runs
#   of other characters; a run of newlines that is a piece is that token), byte fallback when the
#   vocabulary has <0xXX> pieces, and add_bos true whatever the file says (llama.cpp forces it).
#   Control and user-defined pieces are stored as written, '▁' and all: llama.cpp matches a
#   user-defined piece in the raw text before it writes spaces as '▁', and prints it as written.
#   End of generation also at <eos>, <turn|> and <|tool_response>, and not at </s> when
#   <|tool_response> ends it (llama.cpp's gemma4 workaround).

GGUF_TYPES = {1: TYPE_NORMAL, 2: TYPE_CONTROL, 3: TYPE_CONTROL, 4: TYPE_USER, 5: TYPE_UNUSED, 6: TYPE_BYTE}
GGUF_TYPE_NAMES = "1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte"
# tokenizer.ggml.pre (llama.cpp's names, convert_hf_to_gguf.py get_vocab_base_pre) -> (pretokenizer,
# flags) as export.py derives them from the same models' tokenizer.json
GGUF_PRE = {
    "llama-bpe": (PRE_LLAMA3, FLAG_IGNORE_MERGES),  # Llama 3, 3.1, 3.2; SmolLM3
    "llama3": (PRE_LLAMA3, FLAG_IGNORE_MERGES),
    "llama-v3": (PRE_LLAMA3, FLAG_IGNORE_MERGES),
    "qwen2": (PRE_QWEN2, FLAG_NFC),  # Qwen2, Qwen2.5, Qwen3 (their tokenizer.json's NFC normalizer)
    "gpt-4o": (PRE_O200K, 0),  # o200k: Phi-4-mini
    "smollm": (PRE_GPT2, FLAG_SPLIT_DIGITS),  # SmolLM, SmolLM2: Digits then GPT-2's pattern
    "gpt-2": (PRE_GPT2, 0),
}
GGUF_ADD_BOS_PRE = {"llama-bpe", "llama3", "llama-v3"}  # llama.cpp adds bos for these without add_bos_token
# the texts llama.cpp's vocabulary loader makes end-of-generation tokens (llama-vocab.cpp, load)
GGUF_END_TEXTS = ["<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>",
                  "<eos>", "<turn|>", "<|tool_response>"]  # the last three: gemma4
GGUF_PAD = re.compile(r"\[PAD(\d+)\]")


def gguf_meta_value(metadata, key, kinds, what, source, default=None):
    """metadata[key] if it is one of kinds (default when absent); else a one-line error naming key."""
    if key not in metadata:
        if default is None:
            raise ExportError(f"{source}: {key} is missing")
        return default
    value = metadata[key]
    if kinds is int:
        ok = isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
    elif kinds is bool:
        ok = isinstance(value, (bool, np.bool_))
    else:
        ok = isinstance(value, kinds)
    if not ok:
        raise ExportError(f"{source}: {key} is {type(value).__name__} {brief_value(value)}, not {what}")
    return int(value) if kinds is int else value


def brief_value(value):
    """A metadata value, cut short for a message."""
    text = repr(value)
    return text if len(text) <= 60 else text[:60] + "..."


def gguf_meta_array(metadata, key, n, source, strings=False, required=True):
    """A per-token array (a list of str, or a numeric numpy array) of n entries, or None if absent."""
    if key not in metadata and not required:
        return None
    value = gguf_meta_value(metadata, key, list if strings else np.ndarray,
                       "an array of strings" if strings else "a numeric array", source)
    if strings and not all(isinstance(s, str) for s in value):
        raise ExportError(f"{source}: {key} holds values that are not strings")
    if not strings and not (value.ndim == 1 and (np.issubdtype(value.dtype, np.number))):
        raise ExportError(f"{source}: {key} is a {value.dtype} array, not numbers")
    if n is not None and len(value) != n:
        raise ExportError(f"{source}: {key} has {len(value)} entries, tokenizer.ggml.tokens {n}")
    return value


def gguf_token_id(metadata, key, n, source):
    """A special token id key: None when absent, else an id in [0, n)."""
    if key not in metadata:
        return None
    i = gguf_meta_value(metadata, key, int, "a token id", source)
    if not 0 <= i < n:
        raise ExportError(f"{source}: {key} {i} is not a token id in [0, {n})")
    return i


def gguf_token_pieces(tok, tokens, types, scores, byte_level, marks_in_normal_only=False):
    """tok.pieces and tok.names from the token texts, types and scores.

    SentencePiece texts spell a space '▁' (with marks_in_normal_only, gemma4's: only the normal
    pieces; the others are kept as written). Byte-level ones spell normal pieces in GPT-2's byte
    alphabet and the control and user-defined ones as their text (the converter writes added
    tokens as they are). A [PADn] filler is an empty unused piece, and those at the end are left
    out (see above)."""
    alphabet = gpt2_byte_alphabet()
    for i, text in enumerate(tokens):
        kind_of = GGUF_TYPES.get(int(types[i]))
        if kind_of is None:
            raise ExportError(f"{tok.source}: tokenizer.ggml.token_type of token {i} is {int(types[i])}, not one of "
                              f"{GGUF_TYPE_NAMES}")
        score = float(scores[i]) if scores is not None else 0.0
        if kind_of == TYPE_UNUSED and GGUF_PAD.fullmatch(text) and int(text[4:-1]) == i:
            tok.pieces.append((b"", TYPE_UNUSED, 0.0))
            continue
        what = f"tokenizer.ggml.tokens: token {i}"
        if not byte_level and (kind_of == TYPE_NORMAL or not marks_in_normal_only):
            data = utf8(text, what).replace(SPACE_MARK.encode("utf-8"), b" ")
        elif kind_of == TYPE_NORMAL:
            data = byte_level_bytes(text, alphabet, f"{tok.source}: {what} {text!r}")
        else:
            data = utf8(text, what)
        tok.pieces.append((data, kind_of, score))
        tok.names.setdefault(text, i)
    while tok.pieces and tok.pieces[-1] == (b"", TYPE_UNUSED, 0.0):
        tok.pieces.pop()


def gguf_merges(tok, merges):
    """tok.merges and tok.merged from tokenizer.ggml.merges ("left right" strings, in rank order)."""
    tok.merges = np.empty((len(merges), 2), np.int32)
    for rank, m in enumerate(merges):
        parts = m.split(" ")
        if len(parts) != 2:
            raise ExportError(f"{tok.source}: tokenizer.ggml.merges: merge {rank} {m!r} is not two tokens")
        for part in (*parts, parts[0] + parts[1]):
            if part not in tok.names or tok.names[part] >= len(tok.pieces):
                raise ExportError(f"{tok.source}: tokenizer.ggml.merges: merge {rank} {m!r} names or makes "
                                  f"{part!r}, which is not in tokenizer.ggml.tokens")
        tok.merges[rank] = tok.names[parts[0]], tok.names[parts[1]]
        tok.merged.add(tok.names[parts[0] + parts[1]])


def gguf_vocabulary(metadata, vocab_size, source):
    """A Tokenizer with its kind, pieces, merges, pre-tokenizer and flags from the tokenizer.ggml keys."""
    model = gguf_meta_value(metadata, "tokenizer.ggml.model", str, "a string", source)
    if model not in ("llama", "gpt2", "gemma4"):
        raise ExportError(f"{source}: tokenizer.ggml.model {model!r} is not supported (only llama: SentencePiece, "
                          "gpt2: byte-level BPE, and gemma4: SentencePiece-style BPE)")
    tokens = gguf_meta_array(metadata, "tokenizer.ggml.tokens", None, source, strings=True)
    n = len(tokens)
    if n != vocab_size:
        raise ExportError(f"{source}: tokenizer.ggml.tokens has {n} tokens, the model's embedding {vocab_size} rows")
    types = gguf_meta_array(metadata, "tokenizer.ggml.token_type", n, source)
    scores = gguf_meta_array(metadata, "tokenizer.ggml.scores", n, source, required=model == "llama")
    if model == "llama":
        tok = Tokenizer(KIND_SENTENCEPIECE, source)
        if gguf_meta_value(metadata, "tokenizer.ggml.remove_extra_whitespaces", bool, "a bool", source, False):
            raise ExportError(f"{source}: tokenizer.ggml.remove_extra_whitespaces true is not supported")
        prefix = gguf_meta_value(metadata, "tokenizer.ggml.add_space_prefix", bool, "a bool", source, True)
        gguf_token_pieces(tok, tokens, types, scores, byte_level=False)
        byte_pieces = any(kind_of == TYPE_BYTE for _, kind_of, _ in tok.pieces)
        tok.flags = (FLAG_DUMMY_PREFIX if prefix else 0) | (FLAG_BYTE_FALLBACK if byte_pieces else 0)
        tok.merged = {i for i, (_, t, _) in enumerate(tok.pieces) if t == TYPE_NORMAL}
        return tok
    if model == "gemma4":  # see above
        tok = Tokenizer(KIND_SP_JSON, source)
        gguf_token_pieces(tok, tokens, types, scores, byte_level=False, marks_in_normal_only=True)
        byte_pieces = any(kind_of == TYPE_BYTE for _, kind_of, _ in tok.pieces)
        tok.flags = FLAG_SPLIT_NEWLINES | (FLAG_BYTE_FALLBACK if byte_pieces else 0)
        gguf_merges(tok, gguf_meta_array(metadata, "tokenizer.ggml.merges", None, source, strings=True))
        return tok
    tok = Tokenizer(KIND_BYTE_LEVEL, source)
    pre = gguf_meta_value(metadata, "tokenizer.ggml.pre", str, "a string", source)  # llama.cpp: a warning, then default
    if pre not in GGUF_PRE:
        raise ExportError(f"{source}: tokenizer.ggml.pre {pre!r} is not a pre-tokenizer run.c implements (known: "
                          f"{', '.join(GGUF_PRE)})")
    tok.pretokenizer, tok.flags = GGUF_PRE[pre]
    gguf_token_pieces(tok, tokens, types, scores, byte_level=True)
    gguf_merges(tok, gguf_meta_array(metadata, "tokenizer.ggml.merges", None, source, strings=True))
    return tok


def gguf_special_tokens(tok, metadata, n, template_name, source):
    """bos, add_bos, eos_ids, eot_id and the chat template from the GGUF keys (see above)."""
    ids = {k: gguf_token_id(metadata, f"tokenizer.ggml.{k}_token_id", n, source) for k in ("bos", "eos", "eot", "eom")}
    if tok.kind == KIND_SENTENCEPIECE:  # llama.cpp's defaults for a `llama` vocabulary: <s> 1, </s> 2
        ids["bos"] = 1 if ids["bos"] is None else ids["bos"]
        ids["eos"] = 2 if ids["eos"] is None else ids["eos"]
    pre = metadata.get("tokenizer.ggml.pre")
    gemma4 = bool(tok.flags & FLAG_SPLIT_NEWLINES)
    default = tok.kind == KIND_SENTENCEPIECE or pre in GGUF_ADD_BOS_PRE
    tok.add_bos = int(gguf_meta_value(metadata, "tokenizer.ggml.add_bos_token", bool, "a bool", source, default))
    tok.add_bos = 1 if gemma4 else tok.add_bos  # llama.cpp: "override ... to 'true' for Gemma4"
    tok.bos_id = -1 if ids["bos"] is None else ids["bos"]
    if gemma4 and tok.bos_id < 0:
        raise ExportError(f"{source}: tokenizer.ggml.bos_token_id is missing (llama.cpp always adds bos for gemma4)")
    if tok.add_bos and tok.bos_id < 0:
        raise ExportError(f"{source}: tokenizer.ggml.add_bos_token is true but there is no tokenizer.ggml.bos_token_id")
    if ids["eos"] is None:
        raise ExportError(f"{source}: tokenizer.ggml.eos_token_id is missing")
    ends = [ids["eos"], ids["eot"], ids["eom"]]
    # gemma4: llama.cpp's rule as it is, whatever the token's type (it makes them control)
    ends += sorted(tok.names[t] for t in GGUF_END_TEXTS if t in tok.names and tok.names[t] < len(tok.pieces)
                   and (gemma4 or tok.pieces[tok.names[t]][1] != TYPE_NORMAL))
    if any(i is not None and tok.pieces[i][0] == b"<|tool_response>" for i in ends):  # llama.cpp's gemma4
        ends = [i for i in ends if i is None or tok.pieces[i][0] != b"</s>"]           # workaround: no </s>
    tok.eos_ids = [i for i in dict.fromkeys(ends) if i is not None][:MAX_END_TOKENS]
    template = gguf_meta_value(metadata, "tokenizer.chat_template", str, "a string", source, "")
    set_template_and_eot(tok, template, template_name, ids["eot"])
    mark_special_pieces(tok)


def gguf_tokenizer(metadata, vocab_size, template_name=None, source="model.gguf"):
    """The checked Tokenizer of a GGUF file's metadata (key -> value, as the GGUF reader gives it):
    tokenizer_bytes(tok) is its TOKN section. vocab_size: the model's embedding rows (the token count
    must equal it); template_name: the chat template to store instead of the recognised one (as
    --template); source: the file, for messages. Refusals are one ExportError line naming the key."""
    tok = gguf_vocabulary(metadata, vocab_size, source)
    gguf_special_tokens(tok, metadata, vocab_size, template_name, source)
    check_tokenizer(tok, vocab_size)
    say_later(f"tokenizer of {source}: {tok.describe()}")
    return tok


# ----------------------------------------------------------------------------
# Command line


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code EXIT_BAD_USAGE."""

    def error(self, message):
        print(f"export.py: error: {message}", file=sys.stderr)
        sys.exit(EXIT_BAD_USAGE)


def finite_float(text):
    """A finite float from the command line."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number")
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not finite")
    return value


def rope_theta_arg(text):
    """--rope-theta: finite, > 0, and finite in float32."""
    value = finite_float(text)
    if not (value > 0 and math.isfinite(f32(value))):
        raise argparse.ArgumentTypeError(f"{text!r} must be > 0 (and fit a float32)")
    return value


def rope_fraction_arg(text):
    """--rope-fraction: in [0, 1]."""
    value = finite_float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be in [0, 1]")
    return value


def parse_args(argv):
    """Parse and cross-check the command line."""
    p = ArgumentParser(prog="export.py", description=__doc__.split("\n\n")[0],
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="\n\n".join(__doc__.split("\n\n")[1:4]))
    p.add_argument("input", nargs="?", help="Hugging Face directory, llama2.c checkpoint or ROPE file")
    p.add_argument("output", nargs="?", help="the file to write")
    p.add_argument("--rope-theta", type=rope_theta_arg, metavar="F", help="store this theta (> 0)")
    p.add_argument("--rope-fraction", type=rope_fraction_arg, metavar="F", help="store this p, in [0, 1]")
    p.add_argument("--legacy", action="store_true", help="write llama2.c's legacy format instead")
    p.add_argument("--dtype", choices=["f32", "bf16", "f16", *QUANTIZERS],
                   help="store the matrices and the embedding as f32, bf16, f16, q8_0 or q4_0 (default: as the source "
                   "does; a ROPE file with a type per piece keeps each piece's)")
    p.add_argument("--tokenizer", metavar="PATH", help="a tokenizer.model (to llama2.c's tokenizer.bin), or a "
                   "tokenizer.json or model directory (to a TOKN file) to convert")
    p.add_argument("-o", dest="tokenizer_out", metavar="OUT", help="where --tokenizer writes")
    p.add_argument("--template", choices=TEMPLATE_NAMES, metavar="NAME", help="the chat template to store instead "
                   f"of the one recognised in tokenizer_config.json: {', '.join(TEMPLATE_NAMES)}")
    args = p.parse_args(argv)
    if args.tokenizer is not None:
        if args.input is not None:
            p.error("--tokenizer takes no positional arguments (give the output with -o)")
        if args.tokenizer_out is None:
            p.error("--tokenizer needs -o OUT")
        if args.legacy or args.rope_theta is not None or args.rope_fraction is not None or args.dtype is not None:
            p.error("--legacy, --rope-theta, --rope-fraction and --dtype do not apply to --tokenizer")
        if args.template is not None and is_sentencepiece_path(args.tokenizer):
            p.error("--template does not apply to a tokenizer.model: llama2.c's tokenizer.bin stores no template "
                    "(give the model directory instead to write a TOKN file)")
    else:
        if args.tokenizer_out is not None:
            p.error("-o goes with --tokenizer; a checkpoint's output is the second argument")
        if args.output is None:
            p.error("need an input checkpoint and an output file (see --help)")
        if args.legacy and args.dtype not in (None, "f32"):
            p.error(f"--legacy writes float32 (llama2.c's format has no --dtype {args.dtype})")
    return args


def main(argv=None):
    """Run the command line; return the exit code."""
    args = parse_args(argv)
    INPUTS.clear()
    LATER.clear()
    code = EXIT_BAD_INPUT
    try:
        if args.tokenizer is not None and is_sentencepiece_path(args.tokenizer):
            export_tokenizer(args.tokenizer, args.tokenizer_out)
        elif args.tokenizer is not None:
            export_tokn(args.tokenizer, args.tokenizer_out, args.template)
        else:
            export_checkpoint(args)
    except FlagError as e:
        message, code = str(e), EXIT_BAD_USAGE
    except ExportError as e:
        message = str(e)
    except OSError as e:
        message = f"{e.filename}: {e.strerror}" if e.filename else str(e)
    except Exception as e:  # a bug, or input no check foresaw: still one line, no traceback
        message = f"unexpected {type(e).__name__}: {e}"
    else:
        say_now()  # the notes and warnings of an export that succeeded
        return 0
    LATER.clear()  # a refusal is its one error line, without the notes gathered before it
    # a lone surrogate (from a JSON "\ud800") cannot be printed as UTF-8: escaped instead
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    print(f"export.py: error: {' '.join(message.split())}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
