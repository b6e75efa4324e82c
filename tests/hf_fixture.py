"""Write small random Hugging Face Llama checkpoints for tests.

The checkpoint is what `LlamaForCausalLM.save_pretrained` would produce:

    out_dir/config.json
    out_dir/model.safetensors                    (sharded=False)
    out_dir/model-0000{1,2}-of-00002.safetensors (sharded=True)
    out_dir/model.safetensors.index.json         (sharded=True)

Everything is written with NumPy only (no torch, no safetensors package), so
the format code below doubles as a description of the file format:

    safetensors = u64 little-endian N
                  N bytes of UTF-8 JSON header, padded with spaces to 8 bytes
                  raw little-endian tensor data (offsets relative to here)

`make_hf_checkpoint` returns the tensors as float64 arrays that hold exactly
the values stored in the file (after rounding to BF16 / F16), so that a
float64 reference computed from them is the "true" answer for the file.
"""

import json
import os
import struct

import numpy as np

# ---------------------------------------------------------------------------
# Number formats
# ---------------------------------------------------------------------------

TORCH_DTYPE = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}


def float32_to_bf16_bits(x):
    """Round float32 values to bfloat16 with round-to-nearest-even.

    bfloat16 keeps the upper 16 bits of the float32 bit pattern.  To round
    to nearest with ties to even, add 0x7FFF plus the lowest kept bit
    (bit 16) before truncating:

        bits16 = (u + 0x7FFF + ((u >> 16) & 1)) >> 16

    NaNs are mapped to a quiet NaN instead (the addition could turn a NaN
    into an infinity).  Returns a uint16 array.
    """
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    return np.where(nan, np.uint16(0x7FC0), rounded).astype(np.uint16)


def bf16_bits_to_float32(bits):
    """Widen bfloat16 bit patterns (uint16) to float32: shift into the top half."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def round_to_dtype(x, dtype):
    """Return float64 values equal to `x` rounded to the storage dtype."""
    x32 = np.asarray(x, dtype=np.float32)
    if dtype == "F32":
        return x32.astype(np.float64)
    if dtype == "BF16":
        return bf16_bits_to_float32(float32_to_bf16_bits(x32)).astype(np.float64)
    if dtype == "F16":
        return np.asarray(x, dtype=np.float64).astype(np.float16).astype(np.float64)
    raise ValueError(f"unsupported dtype {dtype!r}")


def to_bytes(x, dtype):
    """Little-endian raw bytes of `x` stored as `dtype` ("F32", "BF16", "F16")."""
    if dtype == "F32":
        return np.asarray(x, dtype="<f4").tobytes()
    if dtype == "BF16":
        return float32_to_bf16_bits(x).astype("<u2").tobytes()
    if dtype == "F16":
        return np.asarray(x, dtype=np.float64).astype("<f2").tobytes()
    raise ValueError(f"unsupported dtype {dtype!r}")


def from_bytes(buf, dtype, shape):
    """Inverse of `to_bytes`; returns float64."""
    if dtype == "F32":
        a = np.frombuffer(buf, dtype="<f4")
    elif dtype == "BF16":
        a = bf16_bits_to_float32(np.frombuffer(buf, dtype="<u2"))
    elif dtype == "F16":
        a = np.frombuffer(buf, dtype="<f2")
    else:
        raise ValueError(f"unsupported dtype {dtype!r}")
    return a.astype(np.float64).reshape(shape)


# ---------------------------------------------------------------------------
# safetensors reader / writer
# ---------------------------------------------------------------------------

def write_safetensors(path, tensors, dtype):
    """Write {name: array} to `path` in safetensors format, all as `dtype`."""
    header, chunks, offset = {}, [], 0
    for name, arr in tensors.items():
        data = to_bytes(arr, dtype)
        header[name] = {"dtype": dtype, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    header["__metadata__"] = {"format": "pt"}
    hbytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hbytes += b" " * (-len(hbytes) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hbytes)))
        f.write(hbytes)
        for c in chunks:
            f.write(c)
    return offset  # number of data bytes


def read_safetensors(path):
    """Read a safetensors file written in F32/BF16/F16 -> {name: float64 array}."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = raw[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        out[name] = from_bytes(data[b:e], info["dtype"], info["shape"])
    return out


