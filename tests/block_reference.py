"""GGUF's 4-bit, 5-bit and K-quant blocks in NumPy: an independent reference for the tests.

Written from the format's definition (llama.cpp's ggml/src/ggml-common.h for the block structs and
ggml/src/ggml-quants.c's dequantize_row_* for what a block's weights are), not from export.py or
run.c. Every value is computed in float32, one operation at a time, in the order the C computes
it, so that each weight is the same bits llama.cpp's dequantization gives (checked against
llama-quantize's F32 output in tests/test_block_types.py).

    KINDS                               the kinds, in run's type-code order (5 q4_0 .. 11 q6_k)
    BLOCK[kind] = (weights, bytes)      a block's size
    dequantize(kind, data, count)       the float32 weights of whole blocks
    random_blocks(kind, n_blocks, rng)  random valid blocks (finite scales, weights of a sane size)
    scale_fields(kind)                  the byte offsets of a block's f16 scales: [(offset, name)]

The blocks (all little-endian, packed, no padding), w the weights of one block in order:

    q4_0 (32 weights, 18 bytes):  d f16 | qs[16]
         w[j] = ((qs[j] & 15) - 8) * d,  w[j + 16] = ((qs[j] >> 4) - 8) * d
    q4_1 (32, 20):  d f16 | m f16 | qs[16]
         w[j] = (qs[j] & 15) * d + m,  w[j + 16] = (qs[j] >> 4) * d + m
    q5_0 (32, 22):  d f16 | qh u32 | qs[16]; bit i of qh is weight i's fifth bit
         w[i] = (nibble_i | bit_i << 4) - 16) * d   (nibble_i: qs's low nibbles, then high ones)
    q5_1 (32, 24):  d f16 | m f16 | qh u32 | qs[16]
         w[i] = (nibble_i | bit_i << 4) * d + m
    q4_k (256, 144):  d f16 | dmin f16 | scales[12] | qs[128]
         8 sub-blocks of 32, each with a 6-bit scale sc and min m packed in scales[12] (below);
         64 weights at a time from 32 bytes of qs: the low nibbles (sub-block 2c), then the high
         nibbles (sub-block 2c + 1); w = (d * sc) * q - (dmin * m)
    q5_k (256, 176):  d f16 | dmin f16 | scales[12] | qh[32] | qs[128]
         as q4_k, q plus 16 where the fifth bit is set: for chunk c (of 4), weight l of its low
         nibbles takes bit 2c of qh[l], of its high nibbles bit 2c + 1
    q6_k (256, 210):  ql[128] | qh[64] | scales[16] int8 | d f16
         two halves of 128: for l in 0..31 (half h: ql[64h:], qh[32h:], scales[8h:]), four weights
         l, l + 32, l + 64, l + 96 = ql[l] low, ql[l + 32] low, ql[l] high, ql[l + 32] high nibble,
         each with two bits of qh[l] (bits 0-1, 2-3, 4-5, 6-7) above it, minus 32; their scales
         sc[l // 16 + 0, 2, 4, 6]; w = (d * sc) * q

The K-quants' 6-bit scales and mins (get_scale_min_k4), sub-block j of 8 from scales[12] = s:
    j < 4:  sc = s[j] & 63,                           m = s[j + 4] & 63
    j >= 4: sc = (s[j + 4] & 15) | (s[j - 4] >> 6) << 4,  m = (s[j + 4] >> 4) | (s[j] >> 6) << 4

GGML_FP16_TO_FP32 is IEEE binary16 widened exactly (subnormals included), NumPy's float16 ->
float32. In C, `int * float` converts the int to float first; each product and sum rounds to
float32 once. Where a product is exact (q4_0, q4_1, q5_0, q5_1, q4_k, q5_k: the f16 scale's 11
bits times a quant of at most 6 bits) the order cannot matter, but q6_k's (d * sc) * q can
round, so it is kept.
"""
import numpy as np

KINDS = ["q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k"]
TYPE_CODES = {kind: 5 + i for i, kind in enumerate(KINDS)}  # run's weight_type / type table codes
GGML_NAMES = {"q4_0": "Q4_0", "q4_1": "Q4_1", "q5_0": "Q5_0", "q5_1": "Q5_1", "q4_k": "Q4_K", "q5_k": "Q5_K",
              "q6_k": "Q6_K"}
BLOCK = {"q4_0": (32, 18), "q4_1": (32, 20), "q5_0": (32, 22), "q5_1": (32, 24), "q4_k": (256, 144),
         "q5_k": (256, 176), "q6_k": (256, 210)}

