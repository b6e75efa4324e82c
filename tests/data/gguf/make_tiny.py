"""Writes tiny.gguf with llama.cpp's own GGUF writer (gguf-py's GGUFWriter), for
tests/test_gguf_container.py: a few keys of every value type, and three tiny tensors (F32,
F16, Q8_0). Not run by the tests (they read the file it made); see README.md for how it ran."""
import sys

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter

out = sys.argv[1] if len(sys.argv) > 1 else "tiny.gguf"
w = GGUFWriter(out, "llama")  # writes general.architecture = "llama" first
w.add_custom_alignment(64)  # general.alignment (UINT32), and the data padded to 64
w.add_uint8("test.uint8", 200)
w.add_int8("test.int8", -100)
w.add_uint16("test.uint16", 60000)
w.add_int16("test.int16", -30000)
w.add_uint32("test.uint32", 4000000000)
w.add_int32("test.int32", -2000000000)
w.add_float32("test.float32", 0.15625)
w.add_bool("test.bool", True)
w.add_string("test.string", "héllo, GGUF")
w.add_uint64("test.uint64", 2**64 - 1)
w.add_int64("test.int64", -2**63)
w.add_float64("test.float64", -2.5e-300)
w.add_array("test.array.string", ["a", "", "▁the", "<0x0A>"])
w.add_array("test.array.int32", [1, -2, 3])
w.add_array("test.array.float32", [0.5, -1.25])
w.add_array("test.array.bool", [True, False, True])
w.add_array("test.array.uint8", b"\x00\x7f\xff")

f32 = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5  # numpy shape (2, 3): ne [3, 2]
f16 = np.array([1.0, -0.5, 65504.0, 2.0**-24], dtype=np.float16)
q8_0 = np.zeros((2, 34), dtype=np.uint8)  # two rows of one block each: d (f16) then 32 int8
for row in range(2):
    q8_0[row, :2] = np.frombuffer(np.float16(0.25 * (row + 1)).tobytes(), np.uint8)
    q8_0[row, 2:] = (np.arange(32, dtype=np.int8) - 16 * row).view(np.uint8)
w.add_tensor("t.f32", f32)
w.add_tensor("t.f16", f16)
w.add_tensor("t.q8_0", q8_0, raw_dtype=GGMLQuantizationType.Q8_0)

w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
