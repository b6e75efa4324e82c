"""Gemma 4 31B's and 26B-A4B's k = v layers (attention_k_eq_v) from GGUF files of blocks.

Those full layers have no value projection: their values are the key projection before k_norm and
RoPE. llama.cpp's converter writes no attn_v for them (its gemma4 graph takes Kcur as Vcur when a
layer has none) and keeps attn_k in the checkpoint's own row order, so export.py gives such a layer
an explicit wv, attn_k as stored, and writes wo as stored: a block's columns cannot be permuted,
which the values-are-the-keys layout (the Hugging Face route's) would need.

The fixture is tests/data/gguf/gemma4-31b-Q4_0.gguf: llama.cpp's converter's bf16 GGUF of the
tests' 31B-shaped checkpoint (one period: five sliding layers, then a full layer with p-RoPE,
k = v and one global KV head), quantized to Q4_0 by llama-quantize (README there). Checked:

  * the converted file against the GGUF's own bytes (docs/format.md read with struct): every
    layer's values field 0, the k = v layer's wv the GGUF's attn_k blocks as stored, wk those
    rows permuted into adjacent pairs, wo attn_output's blocks as stored;
  * against the float32 GGUF of its weights dequantized by tests/block_reference.py (written by
    the tests' GGUF writer, the same metadata): every mode of run, byte for byte, at 1 and 2
    threads;
  * the float32 route (that dequantized GGUF) and a BF16 one (the Hugging Face directory's own
    weights in a GGUF written by the tests' writer) against tests/gemma4_reference.py, the
    independent NumPy forward pass, on the same weights: ppl's nll within 1e-4 relative and
    greedy tokens, as tests/test_gemma4_export.py judges the Hugging Face route;
  * each of these on a variant with KV sharing (the six layers twice, the second six reading the
    first six's caches: a shared full layer reads the k = v layer's), since a layer reading a
    cache must take its values in the order the source layer stored them;
  * that the reference sees the layout: the converted file with the k = v layers' wo columns
    permuted per head (the Hugging Face route's wo with this route's wv) no longer agrees.
"""
import math
import re

import numpy as np
import pytest

import block_reference as R
import gemma4_fixtures as G4F
import gemma4_reference as g4
import gguf_fixtures as GF
import gguf_writer as W
from conftest import LONG_TEXT, ROOT, TOK512, export, greedy_ids, load_export, run, tokens_of
from test_block_types import outputs, write_dequantized_gguf
from test_gemma4_export import adjacent_pairs, layout, read_header, read_records

DATA = ROOT / "tests" / "data" / "gguf"
Q4 = DATA / "gemma4-31b-Q4_0.gguf"
EXPORT = load_export()
MODES = ["generate-greedy", "generate-seeded", "ppl", "inspect", "chat"]
TEXT = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the "
        "park with her friends. One day, she saw a big red ball.")
PROMPT = "Once upon a time, there was a little girl named Lily. She"
STEPS = 16
FULL = 5  # the k = v layer of the six

# llama.cpp's gemma4 tensor names and the Hugging Face names they hold (its tensor_mapping; the
# norms as w, rows in the checkpoint's order: tests/data/gguf/README.md)
HF_OF_GGUF = {"token_embd.weight": "embed_tokens.weight", "output_norm.weight": "norm.weight"}
HF_OF_GGUF_LAYER = {
    "attn_norm.weight": "input_layernorm.weight", "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight", "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight", "layer_output_scale.weight": "layer_scalar",
}


def hf_name(gguf_name):
    """The Hugging Face name (prefix stripped) of a gemma4 GGUF tensor; None for rope_freqs."""
    if gguf_name in HF_OF_GGUF:
        return HF_OF_GGUF[gguf_name]
    m = re.fullmatch(r"blk\.(\d+)\.(.+)", gguf_name)
    return f"layers.{m.group(1)}.{HF_OF_GGUF_LAYER[m.group(2)]}" if m else None


def source_config():
    """The fixture's config.json as llama.cpp reads its GGUF: the embedding scale sqrtf(dim) in
    float32 (tests/test_gguf_export.py's LLAMA_CPP_READING for gemma4)."""
    config = G4F.shrink("gemma-4-31B", dtype="BF16", **GF.GEMMA4_31B)
    for c in (config, config["text_config"]):
        c["dtype"] = "float32"
    return config


def gguf_weights(path):
    """{Hugging Face name: float64} of a gemma4 GGUF's tensors, each widened by the reference
    (tests/block_reference.py: blocks as llama.cpp dequantizes them)."""
    g = EXPORT.read_gguf_file(str(path))
    out = {}
    for name, t in g.tensors.items():
        if hf_name(name) is not None:
            values = R.dequantize_gguf(t.type_name, g.tensor_data(name), math.prod(t.shape))
            out[hf_name(name)] = values.astype(np.float64).reshape(t.shape)
    return out