# Each block's fields as a NumPy structured dtype (packed, in the struct's order)
LAYOUT = {
    "q4_0": np.dtype([("d", "<f2"), ("qs", "u1", 16)]),
    "q4_1": np.dtype([("d", "<f2"), ("m", "<f2"), ("qs", "u1", 16)]),
    "q5_0": np.dtype([("d", "<f2"), ("qh", "<u4"), ("qs", "u1", 16)]),
    "q5_1": np.dtype([("d", "<f2"), ("m", "<f2"), ("qh", "<u4"), ("qs", "u1", 16)]),
    "q4_k": np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", 12), ("qs", "u1", 128)]),
    "q5_k": np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", 12), ("qh", "u1", 32), ("qs", "u1", 128)]),
    "q6_k": np.dtype([("ql", "u1", 128), ("qh", "u1", 64), ("scales", "i1", 16), ("d", "<f2")]),
}
for _kind, _layout in LAYOUT.items():
    assert _layout.itemsize == BLOCK[_kind][1], _kind


def scale_fields(kind):
    """[(byte offset in the block, field name)] of the block's f16 scales (d, and m or dmin)."""
    layout = LAYOUT[kind]
    return [(layout.fields[name][1], name) for name in ("d", "m", "dmin") if name in layout.fields]


def blocks_of(kind, data, count):
    """The structured blocks holding `count` weights (whole blocks) at the start of data."""
    weights, nbytes = BLOCK[kind]
    assert count % weights == 0, f"{count} {kind} weights are not whole {weights}-weight blocks"
    raw = np.frombuffer(bytes(data) if not isinstance(data, np.ndarray) else np.ascontiguousarray(data).tobytes(),
                        np.uint8)
    n = count // weights
    assert raw.size >= n * nbytes, f"{raw.size} bytes for {n} {kind} blocks of {nbytes}"
    return raw[:n * nbytes].view(LAYOUT[kind])


def f16(field):
    """An f16 field widened to float32, one column per block."""
    return field.astype(np.float32)[:, None]


def nibbles(qs):
    """[n, 32] of a 32-weight block's 4-bit quants: the low nibbles of qs[0..15], then the high ones."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def fifth_bits(qh):
    """[n, 32]: bit i of the little-endian u32 qh, as 0 or 16, for weight i."""
    return (((qh[:, None] >> np.arange(32, dtype=np.uint32)) & 1) << 4).astype(np.uint8)


def scale_min_k4(scales):
    """[n, 8] each of the K-quants' 6-bit scales and mins of the 8 sub-blocks (get_scale_min_k4)."""
    s = scales.astype(np.uint8)
    sc = np.empty((s.shape[0], 8), np.uint8)
    m = np.empty((s.shape[0], 8), np.uint8)
    for j in range(4):
        sc[:, j] = s[:, j] & 63
        m[:, j] = s[:, j + 4] & 63
    for j in range(4, 8):
        sc[:, j] = (s[:, j + 4] & 0x0F) | ((s[:, j - 4] >> 6) << 4)
        m[:, j] = (s[:, j + 4] >> 4) | ((s[:, j] >> 6) << 4)
    return sc, m


def k_quants(kind, b):
    """[n, 256] of a q4_k or q5_k block's unsigned quants, in weight order."""
    qs = b["qs"].reshape(-1, 4, 32)  # chunk c of 64 weights reads qs[32c : 32c + 32]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=2)  # per chunk: 32 low nibbles, then 32 high ones
    if kind == "q5_k":
        qh = b["qh"]  # [n, 32]; chunk c: low nibble l takes bit 2c of qh[l], high nibble l bit 2c + 1
        for c in range(4):
            q[:, c, :32] += ((qh >> (2 * c)) & 1) << 4
            q[:, c, 32:] += ((qh >> (2 * c + 1)) & 1) << 4
    return q.reshape(-1, 256)


