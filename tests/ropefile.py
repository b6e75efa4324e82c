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
WEIGHT_TYPES = {"f32": 0, "bf16": 1, "f16": 2, "q8_0": 3}
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


def quantize_row_q8_0_ref(x):
    """A transcription of llama.cpp's quantize_row_q8_0_ref (ggml/src/ggml-quants.c), every
    block of 32 float32 weights at once, each step as the C does it (the C's names on the right):
        amax = max |x_j|;  d = amax / ((1 << 7) - 1);  id = d ? 1.0f/d : 0.0f;
        y.d = GGML_FP32_TO_FP16(d);  y.qs[j] = roundf(x_j * id);
    every operation in float32; FP32_TO_FP16 rounds to nearest even (F16C's, and the
    generic fallback's); roundf rounds half away from zero. Returns the blocks' bytes
    (little-endian f16 d, then the 32 int8), as a uint8 array."""
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, 32)  # one row per block, i
    amax = np.abs(x).max(axis=1)                                      # float amax (exact)
    d = (amax / np.float32(127)).astype(np.float32)                   # const float d
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)  # const float id
    x0 = (x * inv[:, None]).astype(np.float32).astype(np.float64)     # const float x0, exactly
    q = np.copysign(np.floor(np.abs(x0) + 0.5), x0)                   # roundf: |x0| + 0.5 exact in double
    out = np.zeros((len(x), 34), np.uint8)
    out[:, :2] = d.astype("<f2").view(np.uint8).reshape(-1, 2)        # y[i].d = GGML_FP32_TO_FP16(d)
    out[:, 2:] = q.astype(np.int8).view(np.uint8)                     # y[i].qs[j]
    return out.reshape(-1)


def q8_0_to_f32(blocks):
    """Q8_0 bytes as their weights: d (f16, widened) times q (int8), for each block."""
    b = np.asarray(blocks, np.uint8).reshape(-1, 34)
    d = b[:, :2].copy().view("<f2").astype(np.float32)
    return (d * b[:, 2:].view(np.int8).astype(np.float32)).reshape(-1)


def as_q8_0(tensors, quantize=None):
    """(stored, dequantized): the matrices as Q8_0 bytes (quantize_row_q8_0_ref, or `quantize`),
    and the same tensors as float32 holding d * q (norms unchanged)."""
    quantize = quantize or quantize_row_q8_0_ref
    stored, dequantized = [], []
    for name, t in tensors:
        if name in MATRICES:
            blocks = quantize(t)
            stored.append((name, blocks))
            dequantized.append((name, q8_0_to_f32(blocks).reshape(np.shape(t))))
        else:
            stored.append((name, t))
            dequantized.append((name, t))
    return stored, dequantized


def write_checkpoint(path, tensors, dims, weight_type="f32", version=None, aligned=True, **header):
    """Writes tensors (file order; matrices as float32, float16 or uint16 bf16 bits) with a header
    for dims (header_bytes' sizes). Version 1 for float32 unless told; version 2 aligns every
    tensor to 64 bytes (aligned=False leaves it out: a malformed file)."""
    version = version or (1 if weight_type == "f32" else 2)
    storage = {"f32": "<f4", "bf16": "<u2", "f16": "<f2", "q8_0": "u1"}  # q8_0: the blocks' bytes
    with open(path, "wb") as f:
        f.write(header_bytes(**dims, version=version, weight_type=WEIGHT_TYPES[weight_type], **header))
        for name, t in tensors:
            if version == 2 and aligned:
                f.write(b"\0" * (-f.tell() % ALIGNMENT))
            kind = weight_type if name in MATRICES else "f32"
            f.write(np.ascontiguousarray(t, dtype=storage[kind]).tobytes())
    return path
