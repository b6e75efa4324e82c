"""export.py converting GGUF files (llama.cpp's format) made by llama.cpp's own tools.

tests/data/gguf/ holds small GGUF files that llama.cpp's converter and llama-quantize wrote from
the tests' seeded Hugging Face fixtures (tests/gguf_fixtures.py recreates each source directory;
tests/data/gguf/README.md gives the commands). Each is checked three ways:

  1. Against the Hugging Face directory it was made from: the converted file holds the bytes
     export.py writes from that directory (header and tensors; the same weight type asked for),
     and computes the same outputs. Where llama.cpp reads a model otherwise than transformers
     (keys its converter does not write, which llama.cpp's code hard-codes), the directory's
     config.json is first given llama.cpp's reading (LLAMA_CPP_READING), and the difference is
     pinned by a test of its own. A layer whose values are its keys (Gemma 4 26B-A4B's full
     layer) is laid out otherwise from a GGUF (an explicit wv, wo as stored): the two files are
     compared once laid out alike (explicit_values), and their outputs within float32's sums.
  2. Against the references: the float32 file's perplexity equals tests/family_reference.py's
     (the families' NumPy forward pass, written from the modeling code) within 1e-4.
  3. F16, BF16 and Q8_0 files against the float32 GGUF of their widened weights (written here
     with tests/gguf_writer.py, the weights widened from the formats' definitions: bf16 bits
     shifted up, f16 as IEEE half, Q8_0 d * q): every mode's output, byte for byte.
Then what is refused: metadata that contradicts the tensors, a
missing key or tensor, a non-finite block scale; each one line, exit 1, no file written.
"""
import contextlib
import json
import re
import resource
import struct

import numpy as np
import pytest

import conftest
import family_reference as R
import gguf_fixtures as GF
import gguf_writer as W
from conftest import ROOT, TOK512, run

DATA = ROOT / "tests" / "data" / "gguf"
TEXT = ("Once upon a time, there was a little girl named Lily. She loved to play outside "
        "in the park with her dog. One day she saw a big red ball.")
PROMPT = "Once upon a time, a little fox"

# the files of the types this format holds (F32, F16, BF16, Q8_0), and the weight type their
# matrices are exported with from the Hugging Face directory for the comparison (None: they
# mix types, compared by their outputs only)
CONVERTED = {
    "llama2-f32.gguf": "f32", "llama2-f16.gguf": "f16", "llama2-bf16.gguf": "bf16", "llama2-q8_0.gguf": "q8_0",
    "llama3-bf16.gguf": "bf16", "qwen2-bf16.gguf": "bf16", "qwen2-q8_0.gguf": "q8_0", "qwen3-bf16.gguf": "bf16",
    "gemma-bf16.gguf": "bf16", "gemma2-bf16.gguf": "bf16", "gemma3-bf16.gguf": "bf16", "smollm3-bf16.gguf": "bf16",
    "phi3-bf16.gguf": "bf16", "phi4mini-bf16.gguf": "bf16", "mistral-bf16.gguf": "bf16", "gemma4-bf16.gguf": "bf16",
    "mixtral-bf16.gguf": None, "mixtral-q8_0.gguf": None, "qwen3moe-bf16.gguf": None, "gemma4-moe-bf16.gguf": None,
}
# the 4-bit, 5-bit and K-quant files (llama256-Q4_0, -Q4_K_M, -Q5_K_S, llama2-Q4_1, -Q5_0, -Q5_1):
# tests/test_gguf_blocks.py, against llama.cpp's own dequantization; gemma4-31b-Q4_0:
# tests/test_gguf_k_eq_v.py
# the files with layers whose values are their keys (Gemma 4 26B-A4B's full layer, no attn_v): from
# a GGUF such a layer gets an explicit wv (attn_k as stored) and wo as stored, from the directory
# the layout values-are-the-keys with wo's columns permuted (explicit_values relates the two)
KEYS_AS_VALUES = {"gemma4-moe-bf16.gguf"}