def dequantize(kind, data, count):
    """The float32 weights of `count` weights (whole blocks) of kind stored in data (bytes or a
    uint8 array), bit for bit as llama.cpp's dequantize_row_<kind> computes them."""
    b = blocks_of(kind, data, count)
    n = b.shape[0]
    if n == 0:
        return np.zeros(0, np.float32)
    if kind in ("q4_0", "q4_1", "q5_0", "q5_1"):
        q = nibbles(b["qs"])
        if kind in ("q5_0", "q5_1"):
            q = q | fifth_bits(b["qh"])
        d = f16(b["d"])
        if kind == "q4_0":
            y = (q.astype(np.int32) - 8).astype(np.float32) * d  # x0*d
        elif kind == "q5_0":
            y = (q.astype(np.int32) - 16).astype(np.float32) * d
        else:  # q4_1, q5_1: x0*d + m
            y = q.astype(np.float32) * d + f16(b["m"])
        return y.reshape(-1)
    if kind in ("q4_k", "q5_k"):
        d, dmin = f16(b["d"]), f16(b["dmin"])
        sc, m = scale_min_k4(b["scales"])
        d_sub = d * sc.astype(np.float32)  # d1 = d * sc, one per sub-block of 32
        m_sub = dmin * m.astype(np.float32)  # m1 = min * m
        q = k_quants(kind, b).astype(np.float32).reshape(n, 8, 32)
        y = d_sub[:, :, None] * q - m_sub[:, :, None]  # d1 * q - m1
        return y.reshape(-1)
    assert kind == "q6_k", kind
    ql, qh, sc = b["ql"].reshape(n, 2, 64), b["qh"].reshape(n, 2, 32), b["scales"].reshape(n, 2, 8)
    q = np.empty((n, 2, 4, 32), np.int32)  # per half: weights l, l + 32, l + 64, l + 96
    q[:, :, 0] = (ql[:, :, :32] & 0x0F) | (((qh >> 0) & 3) << 4)
    q[:, :, 1] = (ql[:, :, 32:] & 0x0F) | (((qh >> 2) & 3) << 4)
    q[:, :, 2] = (ql[:, :, :32] >> 4) | (((qh >> 4) & 3) << 4)
    q[:, :, 3] = (ql[:, :, 32:] >> 4) | (((qh >> 6) & 3) << 4)
    q -= 32
    # weight l of quarter k (l in 0..31) takes scale sc[l // 16 + 2k]: per quarter, two 16-weight scales
    scale = sc.reshape(n, 2, 4, 2).astype(np.float32)  # [.., k, l // 16] = sc[2k + l // 16]
    d_sc = f16(b["d"]).reshape(n, 1, 1, 1) * scale  # d * sc[is]
    y = d_sc[..., None] * q.astype(np.float32).reshape(n, 2, 4, 2, 16)  # (d * sc) * q
    return y.reshape(-1)


# ----------------------------------------------------------------------------
# Random valid blocks

# The largest |d| (and |m|, |dmin|) drawn per kind, so that the weights stay of order 0.1:
# a 4-bit q (|q - 8| <= 8) times 0.02, a K-quant's d * sc * q with sc <= 63 and q <= 31, q6_k's
# int8 scale (|sc| <= 128) times |q - 32| <= 32.
SCALE_LIMITS = {"q4_0": dict(d=0.02), "q4_1": dict(d=0.01, m=0.05), "q5_0": dict(d=0.008),
                "q5_1": dict(d=0.005, m=0.05), "q4_k": dict(d=1.5e-4, dmin=1.5e-3),
                "q5_k": dict(d=8e-5, dmin=1.5e-3), "q6_k": dict(d=1.2e-4)}
F16_SMALLEST_NORMAL = 2.0 ** -14


def random_scales(name, limit, n, rng, first_blocks_special=True):
    """n finite f16 scales, uniform in [-limit, limit] (half of them negative), with, when n allows,
    block 0 zero, block 1 negative zero, blocks 2 and 3 subnormal (positive and negative), and one in
    64 of the others subnormal too. (A min m mostly of one sign would give every row the same
    offset, and a model that repeats one token.)"""
    values = rng.uniform(-limit, limit, n).astype(np.float16)
    if first_blocks_special and n >= 4:
        values[0] = np.float16(0.0)
        values[1] = np.float16(-0.0)
        tiny = np.float16(F16_SMALLEST_NORMAL) * np.float16(rng.uniform(0.05, 0.95))  # a subnormal f16
        values[2], values[3] = tiny, -tiny
    # a few more subnormals scattered about (one in 64 blocks)
    extra = rng.random(n) < 1 / 64
    values[extra] = (np.float16(F16_SMALLEST_NORMAL) * rng.uniform(0.01, 0.99, extra.sum())).astype(np.float16)
    assert np.isfinite(values).all()
    return values


def random_blocks(kind, n_blocks, rng):
    """n_blocks random valid blocks of kind, as a uint8 array: every quant, high bit and packed
    scale byte random; the f16 scales finite and drawn by random_scales (some zero, some negative,
    some subnormal)."""
    layout = LAYOUT[kind]
    raw = rng.integers(0, 256, n_blocks * layout.itemsize, dtype=np.uint8)
    b = raw.view(layout)
    for offset, name in scale_fields(kind):
        b[name] = random_scales(name, SCALE_LIMITS[kind][name], n_blocks, rng)
    return raw


