"""Writes checkpoints in the project's ROPE format (docs/format.md) from numpy arrays.

Used by the tests and the benchmark to make random models of any shape. Written
from the README's byte layout, not from run.c or export.py.
"""
import struct

import numpy as np

MAGIC = 0x45504F52
HEADER_BYTES = 256


def header_bytes(dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len,
                 shared_classifier=True, norm_eps=1e-5, rope_theta=10000.0, rope_fraction=1.0,
                 rope_scale=1.0, rope_factor=None, rope_scaling=0, rope_original_len=0,
                 yarn_beta_fast=0.0, yarn_beta_slow=0.0, rope_attention_factor=0.0,
                 llama3_low_freq_factor=0.0, llama3_high_freq_factor=0.0, version=1, weight_type=0):
    """The 256-byte header: magic, version, seven sizes, the flag, four floats, the RoPE
    scaling fields (bytes 56..83: rule, original length, five floats; all 0 = none), then in
    version 2 head_size 0 and weight_type (bytes 84, 88), zeros.

    rope_factor is the newer name of rope_scale (byte 52); give either.
    """
    if rope_factor is not None:
        rope_scale = rope_factor
    head = struct.pack("<Ii7ii4f", MAGIC, version, dim, hidden_dim, n_layers, n_heads, n_kv_heads,
                       vocab_size, seq_len, int(shared_classifier), norm_eps, rope_theta,
                       rope_fraction, rope_scale)
    head += struct.pack("<2i5f", rope_scaling, rope_original_len, yarn_beta_fast, yarn_beta_slow,
                        rope_attention_factor, llama3_low_freq_factor, llama3_high_freq_factor)
    assert len(head) == 84
    if version == 2:
        head += struct.pack("<2i", 0, weight_type)
    return head + b"\0" * (HEADER_BYTES - len(head))


def random_weights(dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size,
                   shared_classifier=True, seed=0):
    """Random weights in file order, scaled so that activations stay O(1)."""
    rng = np.random.default_rng(seed)
    hd = dim // n_heads
    kv = n_kv_heads * hd

    def mat(rows, cols, gain=1.0):
        return (rng.standard_normal((rows, cols)) * gain / np.sqrt(cols)).astype(np.float32)

    def norms(n):
        return (1 + 0.1 * rng.standard_normal((n, dim))).astype(np.float32)

    L = n_layers
    tensors = [
        ("token_embedding", mat(vocab_size, dim, np.sqrt(dim))),
        ("rms_att", norms(L)),
        ("wq", np.stack([mat(dim, dim, 1.4) for _ in range(L)])),
        ("wk", np.stack([mat(kv, dim, 1.4) for _ in range(L)])),
        ("wv", np.stack([mat(kv, dim) for _ in range(L)])),
        ("wo", np.stack([mat(dim, dim, 0.5) for _ in range(L)])),
        ("rms_ffn", norms(L)),
        ("w1", np.stack([mat(hidden_dim, dim) for _ in range(L)])),
        ("w2", np.stack([mat(dim, hidden_dim, 0.5) for _ in range(L)])),
        ("w3", np.stack([mat(hidden_dim, dim) for _ in range(L)])),
        ("rms_final", norms(1)[0]),
    ]
    if not shared_classifier:
        tensors.append(("wcls", mat(vocab_size, dim, 2.0)))
    return tensors


def write_random_checkpoint(path, dim=64, hidden_dim=96, n_layers=2, n_heads=4, n_kv_heads=2,
                            vocab_size=512, seq_len=128, shared_classifier=True, seed=0, **rope):
    """A random model in the ROPE format; rope takes header_bytes' keyword arguments (norm_eps,
    rope_theta, rope_fraction, rope_scale / rope_factor and the scaling fields)."""
    with open(path, "wb") as f:
        f.write(header_bytes(dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len,
                             shared_classifier, **rope))
        for _, t in random_weights(dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size,
                                   shared_classifier, seed):
            f.write(np.ascontiguousarray(t, dtype="<f4").tobytes())
    return path


# Version 2: the matrices and the embedding in a 16-bit type, every tensor at a multiple
# of 64 bytes from the start of the file (docs/format.md).
WEIGHT_TYPES = {"f32": 0, "bf16": 1, "f16": 2}
MATRICES = {"token_embedding", "wq", "wk", "wv", "wo", "w1", "w2", "w3", "wcls"}
ALIGNMENT = 64


def to_bf16_bits(x):
    """float32 values rounded to nearest even in bfloat16 (the top 16 bits of a float32):
    add 0x7FFF plus the lowest kept bit, then keep the top half. Finite inputs only."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_bits_to_f32(bits):
    """bfloat16 bits widened to float32: shifted into the top half."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def as_16bit(tensors, weight_type):
    """(stored, widened): the matrices rounded to weight_type ("bf16" uint16 bits or "f16"
    float16), and the same tensors as float32 holding the widened values (norms unchanged)."""
    stored, widened = [], []
    for name, t in tensors:
        if name in MATRICES and weight_type == "bf16":
            bits = to_bf16_bits(t)
            stored.append((name, bits))
            widened.append((name, bf16_bits_to_f32(bits)))
        elif name in MATRICES and weight_type == "f16":
            half = t.astype(np.float16)
            stored.append((name, half))
            widened.append((name, half.astype(np.float32)))
        else:
            stored.append((name, t))
            widened.append((name, t))
    return stored, widened


def write_checkpoint(path, tensors, dims, weight_type="f32", version=None, aligned=True, **header):
    """Writes tensors (file order; matrices as float32, float16 or uint16 bf16 bits) with a header
    for dims (header_bytes' sizes). Version 1 for float32 unless told; version 2 aligns every
    tensor to 64 bytes (aligned=False leaves it out: a malformed file)."""
    version = version or (1 if weight_type == "f32" else 2)
    storage = {"f32": "<f4", "bf16": "<u2", "f16": "<f2"}
    with open(path, "wb") as f:
        f.write(header_bytes(**dims, version=version, weight_type=WEIGHT_TYPES[weight_type], **header))
        for name, t in tensors:
            if version == 2 and aligned:
                f.write(b"\0" * (-f.tell() % ALIGNMENT))
            kind = weight_type if name in MATRICES else "f32"
            f.write(np.ascontiguousarray(t, dtype=storage[kind]).tobytes())
    return path