def gemma_query_scale(config):
    """llama.cpp's Gemma 2 / 3 query scale: 1/sqrt(head_dim), hidden/heads for the 27B models."""
    config["query_pre_attn_scalar"] = config["head_dim"]


def float32_scale(config):
    """llama.cpp's Gemma embedding scale: sqrtf(hidden) in float32, not rounded to the dtype."""
    for c in (config, config.get("text_config") or {}):
        for key in ("torch_dtype", "dtype"):
            if key in c:
                c[key] = "float32"


def gemma_reading(config):
    float32_scale(config)
    gemma_query_scale(config)


# config.json as llama.cpp reads the GGUF its converter wrote from it (docs/gguf.md): the keys
# the converter does not write take llama.cpp's hard-coded values
LLAMA_CPP_READING = {
    "gemma": float32_scale,
    "gemma4": float32_scale,
    "gemma4-moe": float32_scale,
    "gemma2": gemma_reading,
    "gemma3": gemma_reading,
    "mistral": lambda config: config.pop("sliding_window"),  # arch llama: no window in the file
    # the 2025 converter computed rope_freqs with a top-level original length, default 8192
    "llama3": lambda config: config["rope_scaling"].update(original_max_position_embeddings=8192),
}


convert = conftest.export  # export.py SRC OUT [flags]: a GGUF file or a Hugging Face directory


def source_dir(name, tmp_path, llama_cpp_reading=True):
    """The Hugging Face directory a fixture file was made from, recreated (and given llama.cpp's
    reading of its config.json)."""
    source = GF.GGUF_FILES[name][0]
    d = GF.hf_dir(source, tmp_path / source)
    edit = LLAMA_CPP_READING.get(source)
    if edit and llama_cpp_reading:
        path = d / "config.json"
        config = json.loads(path.read_text())
        edit(config)
        path.write_text(json.dumps(config))
    return d


def header_and_tensors(path):
    """A ROPE file's header, less the tokenizer section's place (bytes 96..111), and its tensors
    (every byte before the tokenizer section)."""
    data = path.read_bytes()
    tok_at = struct.unpack_from("<Q", data, 96)[0] if struct.unpack_from("<i", data, 4)[0] == 2 else 0
    body = data[:tok_at] if tok_at else data
    return body[:96] + body[112:]


def outputs(model, mode, tmp_path, *extra):
    """stdout, the CSV and stderr (less the start-up and timing lines) of one mode, with tok512."""
    csv = tmp_path / f"{mode}.csv"
    args = {"generate-greedy": ["-t", 0, "-n", 24, "-v", "-p", PROMPT],
            "generate-seeded": ["-t", 1, "-s", 7, "-n", 24, "-v", "-p", PROMPT],
            "ppl": ["-m", "ppl", "-p", conftest.LONG_TEXT, "--csv", csv],
            "inspect": ["-m", "inspect", "-p", PROMPT, "--csv", csv],
            "chat": ["-m", "chat", "--template", "llama2", "-t", 0, "-n", 12, "-v", "-y", "Be brief.",
                     "-p", "Hello there"]}[mode]
    if csv.exists():
        csv.unlink()
    r = run(model, "-z", TOK512, *args, *extra, input="And then?\n" if mode == "chat" else None)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    stderr = [line for line in r.stderr.splitlines() if not line.startswith((b"run: ", b"timing:"))]
    return r.stdout, csv.read_bytes() if csv.exists() else b"", stderr


MODES = ["generate-greedy", "generate-seeded", "ppl", "inspect", "chat"]