def is_subnormal_f16(values):
    bits = np.asarray(values, np.float16).view(np.uint16) & 0x7FFF
    return (bits != 0) & (bits < 0x0400)


# ----------------------------------------------------------------------------
# The f32 dequantization of GGUF tensors: llama.cpp's ggml type ids of the kinds above

GGML_TYPE_IDS = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
KIND_OF_GGML = {v: k for k, v in GGML_NAMES.items()}


def dequantize_gguf(type_name, data, count):
    """A GGUF tensor's float32 weights by its ggml type name: F32, F16, BF16 and Q8_0 widened by
    their definitions, the kinds above by dequantize()."""
    raw = np.frombuffer(bytes(data), np.uint8)
    if type_name == "F32":
        return raw[:4 * count].view("<f4").astype(np.float32)
    if type_name == "F16":
        return raw[:2 * count].view("<f2").astype(np.float32)
    if type_name == "BF16":
        return (raw[:2 * count].view("<u2").astype(np.uint32) << 16).view(np.float32)
    if type_name == "Q8_0":
        b = raw[:count // 32 * 34].view(np.dtype([("d", "<f2"), ("qs", "i1", 32)]))
        return (b["qs"].astype(np.float32) * f16(b["d"])).reshape(-1)  # x*d
    return dequantize(KIND_OF_GGML[type_name], raw, count)


# ----------------------------------------------------------------------------
# Blocks from a hash, for the check against llama.cpp's own dequantization
# (tests/data/gguf/dequantized_sha256.json): the bytes come from SHAKE-256, so they are the same
# on every machine and NumPy version; every f16 scale is any finite f16 (zero, negative zero,
# subnormal, the largest), the other bytes as they fall.

SHAKE_BLOCKS = {"q4_0": 256, "q4_1": 256, "q5_0": 256, "q5_1": 256, "q4_k": 64, "q5_k": 64, "q6_k": 64}
SHAKE_ROW = 256  # weights a row, for the GGUF llama-quantize reads
SPECIAL_F16 = [0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x83FF, 0x0400, 0x8400, 0x7BFF, 0xFBFF, 0x3C00, 0xBC00]


def shake_blocks(kind):
    """SHAKE_BLOCKS[kind] blocks of kind from SHAKE-256("block_reference " + kind): the f16 scales'
    bits as drawn, but a non-finite one (exponent all ones) has its exponent's top bit cleared; the
    first blocks' scales are SPECIAL_F16 in turn (for m and dmin: shifted by one, so that the two
    differ)."""
    import hashlib
    n = SHAKE_BLOCKS[kind]
    raw = np.frombuffer(hashlib.shake_256(f"block_reference {kind}".encode()).digest(n * BLOCK[kind][1]),
                        np.uint8).copy()
    b = raw.view(LAYOUT[kind])
    for i, (_, name) in enumerate(scale_fields(kind)):
        bits = b[name].view(np.uint16)
        bits[(bits & 0x7C00) == 0x7C00] &= np.uint16(0xBFFF)
        for j, special in enumerate(SPECIAL_F16):
            bits[j] = SPECIAL_F16[(j + i) % len(SPECIAL_F16)]
        assert np.isfinite(b[name]).all()
    return raw


def write_shake_gguf(path):
    """A GGUF for llama-quantize: llama256-Q4_0.gguf's metadata (an architecture for it to load; no
    tensor it would check against), and one tensor "shake.<kind>.weight" of rows of SHAKE_ROW weights
    per kind, its blocks shake_blocks(kind)."""
    import sys
    from pathlib import Path
    here = Path(__file__).resolve().parent
    sys.path.insert(0, str(here))
    import conftest
    import gguf_writer as W
    g = conftest.load_export().read_gguf_file(str(here / "data" / "gguf" / "llama256-Q4_0.gguf"))
    metadata = W.metadata_entries(g)
    W.BLOCKS.update({GGML_TYPE_IDS[GGML_NAMES[k]]: BLOCK[k] for k in KINDS})
    tensors = []
    for kind in KINDS:
        count = SHAKE_BLOCKS[kind] * BLOCK[kind][0]
        tensors.append((f"shake.{kind}.weight", GGML_TYPE_IDS[GGML_NAMES[kind]], [SHAKE_ROW, count // SHAKE_ROW],
                        shake_blocks(kind).tobytes()))
    W.write_gguf(path, metadata, tensors)
    return path


if __name__ == "__main__":
    import sys
    if len(sys.argv) != 3 or sys.argv[1] != "--shake-gguf":
        sys.exit("usage: block_reference.py --shake-gguf OUT.gguf")
    write_shake_gguf(sys.argv[2])