def write_hf_bf16_gguf(out, tmp_path):
    """The fixture's GGUF with the Hugging Face directory's own weights (recreated by
    gguf_fixtures.hf_dir): matrices BF16, the rest F32, as llama.cpp's converter stores them."""
    _, tensors = G4F.write_checkpoint(tmp_path / "hf", "gemma-4-31B", "BF16", seed=3, config=source_config())
    w = g4.strip_prefix(tensors)
    g = EXPORT.read_gguf_file(str(Q4))
    written = []
    for name, t in g.tensors.items():
        if hf_name(name) is None:  # rope_freqs
            written.append((name, W.F32, t.ne, bytes(g.tensor_data(name))))
            continue
        values = w[hf_name(name)].reshape(t.shape)
        written.append(W.float_tensor(name, values, W.BF16 if len(t.shape) == 2 else W.F32))
    W.write_gguf(out, W.metadata_entries(g), written)
    return out


def shared_twice(src, out):
    """src's six layers twice, the second six KV-shared (shared_kv_layers 6: each reads the last
    unshared layer of its kind, the sliding ones layer 4's cache, the full one layer 5's); the
    per-layer lists doubled. The shared layers keep their attn_k / attn_k_norm, as the converter
    keeps them; a correct reader ignores them."""
    g = EXPORT.read_gguf_file(str(src))
    n = g.metadata["gemma4.block_count"]
    metadata = []
    for key, value_type, value in W.metadata_entries(g):
        if key == "gemma4.block_count":
            value = 2 * n
        elif key == "gemma4.attention.shared_kv_layers":
            value = n
        elif isinstance(value_type, tuple) and len(value) == n and not key.startswith("tokenizer."):
            value = list(value) * 2
        metadata.append((key, value_type, value))
    tensors = [(t.name, t.ggml_type, t.ne, bytes(g.tensor_data(t.name))) for t in g.tensors.values()]
    for name, ggml_type, ne, data in list(tensors):
        m = re.fullmatch(r"blk\.(\d+)\.(.+)", name)
        if m:
            tensors.append((f"blk.{int(m.group(1)) + n}.{m.group(2)}", ggml_type, ne, data))
    W.write_gguf(out, metadata, tensors)
    return out


def shared_config(config):
    """config with its layers twice and the second half KV-shared (shared_twice's model)."""
    t = config["text_config"]
    t["layer_types"] = t["layer_types"] * 2
    t["num_hidden_layers"] = len(t["layer_types"])
    t["num_kv_shared_layers"] = len(t["layer_types"]) // 2
    return config


def shared_weights(w, n=6):
    """The reference's weights of shared_twice's model: layer i + n is layer i's."""
    out = dict(w)
    for name, a in w.items():
        m = re.fullmatch(r"layers\.(\d+)\.(.+)", name)
        if m:
            out[f"layers.{int(m.group(1)) + n}.{m.group(2)}"] = a
    return out


# ----------------------------------------------------------------------------
# The fixture and the converted file's layout


def test_the_fixture_is_31b_shaped_q4_0_with_no_value_projection_on_its_full_layer():
    g = EXPORT.read_gguf_file(str(Q4))
    assert list(g.metadata["gemma4.attention.sliding_window_pattern"]) == [True] * 5 + [False]
    assert list(g.metadata["gemma4.attention.head_count_kv"]) == [4] * 5 + [1]
    assert g.metadata["gemma4.attention.key_length"] == 32 and g.metadata["gemma4.attention.key_length_swa"] == 16
    freqs = np.frombuffer(bytes(g.tensor_data("rope_freqs.weight")), "<f4")
    assert list(freqs[:4]) == [1] * 4 and np.all(freqs[4:] >= 1e30)  # p-RoPE: 4 of 16 pairs turn
    assert "blk.5.attn_v.weight" not in g.tensors and "blk.5.attn_k.weight" in g.tensors
    assert all(f"blk.{i}.attn_v.weight" in g.tensors for i in range(5))
    matrices = {t.type_name for n, t in g.tensors.items() if len(t.shape) == 2}
    assert matrices == {"Q4_0", "Q8_0"} and g.tensors["token_embd.weight"].type_name == "Q8_0"


def permuted_rows(blocks, n_heads, order, row_bytes):
    """A block tensor's rows (row_bytes each) permuted per head by order."""
    rows = np.frombuffer(blocks, np.uint8).reshape(n_heads, len(order), row_bytes)
    return rows[:, order].tobytes()


@pytest.mark.parametrize("variant", ["plain", "shared"])
def test_k_eq_v_layer_gets_attn_k_as_stored_for_its_values_and_wo_as_stored(variant, tmp_path):
    src = Q4 if variant == "plain" else shared_twice(Q4, tmp_path / "shared.gguf")
    out = tmp_path / "out.bin"
    export(src, out)
    data = out.read_bytes()
    records = read_records(data, read_header(data))
    assert [r[6] for r in records] == [0] * len(records)  # no layer's values are its keys
    if variant == "shared":
        assert [r[5] for r in records] == [0] * 6 + [5] * 5 + [6]  # layer 11 reads layer 5's cache
    g = EXPORT.read_gguf_file(str(src))
    _, tensors, _, _ = EXPORT.read_flat_checkpoint(str(out))
    attn_k = bytes(g.tensor_data(f"blk.{FULL}.attn_k.weight"))
    assert bytes(tensors["wv"][FULL].data) == attn_k
    row_bytes = 32 // 32 * 18  # Q4_0 rows of 32 weights: one block
    assert bytes(tensors["wk"][FULL].data) == permuted_rows(attn_k, 1, adjacent_pairs(32), row_bytes) != attn_k
    for layer in range(len(records)):
        assert bytes(tensors["wo"][layer].data) == bytes(g.tensor_data(f"blk.{layer}.attn_output.weight")), layer