@pytest.mark.parametrize("name", sorted(CONVERTED))
def test_gguf_converts_to_what_its_hugging_face_directory_exports(name, tmp_path):
    kind = CONVERTED[name]
    gguf_bin, hf_bin = tmp_path / "gguf.bin", tmp_path / "hf.bin"
    convert(DATA / name, gguf_bin)
    hf = source_dir(name, tmp_path)
    mixed_type = "q8_0" if "q8_0" in name else "bf16"
    convert(hf, hf_bin, "--dtype", kind or mixed_type)
    if kind is not None:
        assert header_and_tensors(gguf_bin) == header_and_tensors(hf_bin)
    if kind is None and "q8_0" in name:
        return  # its router is F32 beside Q8_0 experts: test 3 compares it with its widened weights
    if name in KEYS_AS_VALUES:  # the same weights, wo's columns in another order: float32's sums
        assert outputs(gguf_bin, "generate-greedy", tmp_path) == outputs(hf_bin, "generate-greedy", tmp_path)
        got, expect = (nll_of(model, conftest.LONG_TEXT) for model in (gguf_bin, hf_bin))
        assert abs(got - expect) <= 1e-6 * abs(expect), (got, expect)
        return
    for mode in ("generate-greedy", "ppl"):
        assert outputs(gguf_bin, mode, tmp_path) == outputs(hf_bin, mode, tmp_path), mode


def nll_of(model, text):
    r = run(model, "-z", TOK512, "-m", "ppl", "-p", text)
    assert r.returncode == 0, r.stderr
    return float(re.search(rb"^nll: (\S+)", r.stdout, re.M).group(1))


def explicit_values(path):
    """A ROPE file as export.py reads it back (read_flat_checkpoint), every tensor widened to a
    flat float32 array, with each layer whose values are its keys (values 1: the Hugging Face
    route's layout) laid out as a GGUF file's conversion lays it out (docs/gguf.md): an explicit
    wv, wk's rows with the adjacent pairs undone (Gemma 4's pairs are (i, i + hd/2) over the whole
    head), wo's columns likewise on the layers reading its cache, values 0. Returns (the header
    less the places of its three sections, the layer records, {tensor: float32 array})."""
    export = conftest.load_export()
    c, tensors, _, _ = export.read_flat_checkpoint(str(path))
    data = path.read_bytes()
    header = data[:96] + data[112:136] + data[152:216] + data[232:256]
    flat = {name: np.concatenate([p.widened().reshape(-1) for p in t]) if isinstance(t, list)
            else export.widen(np.asarray(t)).reshape(-1) for name, t in tensors.items()}
    shapes = export.layer_shapes(c)
    own = [l for l, s in enumerate(shapes) if s.source == l]

    def split(name, layers, rows):
        cuts = np.cumsum([rows(l) * c.dim for l in layers])[:-1]
        return dict(zip(layers, np.split(flat[name], cuts)))

    kv_rows = lambda l: shapes[l].n_kv_heads * shapes[l].head_size  # noqa: E731
    wk = split("wk", own, kv_rows)
    wv = split("wv", [l for l in own if not shapes[l].values], kv_rows)
    wo = split("wo", range(c.n_layers), lambda l: c.n_heads * shapes[l].head_size)
    for l, s in enumerate(shapes):
        undo = np.argsort(adjacent_pairs(s.head_size))
        if l in own and s.values:
            wv[l] = wk[l].reshape(-1, s.head_size, c.dim)[:, undo].reshape(-1)
        if shapes[s.source].values:
            wo[l] = wo[l].reshape(c.dim, -1, s.head_size)[:, :, undo].reshape(-1)
    flat["wv"] = np.concatenate([wv[l] for l in own])
    flat["wo"] = np.concatenate([wo[l] for l in range(c.n_layers)])
    records = [tuple(r[:6]) + (0,) + tuple(r[7:]) for r in c.layers]
    return header, records, flat