def load_hf_checkpoint(model_dir):
    """Read config.json and all safetensors files -> (config, tensors)."""
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    tensors = {}
    for fn in files:
        tensors.update(read_safetensors(os.path.join(model_dir, fn)))
    return config, tensors


# ---------------------------------------------------------------------------
# config.json
# ---------------------------------------------------------------------------

class _Marker:
    """A rope-dict value that stands for something other than a value (OMIT, NULL)."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"hf_fixture.{self.name}"


# In `rope`, a key whose value is OMIT is left out of config.json, even one that
# would otherwise be filled in (a default factor, original_max_position_embeddings);
# a key whose value is NULL is written as JSON null. (A value of None drops the key,
# but the defaults below may fill it in again.)
OMIT = _Marker("OMIT")
NULL = _Marker("NULL")

# Keys transformers requires for some rope types; filled in when absent so
# that the written config is one transformers would actually accept.
_ROPE_TYPE_DEFAULTS = {
    "linear": {"factor": 2.0},
    "dynamic": {"factor": 2.0},
    "yarn": {"factor": 4.0},  # original_max_position_embeddings set below
    "llama3": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
}


def _rope_fields(rope, layout, seq_len):
    """Return the config.json entries that describe the rotary embedding.

    `rope` keys: "type" (default "default"), "theta" (default 10000.0),
    "partial_rotary_factor" (optional), "factor" (optional), any extra keys
    (passed through, e.g. "original_max_position_embeddings"), and
    "type_key" ("rope_type" (default) or "type", the pre-4.45 spelling,
    v4 only). A value OMIT leaves its key out; NULL writes null.

    layout "v4" (transformers 4.x):
        rope_theta and partial_rotary_factor at top level; "rope_scaling" is
        null for type "default", else {"rope_type": ..., "factor": ..., ...}.
    layout "v5" (transformers 5.x):
        "rope_parameters": {"rope_type", "rope_theta",
                            "partial_rotary_factor"?, "factor"?, ...}.
    """
    rope = dict(rope or {})
    rtype = rope.pop("type", "default")
    theta = float(rope.pop("theta", 10000.0))
    prf = rope.pop("partial_rotary_factor", None)
    type_key = rope.pop("type_key", "rope_type")
    extra = {k: v for k, v in rope.items() if v is not None}  # factor and others
    for k, v in _ROPE_TYPE_DEFAULTS.get(rtype, {}).items():
        extra.setdefault(k, v)
    if rtype in ("yarn", "llama3", "longrope"):
        extra.setdefault("original_max_position_embeddings", seq_len)
    extra = {k: None if v is NULL else v for k, v in extra.items() if v is not OMIT}

    if layout == "v4":
        fields = {"rope_theta": theta}
        if prf is not None:
            fields["partial_rotary_factor"] = prf
        if rtype == "default" and not extra:
            fields["rope_scaling"] = None
        else:
            fields["rope_scaling"] = {type_key: rtype, **extra}
        return fields
    if layout == "v5":
        params = {"rope_type": rtype, "rope_theta": theta}
        if prf is not None:
            params["partial_rotary_factor"] = prf
        params.update(extra)
        return {"rope_parameters": params}
    raise ValueError(f"unknown layout {layout!r}")


def make_config(*, dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size,
                seq_len, dtype, tied, rms_norm_eps, rope, layout):
    """The config.json dict of a LlamaForCausalLM with these sizes."""
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": dim,
        "intermediate_size": hidden_dim,
        "num_hidden_layers": n_layers,
        "num_attention_heads": n_heads,
        "num_key_value_heads": n_kv_heads,
        "head_dim": dim // n_heads,
        "vocab_size": vocab_size,
        "max_position_embeddings": seq_len,
        "rms_norm_eps": rms_norm_eps,
        "tie_word_embeddings": tied,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": TORCH_DTYPE[dtype],
        "transformers_version": "4.46.0" if layout == "v4" else "5.0.0",
    }
    if layout == "v5":
        config["dtype"] = TORCH_DTYPE[dtype]  # v5 spelling of torch_dtype
    config.update(_rope_fields(rope, layout, seq_len))
    return config


# ---------------------------------------------------------------------------
# Random weights
# ---------------------------------------------------------------------------

def make_weights(rng, *, dim, hidden_dim, n_layers, n_heads, n_kv_heads,
                 vocab_size, tied):
    """Random float64 weights {HF name: array (out, in)}.

    Matrices are N(0, (c / sqrt(fan_in))^2), with c chosen so that
      - q.k / sqrt(hd) has std ~2 (attention is neither uniform nor one-hot,
        so the rotary embedding visibly matters),
      - each residual branch adds a contribution comparable to the embedding,
      - logits = rmsnorm(x) @ embed.T have std ~2 (nll is meaningful).
    Norm weights are 1 + 0.1 * N(0, 1).
    """
    hd = dim // n_heads

    def mat(out_f, in_f, c):
        return rng.normal(0.0, c / np.sqrt(in_f), size=(out_f, in_f))

    def norm(n):
        return 1.0 + 0.1 * rng.normal(size=n)

    w = {"model.embed_tokens.weight": mat(vocab_size, dim, 2.0)}
    for i in range(n_layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(dim)
        w[p + "self_attn.q_proj.weight"] = mat(n_heads * hd, dim, 1.4)
        w[p + "self_attn.k_proj.weight"] = mat(n_kv_heads * hd, dim, 1.4)
        w[p + "self_attn.v_proj.weight"] = mat(n_kv_heads * hd, dim, 1.0)
        w[p + "self_attn.o_proj.weight"] = mat(dim, n_heads * hd, 0.5)
        w[p + "post_attention_layernorm.weight"] = norm(dim)
        w[p + "mlp.gate_proj.weight"] = mat(hidden_dim, dim, 1.0)
        w[p + "mlp.up_proj.weight"] = mat(hidden_dim, dim, 1.0)
        w[p + "mlp.down_proj.weight"] = mat(dim, hidden_dim, 0.5)
    w["model.norm.weight"] = norm(dim)
    if not tied:
        w["lm_head.weight"] = mat(vocab_size, dim, 2.0)
    return w


# ---------------------------------------------------------------------------
# Checkpoint
# ---------------------------------------------------------------------------

def make_hf_checkpoint(out_dir, *, dim=64, hidden_dim=96, n_layers=2, n_heads=4,
                       n_kv_heads=2, vocab_size=512, seq_len=128, dtype="F32",
                       tied=True, sharded=False, rms_norm_eps=1e-5, rope=None,
                       seed=0, layout="v4"):
    """Write a random HF Llama checkpoint to `out_dir`.

    Returns (config_dict, tensors): tensors maps HF names to float64 arrays
    equal to the stored (rounded) values.  `rope` defaults to
    {"type": "default", "theta": 10000.0}; see `_rope_fields`.
    """
    if dtype not in TORCH_DTYPE:
        raise ValueError(f"dtype must be one of {sorted(TORCH_DTYPE)}")
    if dim % n_heads or n_heads % n_kv_heads or (dim // n_heads) % 2:
        raise ValueError("need dim % n_heads == 0, n_heads % n_kv_heads == 0, even head_dim")
    if rope is None:
        rope = {"type": "default", "theta": 10000.0}
    os.makedirs(out_dir, exist_ok=True)

    config = make_config(dim=dim, hidden_dim=hidden_dim, n_layers=n_layers,
                         n_heads=n_heads, n_kv_heads=n_kv_heads,
                         vocab_size=vocab_size, seq_len=seq_len, dtype=dtype,
                         tied=tied, rms_norm_eps=rms_norm_eps, rope=rope,
                         layout=layout)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)

    rng = np.random.default_rng(seed)
    raw = make_weights(rng, dim=dim, hidden_dim=hidden_dim, n_layers=n_layers,
                       n_heads=n_heads, n_kv_heads=n_kv_heads,
                       vocab_size=vocab_size, tied=tied)
    tensors = {name: round_to_dtype(a, dtype) for name, a in raw.items()}

    if not sharded:
        write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors, dtype)
    else:
        _write_sharded(out_dir, tensors, dtype)
    return config, tensors


def _write_sharded(out_dir, tensors, dtype):
    """Split the tensors into two files (in order) plus the index json."""
    names = list(tensors)
    half = len(names) // 2
    files = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    parts = [names[:half], names[half:]]
    weight_map, total = {}, 0
    for fn, part in zip(files, parts):
        total += write_safetensors(os.path.join(out_dir, fn),
                                   {n: tensors[n] for n in part}, dtype)
        weight_map.update({n: fn for n in part})
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)