# ----------------------------------------------------------------------------
# run: the blocks against the float32 file of their dequantized weights


@pytest.mark.parametrize("variant", ["plain", "shared"])
def test_q4_0_file_computes_what_the_float32_gguf_of_its_dequantized_weights_computes(variant, tmp_path):
    src = Q4 if variant == "plain" else shared_twice(Q4, tmp_path / "shared.gguf")
    narrow, wide = tmp_path / "narrow.bin", tmp_path / "wide.bin"
    export(src, narrow)
    export(write_dequantized_gguf(src, tmp_path / "wide.gguf"), wide)
    assert narrow.stat().st_size < wide.stat().st_size / 3  # the blocks were kept, not widened
    for threads in (1, 2):
        for mode in MODES:
            assert outputs(None, narrow, threads, mode, tmp_path) == outputs(None, wide, threads, mode, tmp_path), \
                f"{variant} -T {threads} {mode}"


# ----------------------------------------------------------------------------
# The float routes against the NumPy reference


def float_gguf(route, tmp_path):
    """(GGUF file, the reference's weights): the float32 GGUF of the fixture's dequantized weights,
    or the BF16 GGUF of the Hugging Face directory's weights."""
    path = tmp_path / f"{route}.gguf"
    if route == "dequantized-f32":
        write_dequantized_gguf(Q4, path)
    else:
        write_hf_bf16_gguf(path, tmp_path)
    return path, gguf_weights(path)


def ppl_of(model, text):
    r = run(model, "-z", TOK512, "-m", "ppl", "-p", text)
    assert r.returncode == 0, r.stderr
    return float(re.search(rb"nll: (\S+)", r.stdout).group(1))


def assert_agrees_with_reference(model, config, w, text=TEXT):
    tokens = tokens_of(model, text)
    expected = g4.nll(g4.forward(config, w, tokens), tokens)
    nll = ppl_of(model, text)
    assert abs(nll - expected) <= 1e-4 * abs(expected), (nll, expected)
    prompt = tokens_of(model, PROMPT)
    generated = greedy_ids(model, PROMPT, len(prompt) + STEPS)
    assert len(generated) >= STEPS
    assert generated == g4.greedy(config, w, prompt, len(generated))
    return expected


@pytest.mark.parametrize("variant", ["plain", "shared"])
@pytest.mark.parametrize("route", ["dequantized-f32", "hf-bf16"])
def test_float_gguf_route_matches_the_reference(route, variant, tmp_path):
    src, w = float_gguf(route, tmp_path)
    config = source_config()
    if variant == "shared":
        src, w, config = shared_twice(src, tmp_path / "shared.gguf"), shared_weights(w), shared_config(config)
    model = tmp_path / "model.bin"
    export(src, model)
    assert_agrees_with_reference(model, config, w)
    if variant == "shared":  # past the sliding window's ring, through the prefill blocks
        assert_agrees_with_reference(model, config, w, LONG_TEXT)


@pytest.mark.parametrize("variant", ["plain", "shared"])
def test_wo_columns_permuted_as_for_values_that_are_the_keys_disagree_with_the_reference(variant, tmp_path):
    """The reference sees wo's layout: in the converted float32 file, the columns of the wo of the
    k = v layer (and of the layer reading its cache) permuted per head as the Hugging Face route
    permutes them, beside this route's explicit wv, and run no longer agrees."""
    src, w = float_gguf("dequantized-f32", tmp_path)
    config = source_config()
    if variant == "shared":
        src, w, config = shared_twice(src, tmp_path / "shared.gguf"), shared_weights(w), shared_config(config)
    model = tmp_path / "model.bin"
    export(src, model)
    expected = assert_agrees_with_reference(model, config, w)
    data = bytearray(model.read_bytes())
    h = read_header(data)
    records = read_records(data, h)
    assert h["weight_type"] == 0
    at = [at for name, _, _, at in layout(h, records)[0] if name == "wo"][0]
    dim, nh = h["dim"], h["n_heads"]
    for layer, r in enumerate(records):
        hd = r[2] or h["head_size"]
        n = dim * nh * hd
        if layer % 6 == FULL:
            wo = np.frombuffer(bytes(data[at:at + 4 * n]), "<f4").reshape(dim, nh, hd)
            data[at:at + 4 * n] = np.ascontiguousarray(wo[:, :, adjacent_pairs(hd)]).tobytes()
        at += 4 * n
    wrong = tmp_path / "wrong.bin"
    wrong.write_bytes(bytes(data))
    got = ppl_of(wrong, TEXT)
    assert abs(got - expected) > 1e-3 * abs(expected), (got, expected)