def adjacent_pairs(hd):
    """Row order per head: Hugging Face's pair (i, i + hd/2) -> adjacent rows (2i, 2i + 1)."""
    order = np.empty(hd, dtype=int)
    order[0::2], order[1::2] = np.arange(hd // 2), np.arange(hd // 2) + hd // 2
    return order


def assert_same_model(a, b):
    """Two ROPE files hold the same model once laid out alike (explicit_values)."""
    (ha, ra, ta), (hb, rb, tb) = explicit_values(a), explicit_values(b)
    assert ha == hb and ra == rb and sorted(ta) == sorted(tb)
    for name in ta:
        assert ta[name].shape == tb[name].shape and np.array_equal(ta[name], tb[name]), name


@pytest.mark.parametrize("name, differs", [("gemma2-bf16.gguf", "attention_scale"),
                                           ("gemma3-bf16.gguf", "attention_scale"),
                                           ("gemma4-moe-bf16.gguf", "the embedding scale sqrt(32), not bf16's"),
                                           ("mistral-bf16.gguf", "the sliding window")])
def test_llama_cpps_hard_coded_readings_are_what_a_gguf_converts_to(name, differs, tmp_path):
    """Without LLAMA_CPP_READING the directory exports otherwise: the difference is real, and
    the GGUF file follows llama.cpp (Gemma's query scale 1/sqrt(head_dim) and embedding scale
    sqrtf(dim); Mistral without its window, which its `llama` file does not hold)."""
    gguf_bin, hf_bin, read = tmp_path / "gguf.bin", tmp_path / "hf.bin", tmp_path / "read.bin"
    convert(DATA / name, gguf_bin, "--dtype", "bf16")  # (gemma4-moe's F32 router as the directory's bf16)
    convert(source_dir(name, tmp_path, llama_cpp_reading=False), hf_bin, "--dtype", "bf16")
    convert(source_dir(name, tmp_path / "read"), read, "--dtype", "bf16")
    if name in KEYS_AS_VALUES:  # laid out otherwise: compared once laid out alike
        assert_same_model(gguf_bin, read)
        with pytest.raises(AssertionError):
            assert_same_model(gguf_bin, hf_bin)
        assert explicit_values(gguf_bin)[0] != explicit_values(hf_bin)[0], differs  # the header's scale
        return
    assert header_and_tensors(gguf_bin) != header_and_tensors(hf_bin), differs
    assert header_and_tensors(gguf_bin) == header_and_tensors(read)


def reference_nll(hf, tmp_path):
    """tests/family_reference.py's nll per token of TEXT for a Hugging Face directory, on the
    tokens run gives TEXT with tok512."""
    config = json.loads((hf / "config.json").read_text())
    export = conftest.load_export()
    files = export.open_safetensors(str(hf))
    tensors = {name: export.widen(files[name].raw(name)[1]).astype(np.float64) for name in files}
    plain = tmp_path / "for_tokens.bin"
    convert(hf, plain)
    tokens = conftest.tokens_of(plain, TEXT)
    return R.nll(R.forward(config, tensors, tokens), tokens)


@pytest.mark.parametrize("name", ["llama2-f32.gguf", "qwen2-bf16.gguf", "gemma3-bf16.gguf", "phi4mini-bf16.gguf",
                                  "smollm3-bf16.gguf"])
def test_converted_gguf_computes_the_family_references_perplexity(name, tmp_path):
    out = tmp_path / "gguf.bin"
    convert(DATA / name, out)
    r = run(out, "-z", TOK512, "-m", "ppl", "-p", TEXT)
    assert r.returncode == 0, r.stderr
    got = float(re.search(rb"^nll: (\S+)", r.stdout, re.M).group(1))
    expect = reference_nll(source_dir(name, tmp_path), tmp_path)
    assert abs(got - expect) <= 1e-4 * abs(expect), f"run {got} vs reference {expect}"


# ggml type ids (docs/gguf.md) and the widening of each, from the formats' definitions
F32, F16, Q8_0, BF16 = 0, 1, 8, 30


def widened(t, data):
    """A GGUF tensor's float32 weights: F32 as stored, F16 as IEEE half, BF16 its bits shifted
    up 16, Q8_0 each block's f16 scale d times its 32 int8 values."""
    if t.ggml_type == F32:
        return np.frombuffer(data, "<f4").copy()
    if t.ggml_type == F16:
        return np.frombuffer(data, "<f2").astype(np.float32)
    if t.ggml_type == BF16:
        return (np.frombuffer(data, "<u2").astype(np.uint32) << 16).view(np.float32)
    assert t.ggml_type == Q8_0, t.type_name
    blocks = np.frombuffer(data, np.dtype([("d", "<f2"), ("q", "i1", (32,))]))
    return (blocks["d"].astype(np.float32)[:, None] * blocks["q"].astype(np.float32)).reshape(-1)


def write_widened(src, out):
    """src's float32 GGUF: the same metadata, every tensor widened to F32."""
    g = conftest.load_export().read_gguf_file(str(src))
    tensors = [(t.name, F32, t.ne, widened(t, bytes(g.tensor_data(t.name))).astype("<f4").tobytes())
               for t in g.tensors.values()]
    W.write_gguf(out, W.metadata_entries(g), tensors)
    return out


@pytest.mark.parametrize("name", ["llama2-f16.gguf", "llama2-bf16.gguf", "llama2-q8_0.gguf", "qwen2-q8_0.gguf",
                                  "mixtral-q8_0.gguf", "mixtral-bf16.gguf", "gemma3-bf16.gguf", "gemma4-moe-bf16.gguf"])
def test_gguf_of_16bit_and_q8_0_weights_computes_what_its_widened_float32_gguf_computes(name, tmp_path):
    narrow, wide = tmp_path / "narrow.bin", tmp_path / "wide.bin"
    convert(DATA / name, narrow)
    convert(write_widened(DATA / name, tmp_path / "wide.gguf"), wide)
    for mode in MODES:
        assert outputs(narrow, mode, tmp_path) == outputs(wide, mode, tmp_path), f"{name} {mode}"


def test_gguf_tensors_are_copied_never_widened_or_requantized(tmp_path):
    """A Q8_0 file's blocks, a BF16 file's bits: the converted file is as small as the GGUF's
    matrices, and its q8_0 blocks are the GGUF's bytes."""
    out = tmp_path / "q8.bin"
    r = convert(DATA / "llama2-q8_0.gguf", out)
    assert "quantized" not in r.stderr, r.stderr  # copied: nothing was quantized, and stderr does not say so
    g = conftest.load_export().read_gguf_file(str(DATA / "llama2-q8_0.gguf"))
    blocks = bytes(g.tensor_data("blk.1.ffn_down.weight"))
    assert blocks in out.read_bytes()
    r = run(out, "-z", TOK512, "-m", "rope")
    assert b"q8_0" in r.stdout + r.stderr


# ---------------------------------------------------------------------------------------------
# Bad GGUF files: a fixture rewritten with one thing wrong


def rewritten(tmp_path, edit_metadata=None, edit_tensors=None, src="llama2-q8_0.gguf"):
    """DATA/src with its metadata entries and tensors passed through the edits."""
    g = conftest.load_export().read_gguf_file(str(DATA / src))
    metadata = W.metadata_entries(g)
    tensors = [(t.name, t.ggml_type, t.ne, bytes(g.tensor_data(t.name))) for t in g.tensors.values()]
    metadata = edit_metadata(metadata) if edit_metadata else metadata
    tensors = edit_tensors(tensors) if edit_tensors else tensors
    return W.write_gguf(tmp_path / "bad.gguf", metadata, tensors)


def set_key(key, value_type, value):
    return lambda entries: [(k, value_type, value) if k == key else (k, t, v) for k, t, v in entries]


def drop_key(key):
    return lambda entries: [e for e in entries if e[0] != key]


def drop_tensor(name):
    return lambda tensors: [t for t in tensors if t[0] != name]


def nan_scale(name):
    def edit(tensors):
        out = []
        for t in tensors:
            if t[0] == name:
                data = bytearray(t[3])
                data[34 * 3:34 * 3 + 2] = struct.pack("<H", 0x7E00)  # block 3's d: an f16 NaN
                t = (t[0], t[1], t[2], bytes(data))
            out.append(t)
        return out
    return edit


BAD = [
    ("embedding_length that contradicts token_embd", dict(edit_metadata=set_key("llama.embedding_length", W.UINT32, 96)),
     ["token_embd.weight", "96"]),
    ("head_count that contradicts attn_q", dict(edit_metadata=set_key("llama.attention.head_count", W.UINT32, 8)),
     ["blk.0.attn_q.weight"]),
    ("feed_forward_length that contradicts ffn_gate",
     dict(edit_metadata=set_key("llama.feed_forward_length", W.UINT32, 128)), ["ffn_gate", "128"]),
    ("block_count beyond the tensors", dict(edit_metadata=set_key("llama.block_count", W.UINT32, 3)),
     ["blk.2.", "missing"]),
    ("a required key missing", dict(edit_metadata=drop_key("llama.attention.head_count")),
     ["llama.attention.head_count", "missing"]),
    ("a required tensor missing", dict(edit_tensors=drop_tensor("blk.1.attn_v.weight")),
     ["blk.1.attn_v.weight", "missing"]),
    ("no architecture", dict(edit_metadata=drop_key("general.architecture")), ["general.architecture"]),
    ("an architecture run does not run", dict(edit_metadata=set_key("general.architecture", W.STRING, "falcon")),
     ["falcon"]),
    ("a key of the wrong type", dict(edit_metadata=set_key("llama.block_count", W.STRING, "two")),
     ["llama.block_count"]),
    ("a NaN Q8_0 scale", dict(edit_tensors=nan_scale("blk.0.ffn_up.weight")), ["blk.0.ffn_up.weight", "scale"]),
    ("a norm that is not F32", dict(edit_tensors=lambda ts: [
        (n, F16, ne, np.frombuffer(d, "<f4").astype("<f2").tobytes()) if n == "output_norm.weight" else (n, ty, ne, d)
        for n, ty, ne, d in ts]), ["output_norm.weight", "F16"]),
    ("a negative epsilon", dict(edit_metadata=set_key("llama.attention.layer_norm_rms_epsilon", W.FLOAT32, -1.0)),
     ["eps"]),
]


@pytest.mark.parametrize("what, edits, words", BAD, ids=[b[0] for b in BAD])
def test_bad_gguf_metadata_or_tensors_are_refused_in_one_line(what, edits, words, tmp_path):
    bad = rewritten(tmp_path, **edits)
    out = tmp_path / "out.bin"
    conftest.assert_export_refused(convert(bad, out, check=False), out, *words)


def test_an_unedited_rewrite_converts_to_the_same_file(tmp_path):
    """The rewriting above changes nothing by itself: each refusal is its edit's."""
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    convert(DATA / "llama2-q8_0.gguf", a)
    convert(rewritten(tmp_path), b)
    assert a.read_bytes() == b.read_bytes()


# ---------------------------------------------------------------------------------------------
# A seeded mutation fuzz of the model mapping: each fixture's metadata values and tensor shapes
# changed at random; every mutant converts (and run then loads the file) or is refused in one
# ExportError line, never another exception.

FUZZ_SOURCES = ["llama2-q8_0.gguf", "qwen3moe-bf16.gguf", "phi4mini-bf16.gguf", "gemma3-bf16.gguf",
                "llama3-bf16.gguf", "mixtral-q8_0.gguf", "gemma4-bf16.gguf", "gemma4-moe-bf16.gguf",
                "llama256-Q4_K_M.gguf", "llama2-Q5_1.gguf"]
ODD_NUMBERS = [0, 1, -1, 2, 3, 7, 33, 2**31 - 1, 2**31, 2**32 - 1, 2**63, 1e-30, 0.5, float("nan"), float("inf")]


def mutate(rng, metadata, tensors):
    """One random change: a metadata value (an odd number, in its own type or another), a key
    dropped, or a tensor's dims changed (its data cut or padded to the new size)."""
    metadata, tensors = list(metadata), list(tensors)
    what = rng.integers(4)
    if what < 2:
        i = int(rng.integers(len(metadata)))
        key, value_type, value = metadata[i]
        number = ODD_NUMBERS[int(rng.integers(len(ODD_NUMBERS)))]
        kinds = [(W.UINT32, int), (W.INT32, int), (W.UINT64, int), (W.FLOAT32, float), (W.STRING, str), (W.BOOL, bool)]
        new_type, kind = kinds[int(rng.integers(len(kinds)))] if what == 1 else (value_type, None)
        if isinstance(new_type, tuple) or new_type == W.STRING:
            new_type, value = W.STRING, str(number)
        elif new_type == W.BOOL:
            value = bool(number == number and number)
        elif new_type in (W.FLOAT32,):
            value = float(number)
        else:
            value = int(number) if number == number and abs(number) != float("inf") else 0
            limit = {W.UINT32: (0, 2**32 - 1), W.INT32: (-2**31, 2**31 - 1), W.UINT64: (0, 2**64 - 1)}.get(
                new_type, (-2**63, 2**63 - 1))
            value = min(max(value, limit[0]), limit[1])
        metadata[i] = (key, new_type, value)
    elif what == 2:
        del metadata[int(rng.integers(len(metadata)))]
    else:
        i = int(rng.integers(len(tensors)))
        name, ggml_type, ne, data = tensors[i]
        block = 32 if ggml_type == Q8_0 else 1
        ne = list(ne)
        d = int(rng.integers(len(ne)))
        ne[d] = max(block, ne[d] + int(rng.choice([-block, block, ne[d]])))
        size = W.tensor_nbytes(ggml_type, ne)
        data = (data + bytes(size))[:size]
        tensors[i] = (name, ggml_type, tuple(ne), data)
    return metadata, tensors


@contextlib.contextmanager
def address_space_capped():
    """This process's address space capped 3 GiB above what it uses now, inside the block: a
    mutant that makes export.py allocate by a length it did not check fails as MemoryError, not
    as the machine's OOM kill. (Not around run: a sanitizer build maps terabytes of shadow.)"""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as f:
        used = int(f.read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (used + 3 * 2**30, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def test_seeded_mutants_of_real_ggufs_convert_or_are_refused_in_one_line(tmp_path):
    export = conftest.load_export()
    rng = np.random.default_rng(52)
    converted, refused = [], 0
    for n in range(240):
        src = FUZZ_SOURCES[n % len(FUZZ_SOURCES)]
        g = export.read_gguf_file(str(DATA / src))
        metadata = W.metadata_entries(g)
        tensors = [(t.name, t.ggml_type, t.ne, bytes(g.tensor_data(t.name))) for t in g.tensors.values()]
        metadata, tensors = mutate(rng, metadata, tensors)
        path = W.write_gguf(tmp_path / f"m{n}.gguf", metadata, tensors)
        out = tmp_path / f"m{n}.bin"
        try:
            with address_space_capped():
                export.LATER.clear()
                c, pieces, kind, tok = export.read_gguf(str(path))
                with open(out, "wb") as f:
                    export.write_rope(f, c, pieces, str(out), kind, tok)
        except export.ExportError as e:
            assert "\n" not in str(e), (n, src, str(e))
            refused += 1
            continue
        converted.append((n, src, out))
    for n, src, out in converted:  # what export.py writes, run loads
        r = run(out, "-m", "rope")
        assert r.returncode == 0, (n, src, r.stderr.decode())
    converted = len(converted)
    assert converted > 20 and refused > 20, (converted, refused)


def test_legacy_from_a_gguf_is_llama2cs_file_of_its_directory_without_a_tokenizer(tmp_path):
    a, b = tmp_path / "gguf.bin", tmp_path / "hf.bin"
    r = convert(DATA / "llama2-f32.gguf", a, "--legacy")
    assert "tokenizer is left out" in r.stderr
    convert(source_dir("llama2-f32.gguf", tmp_path), b, "--legacy")
    assert a.read_bytes() == b.read_bytes()
