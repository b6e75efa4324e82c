"""A small GGUF writer for the tests, written from docs/gguf.md's description of the format
(not from llama.cpp's code), to make small good and bad GGUF files.

    write_gguf(path, metadata, tensors, version=3, alignment=32)
        metadata: [(key, value_type, value)]: value_type a GGUF value type id (UINT8 .. FLOAT64
                  below), or (ARRAY, element type) with a list (or numpy array) of values;
                  helpers u32("key", 5), string("key", "x"), array("key", STRING, [...]) build them
        tensors:  [(name, ggml_type, ne, raw bytes)]: ggml_type an id (F32, F16, Q8_0, ... below),
                  ne as GGUF stores it (fastest first); offsets are laid out at multiples of
                  alignment, each tensor padded with zeros
    gguf_bytes(...) returns the bytes instead. Every field can be overridden for bad files:
    offsets=[...] replaces the computed offsets, raw_metadata=True takes values as bytes already
    encoded, n_tensors / n_kv replace the counts, and alignment only pads (set the
    general.alignment key yourself, as a writer must).
"""
import struct

import numpy as np

# value types (docs/gguf.md)
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
SCALAR_FORMATS = {UINT8: "<B", INT8: "<b", UINT16: "<H", INT16: "<h", UINT32: "<I", INT32: "<i", FLOAT32: "<f",
                  BOOL: "<B", UINT64: "<Q", INT64: "<q", FLOAT64: "<d"}

# ggml types (docs/gguf.md): id and (elements, bytes) per block, for the few the tests write
F32, F16, Q4_0, Q8_0, Q4_K, Q6_K, BF16 = 0, 1, 2, 8, 12, 14, 30
Q4_1, Q5_0, Q5_1, Q5_K = 3, 6, 7, 13
BLOCKS = {F32: (1, 4), F16: (1, 2), Q4_0: (32, 18), Q8_0: (32, 34), Q4_K: (256, 144), Q6_K: (256, 210),
          Q4_1: (32, 20), Q5_0: (32, 22), Q5_1: (32, 24), Q5_K: (256, 176),
          BF16: (1, 2)}


def u8(key, v): return (key, UINT8, v)
def i8(key, v): return (key, INT8, v)
def u16(key, v): return (key, UINT16, v)
def i16(key, v): return (key, INT16, v)
def u32(key, v): return (key, UINT32, v)
def i32(key, v): return (key, INT32, v)
def f32(key, v): return (key, FLOAT32, v)
def boolean(key, v): return (key, BOOL, v)
def string(key, v): return (key, STRING, v)
def u64(key, v): return (key, UINT64, v)
def i64(key, v): return (key, INT64, v)
def f64(key, v): return (key, FLOAT64, v)
def array(key, element_type, values): return (key, (ARRAY, element_type), values)


def encode_string(s):
    """GGUF string: u64 length, then the bytes (UTF-8 for a str), no NUL."""
    data = s.encode("utf-8") if isinstance(s, str) else bytes(s)
    return struct.pack("<Q", len(data)) + data


def encode_value(value_type, value):
    """A value's bytes (without its type id)."""
    if isinstance(value_type, tuple):
        _, element = value_type
        values = list(value)
        return struct.pack("<IQ", element, len(values)) + b"".join(encode_value(element, v) for v in values)
    if value_type == STRING:
        return encode_string(value)
    return struct.pack(SCALAR_FORMATS[value_type], value)


def encode_type(value_type):
    """The type id field(s): u32 type, and for an array the element type follows in the value."""
    return struct.pack("<I", ARRAY if isinstance(value_type, tuple) else value_type)


def tensor_nbytes(ggml_type, ne):
    block, block_bytes = BLOCKS[ggml_type]
    count = 1
    for d in ne[1:]:
        count *= d
    return ne[0] // block * block_bytes * count


def align(n, alignment):
    return n + -n % alignment


def gguf_bytes(metadata=(), tensors=(), version=3, alignment=32, offsets=None, n_tensors=None, n_kv=None,
               raw_metadata=False):
    """A GGUF file's bytes (see the module's docstring)."""
    out = bytearray(b"GGUF")
    out += struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors,
                       len(metadata) if n_kv is None else n_kv)
    for key, value_type, value in metadata:
        out += encode_string(key) + encode_type(value_type)
        out += value if raw_metadata and isinstance(value, (bytes, bytearray)) else encode_value(value_type, value)
    laid_out, at = [], 0
    for name, ggml_type, ne, data in tensors:
        laid_out.append(at)
        at = align(at + len(data), alignment)
    offsets = laid_out if offsets is None else offsets
    for (name, ggml_type, ne, data), offset in zip(tensors, offsets):
        out += encode_string(name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne)
        out += struct.pack("<IQ", ggml_type, offset)
    out += bytes(align(len(out), alignment) - len(out))
    data_start = len(out)
    for (name, ggml_type, ne, data), offset in zip(tensors, laid_out):
        out += bytes(data_start + offset - len(out)) + bytes(data)
    if tensors:
        out += bytes(align(len(out) - data_start, alignment) - (len(out) - data_start))
    return bytes(out)


def write_gguf(path, metadata=(), tensors=(), version=3, alignment=32, **overrides):
    """Write a GGUF file (see the module's docstring); returns path."""
    with open(path, "wb") as f:
        f.write(gguf_bytes(metadata, tensors, version, alignment, **overrides))
    return path


def float_tensor(name, values, ggml_type=F32):
    """(name, type, ne, bytes) of a float array (numpy shape; ne is it reversed), as F32, F16 or BF16."""
    a = np.asarray(values, dtype=np.float32)
    if ggml_type == F32:
        data = a.astype("<f4").tobytes()
    elif ggml_type == F16:
        data = a.astype("<f2").tobytes()
    else:
        data = (a.view(np.uint32) >> 16).astype("<u2").tobytes()  # truncated: the tests pick exact values
    return (name, ggml_type, tuple(reversed(a.shape)), data)


def metadata_entries(g):
    """A GGUF file's metadata (export.py's read_gguf_file) as write_gguf's entries, with their
    stored value types: what rewriting a real file with one thing changed starts from."""
    out = []
    for key, value in g.metadata.items():
        value_type = g.value_types[key]
        if isinstance(value_type, tuple):  # a numeric array's values as Python numbers
            value = value.tolist() if isinstance(value, np.ndarray) else list(value)
        out.append((key, value_type, value))
    return out
