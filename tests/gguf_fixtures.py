"""The small GGUF files in tests/data/gguf/: the Hugging Face directories they were made from,
and how llama.cpp's tools made them.

Each GGUF file there was made by llama.cpp's own converter (convert_hf_to_gguf.py) and, for
the quantized ones, by llama.cpp's llama-quantize, from a random-weight HF directory that the
tests' seeded fixture writers recreate byte for byte:

    hf_dir(source, out_dir)    writes the HF directory SOURCES[source] (config.json, the
                               safetensors, tokenizer.model); importable without llama.cpp
    hf_sha256(out_dir)         the sha256 recorded in tests/data/gguf/hf_sha256.json
    GGUF_FILES                 per file: its source, the tool that made it, the command

A test converting tests/data/gguf/X.gguf with export.py recreates its source with hf_dir(),
exports that too and compares the weights.

The vocabulary is the tests' tok512 (models/tok512.bin: stories260K's 512-piece SentencePiece
BPE vocabulary, in llama2.c's format). Most of llama.cpp's converter classes want a
SentencePiece tokenizer.model, so make_tok512_model() writes one back from tok512.bin (a
ModelProto protobuf, written by hand below: no protobuf package is needed). Qwen3-MoE's reads
only a byte-level BPE tokenizer.json (make_tok512_bpe_json) and Gemma 4's only Hugging Face's
SentencePiece-BPE tokenizer.json (make_tok512_hf_json). These tokenizer files are the only
files in the HF directories not written by the fixture modules; nothing in the GGUF files
other than that vocabulary comes from anywhere but the fixtures and llama.cpp's tools.

Widths: the shrink() configs of tests/family_fixtures.py are narrowed further here (hidden 64,
intermediate 96, head_dim 16, see NARROW) because at shrink()'s widths (hidden up to 512) the
files would be ~50 MB in all; every file here stays under 1.2 MB.

Remaking the files (needs llama.cpp, which is never part of this repository; see
tests/data/gguf/README.md for the exact versions):

    /usr/bin/python3 tests/gguf_fixtures.py OUT_DIR [FILE...]

with CONVERT (2025 converter wrapper), CONVERT2026 and QUANTIZE in the environment (defaults:
the paths of the machine they were made on).
"""
import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
import family_fixtures as FF  # noqa: E402
import hf_fixture  # noqa: E402
import gemma4_fixtures as G4F  # noqa: E402
import moe_fixtures as MF  # noqa: E402

ROOT = TESTS.parent
TOK512 = ROOT / "models" / "tok512.bin"
GGUF_DATA = TESTS / "data" / "gguf"

# ---------------------------------------------------------------------------
# tok512 as a SentencePiece tokenizer.model
# ---------------------------------------------------------------------------

# sentencepiece_model.proto: SentencePiece.Type
NORMAL, UNKNOWN, CONTROL, BYTE = 1, 2, 3, 6
BPE = 2  # TrainerSpec.ModelType


def read_tok512(path=TOK512):
    """[(piece, score)] of a llama2.c tokenizer file: i32 max_token_length, then per piece
    f32 score, i32 length, the bytes. llama2.c's export wrote <s> and </s> as "\\n<s>\\n" and
    "\\n</s>\\n" and SentencePiece's U+2581 as a space; this undoes both."""
    data = Path(path).read_bytes()
    pos, pieces = 4, []
    while pos < len(data):
        score, n = struct.unpack_from("<fi", data, pos)
        pos += 8
        text = data[pos:pos + n].decode("utf-8")
        pos += n
        pieces.append((text.strip("\n") if text in ("\n<s>\n", "\n</s>\n") else text.replace(" ", "\u2581"),
                       score))
    return pieces


def _varint(n):
    n &= (1 << 64) - 1  # negative int32s: ten bytes, two's complement
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number, value):
    """One protobuf field: int -> varint (wire 0), float -> fixed32 (wire 5), bytes/str -> wire 2."""
    if isinstance(value, float):
        return _varint(number << 3 | 5) + struct.pack("<f", value)
    if isinstance(value, int):
        return _varint(number << 3 | 0) + _varint(value)
    if isinstance(value, str):
        value = value.encode("utf-8")
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def piece_type(i, text):
    if i == 0:
        return UNKNOWN
    if text in ("<s>", "</s>"):
        return CONTROL
    if len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
        return BYTE
    return NORMAL


def make_tok512_model(path, tok512=TOK512):
    """Write tok512's 512 pieces as a SentencePiece ModelProto to `path`.

    ModelProto: 1 = repeated SentencePiece {1 piece, 2 score, 3 type}; 2 = TrainerSpec {3
    model_type BPE, 4 vocab_size, 35 byte_fallback, 40 unk_id 0, 41 bos_id 1, 42 eos_id 2,
    43 pad_id -1}; 3 = NormalizerSpec {1 name "identity", 3 add_dummy_prefix, 4
    remove_extra_whitespaces false, 5 escape_whitespaces}: the settings llama2.c's
    train_vocab.sh trained stories260K's tokenizer with. Types: <unk> UNKNOWN, <s> and </s>
    CONTROL, <0x00>..<0xFF> BYTE, the rest NORMAL."""
    pieces = read_tok512(tok512)
    out = bytearray()
    for i, (text, score) in enumerate(pieces):
        out += _field(1, _field(1, text) + _field(2, float(score)) + _field(3, piece_type(i, text)))
    trainer = (_field(3, BPE) + _field(4, len(pieces)) + _field(35, 1) + _field(40, 0) + _field(41, 1)
               + _field(42, 2) + _field(43, -1))
    normalizer = _field(1, "identity") + _field(3, 1) + _field(4, 0) + _field(5, 1)
    out += _field(2, trainer) + _field(3, normalizer)
    Path(path).write_bytes(bytes(out))
    return path


def _byte_level_table():
    """GPT-2's bytes_to_unicode: the printable stand-in character of each byte."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return chars


QWEN2_SPLIT = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
               "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")


def make_tok512_bpe_json(out_dir, tok512=TOK512):
    """tok512 as a byte-level BPE tokenizer.json (Qwen2's pre-tokenizer and decoder) plus a
    tokenizer_config.json, for converters that read only tokenizer.json (Qwen3-MoE's).

    Ids: 0 <unk>, 1 <s>, 2 </s> (tok512's) as added special tokens; 3..258 the 256 bytes
    (GPT-2's byte-to-character table; tok512's byte ids); then, in tok512's order (its merge
    order), each tok512 piece (U+2581 as a space, in byte-level form) that is not already
    there (tok512's single-character pieces are bytes here) and splits into two pieces
    already there: that split is its merge. The rest of tok512 (characters of several UTF-8
    bytes, which byte-level BPE would need intermediate merges for) is left out, and the
    config's vocab_size 512 pads the vocabulary (the converter writes [PAD<id>] tokens)."""
    out_dir = Path(out_dir)
    chars = _byte_level_table()
    pieces = read_tok512(tok512)
    vocab, merges = {}, []
    for i, (text, _) in enumerate(pieces):
        if piece_type(i, text) == BYTE:
            vocab[chars[int(text[3:5], 16)]] = i
    for i, (text, _) in enumerate(pieces):
        if piece_type(i, text) != NORMAL:
            continue
        form = "".join(chars[b] for b in text.replace("\u2581", " ").encode("utf-8"))
        if form in vocab:
            continue
        for cut in range(1, len(form)):
            if form[:cut] in vocab and form[cut:] in vocab:
                merges.append(f"{form[:cut]} {form[cut:]}")
                vocab[form] = len(vocab) + 3
                break
    added = [{"id": i, "content": pieces[i][0], "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i in range(3)]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_SPLIT}, "behavior": "Isolated", "invert": False},
            byte_level]},
        "post_processor": byte_level, "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges}}
    config = {"add_bos_token": False, "add_prefix_space": False, "bos_token": "<s>", "eos_token": "</s>",
              "unk_token": "<unk>", "pad_token": None, "clean_up_tokenization_spaces": False,
              "model_max_length": 1024, "tokenizer_class": "Qwen2Tokenizer",
              "added_tokens_decoder": {str(a["id"]): {k: v for k, v in a.items() if k != "id"} for a in added}}
    (out_dir / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False, indent=1), encoding="utf-8")
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    return out_dir


def make_tok512_hf_json(out_dir, tok512=TOK512):
    """tok512 as the tokenizer.json Hugging Face writes for a SentencePiece BPE model with byte
    fallback (Llama 2's layout: BPE over U+2581-pieces, byte_fallback, Prepend/Replace
    normalizer, Replace/ByteFallback/Fuse/Strip decoder), for converters that read only that
    (gguf-py's LlamaHfVocab: Gemma 4's). The vocabulary is tok512's 512 pieces at their ids,
    <unk> <s> </s> also as special added tokens; merges: every split of a piece into two pieces,
    ranked by (piece id, left id, right id), as transformers' SentencePieceExtractor makes them."""
    out_dir = Path(out_dir)
    pieces = read_tok512(tok512)
    vocab = {text: i for i, (text, _) in enumerate(pieces)}
    ranked = []  # as transformers' SentencePieceExtractor: every split of a piece into two pieces,
    for i, (text, _) in enumerate(pieces):  # ranked by (piece id, left id, right id)
        if piece_type(i, text) != NORMAL:
            continue
        for cut in range(1, len(text)):
            a, b = text[:cut], text[cut:]
            if a in vocab and b in vocab:
                ranked.append((i, vocab[a], vocab[b], f"{a} {b}"))
    merges = [m for *_, m in sorted(ranked)]
    added = [{"id": i, "content": pieces[i][0], "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i in range(3)]
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"}, {"type": "Replace", "pattern": {"String": " "},
                                                      "content": "\u2581"}]},
        "pre_tokenizer": None, "post_processor": None,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
            {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": merges}}
    config = {"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
              "unk_token": "<unk>", "pad_token": None, "clean_up_tokenization_spaces": False,
              "model_max_length": 1024, "tokenizer_class": "LlamaTokenizerFast", "legacy": False,
              "added_tokens_decoder": {str(a["id"]): {k: v for k, v in a.items() if k != "id"} for a in added}}
    (out_dir / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False, indent=1), encoding="utf-8")
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    return out_dir


# ---------------------------------------------------------------------------
# The source HF directories
# ---------------------------------------------------------------------------

NARROW = dict(hidden_size=64, intermediate_size=96)  # every family; head_dim 16 where the config has one
NARROW_EXTRA = {
    "Qwen2.5-0.5B": dict(num_attention_heads=2, num_key_value_heads=1),  # 7/1 heads cannot make 64
    "Phi-4-mini": dict(hidden_size=128, num_attention_heads=1, num_key_value_heads=1, intermediate_size=32),
    # head 128: the real longrope factor lists (48 = 128 * 0.75 / 2 each) must fit the rotary width
    "Gemma-3-270M": dict(intermediate_size=32),  # 6 layers (5 sliding + 1 global): the biggest family
}
LLAMA3_ROPE = {"type": "llama3", "theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


def family_config(name, dtype="BF16"):
    """family_fixtures.shrink(name, dtype=dtype) narrowed by NARROW (and NARROW_EXTRA)."""
    config = FF.shrink(name, dtype=dtype)
    text = FF._text(config)
    text.update(NARROW)
    if "head_dim" in text:
        text["head_dim"] = 16
    text.update(NARROW_EXTRA.get(name, {}))
    return config


def _llama(dtype, **kw):
    return lambda d: hf_fixture.make_hf_checkpoint(d, dtype=dtype, vocab_size=512, **kw)


def _family(name, dtype="BF16"):
    return lambda d: FF.write_checkpoint(d, name, dtype, seed=3, config=family_config(name, dtype))


def _moe(name, dtype="BF16", **overrides):
    return lambda d: MF.write_checkpoint(d, name, dtype, seed=3, config=MF.shrink(name, dtype=dtype, **overrides))


# source name: (Python call, as text for the README, function writing it to a directory)
SOURCES = {
    # test_weight_types.py's hf_models: make_hf_checkpoint(dtype=..., vocab_size=512, tied=False, seed=21)
    "llama2-f32": ('hf_fixture.make_hf_checkpoint(d, dtype="F32", vocab_size=512, tied=False, seed=21)',
                   _llama("F32", tied=False, seed=21)),
    "llama2-f16": ('hf_fixture.make_hf_checkpoint(d, dtype="F16", vocab_size=512, tied=False, seed=21)',
                   _llama("F16", tied=False, seed=21)),
    "llama2-bf16": ('hf_fixture.make_hf_checkpoint(d, dtype="BF16", vocab_size=512, tied=False, seed=21)',
                    _llama("BF16", tied=False, seed=21)),
    "llama3": ('hf_fixture.make_hf_checkpoint(d, dtype="BF16", vocab_size=512, tied=True, seed=22, '
               f'rope={LLAMA3_ROPE!r})', _llama("BF16", tied=True, seed=22, rope=LLAMA3_ROPE)),
    # rows of 256 so that llama-quantize's K-quants apply (no fallback)
    "llama256": ('hf_fixture.make_hf_checkpoint(d, dim=256, hidden_dim=256, n_layers=2, n_heads=4, '
                 'n_kv_heads=2, dtype="F32", vocab_size=512, tied=True, seed=23)',
                 _llama("F32", dim=256, hidden_dim=256, n_layers=2, n_heads=4, n_kv_heads=2, tied=True,
                        seed=23)),
}
FAMILIES = {"qwen2": "Qwen2.5-0.5B", "qwen3": "Qwen3-0.6B", "gemma": "Gemma-2B", "gemma2": "Gemma-2-2B",
            "gemma3": "Gemma-3-270M", "smollm3": "SmolLM3-3B",
            "phi3": "Phi-3-mini-4k", "phi4mini": "Phi-4-mini", "mistral": "Mistral-7B-v0.1"}
for _key, _name in FAMILIES.items():
    SOURCES[_key] = (f'family_fixtures.write_checkpoint(d, "{_name}", "BF16", seed=3, '
                     f'config=gguf_fixtures.family_config("{_name}", "BF16"))', _family(_name))
# Mixtral: experts 4 (top-2 kept) and width 64 (shrink's 48 is no multiple of 32: llama-quantize
# refuses q8_0 of ffn_down with rows of 48)
SOURCES["mixtral"] = ('moe_fixtures.write_checkpoint(d, "Mixtral-8x7B-v0.1", "BF16", seed=3, '
                      'config=moe_fixtures.shrink("Mixtral-8x7B-v0.1", dtype="BF16", experts=4, hidden_size=64, '
                      'intermediate_size=64))',
                      _moe("Mixtral-8x7B-v0.1", experts=4, hidden_size=64, intermediate_size=64))
SOURCES["qwen3moe"] = ('moe_fixtures.write_checkpoint(d, "Qwen3-30B-A3B", "BF16", seed=3, '
                       'config=moe_fixtures.shrink("Qwen3-30B-A3B", dtype="BF16", hidden_size=64, head_dim=16))',
                       _moe("Qwen3-30B-A3B", hidden_size=64, head_dim=16))


# Gemma 4 E2B narrowed: hidden 64, intermediate 64, per-layer input 16 (gemma4_fixtures.shrink's
# defaults otherwise: two periods of 4 sliding + 1 full, the last period kv-shared)
GEMMA4_E2B = dict(hidden=64, intermediate=64, per_layer=16)
SOURCES["gemma4"] = ('gemma4_fixtures.write_checkpoint(d, "gemma-4-E2B", "BF16", seed=3, '
                     'config=gemma4_fixtures.shrink("gemma-4-E2B", dtype="BF16", hidden=64, intermediate=64, '
                     'per_layer=16))',
                     lambda d: G4F.write_checkpoint(d, "gemma-4-E2B", "BF16", seed=3,
                                                    config=G4F.shrink("gemma-4-E2B", dtype="BF16", **GEMMA4_E2B)))

# Gemma 4 26B-A4B narrowed (moe_fixtures.shrink_gemma4: one period of 5 sliding + 1 full layer,
# k = v on the full layer), hidden 32 and 9 experts (top-k 8 needs more than 8) to keep it small
GEMMA4_MOE = dict(hidden=32, experts=9)
SOURCES["gemma4-moe"] = ('moe_fixtures.write_checkpoint_gemma4(d, "gemma-4-26B-A4B", "BF16", seed=3, '
                         'config=moe_fixtures.shrink_gemma4("gemma-4-26B-A4B", dtype="BF16", hidden=32, experts=9))',
                         lambda d: MF.write_checkpoint_gemma4(d, "gemma-4-26B-A4B", "BF16", seed=3,
                                                              config=MF.shrink_gemma4("gemma-4-26B-A4B", dtype="BF16",
                                                                                      **GEMMA4_MOE)))

# Gemma 4 31B narrowed: one period of 5 sliding + 1 full layer (p-RoPE, k = v, one global kv head),
# hidden 32 and intermediate 32 (rows of 32: whole Q4_0 blocks) to keep its Q4_0 file small
GEMMA4_31B = dict(periods=1, hidden=32, intermediate=32)
SOURCES["gemma4-31b"] = ('gemma4_fixtures.write_checkpoint(d, "gemma-4-31B", "BF16", seed=3, '
                         'config=gemma4_fixtures.shrink("gemma-4-31B", dtype="BF16", periods=1, hidden=32, '
                         'intermediate=32))',
                         lambda d: G4F.write_checkpoint(d, "gemma-4-31B", "BF16", seed=3,
                                                        config=G4F.shrink("gemma-4-31B", dtype="BF16", **GEMMA4_31B)))

# the sources whose converter reads only tokenizer.json: tok512 as byte-level BPE (BPE_JSON) or
# in Hugging Face's SentencePiece-BPE layout (HF_JSON)
BPE_JSON_SOURCES = {"qwen3moe"}
HF_JSON_SOURCES = {"gemma4", "gemma4-moe", "gemma4-31b"}


def hf_dir(source, out_dir):
    """Write source SOURCES[source]'s HF directory (weights, config.json, tok512 as
    tokenizer.model or, for BPE_JSON_SOURCES, as tokenizer.json) to out_dir; returns out_dir."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    SOURCES[source][1](out_dir)
    if source in BPE_JSON_SOURCES:
        make_tok512_bpe_json(out_dir)
    elif source in HF_JSON_SOURCES:
        make_tok512_hf_json(out_dir)
    else:
        make_tok512_model(out_dir / "tokenizer.model")
    return out_dir


def hf_sha256(out_dir):
    """sha256 over config.json, then the safetensors files in name order (model.safetensors,
    or the shards and model.safetensors.index.json)."""
    out_dir = Path(out_dir)
    h = hashlib.sha256()
    for name in ["config.json"] + sorted(p.name for p in out_dir.iterdir() if "safetensors" in p.name):
        h.update(name.encode() + b"\0" + (out_dir / name).read_bytes())
    return h.hexdigest()


# ---------------------------------------------------------------------------
# The GGUF files
# ---------------------------------------------------------------------------

CONVERT = "convert"        # llama.cpp c392e5094 (2025-02-20) convert_hf_to_gguf.py
CONVERT2026 = "convert2026"  # ngxson/llama.cpp 3f545bec (2026-08-22): only what the 2025 one cannot convert
CONVERT2026_PRE = "convert2026_pre"  # the same, tokenizer.ggml.pre forced (tokenizer.json fixtures)
QUANTIZE = "quantize"      # llama.cpp c392e5094 llama-quantize --allow-requantize
QUANTIZE2026 = "quantize2026"  # the fork's llama-quantize: only for what c392e5094's does not know (gemma4)
QUANTIZERS = (QUANTIZE, QUANTIZE2026)

# file: (source, tool, argument): convert*: the --outtype; convert2026_pre: (pre, outtype);
# quantize*: (input file, type)
GGUF_FILES = {
    "llama2-f32.gguf": ("llama2-f32", CONVERT, "f32"),
    "llama2-f16.gguf": ("llama2-f16", CONVERT, "f16"),
    "llama2-bf16.gguf": ("llama2-bf16", CONVERT, "bf16"),
    "llama2-q8_0.gguf": ("llama2-f32", QUANTIZE, ("llama2-f32.gguf", "Q8_0")),
    "llama2-Q4_1.gguf": ("llama2-f32", QUANTIZE, ("llama2-f32.gguf", "Q4_1")),
    "llama2-Q5_0.gguf": ("llama2-f32", QUANTIZE, ("llama2-f32.gguf", "Q5_0")),
    "llama2-Q5_1.gguf": ("llama2-f32", QUANTIZE, ("llama2-f32.gguf", "Q5_1")),
    "llama3-bf16.gguf": ("llama3", CONVERT, "bf16"),
    "llama256-Q4_0.gguf": ("llama256", QUANTIZE, ("llama256-f32.gguf", "Q4_0")),
    "llama256-Q4_K_M.gguf": ("llama256", QUANTIZE, ("llama256-f32.gguf", "Q4_K_M")),
    "llama256-Q5_K_S.gguf": ("llama256", QUANTIZE, ("llama256-f32.gguf", "Q5_K_S")),
    "qwen2-bf16.gguf": ("qwen2", CONVERT, "bf16"),
    "qwen2-q8_0.gguf": ("qwen2", QUANTIZE, ("qwen2-bf16.gguf", "Q8_0")),
    "qwen2-Q4_0.gguf": ("qwen2", QUANTIZE, ("qwen2-bf16.gguf", "Q4_0")),
    "qwen3-bf16.gguf": ("qwen3", CONVERT2026, "bf16"),
    "gemma-bf16.gguf": ("gemma", CONVERT, "bf16"),
    "gemma2-bf16.gguf": ("gemma2", CONVERT, "bf16"),
    "gemma3-bf16.gguf": ("gemma3", CONVERT2026, "bf16"),
    "smollm3-bf16.gguf": ("smollm3", CONVERT2026, "bf16"),
    "phi3-bf16.gguf": ("phi3", CONVERT, "bf16"),
    "phi4mini-bf16.gguf": ("phi4mini", CONVERT2026, "bf16"),
    "mistral-bf16.gguf": ("mistral", CONVERT, "bf16"),
    "mixtral-bf16.gguf": ("mixtral", CONVERT, "bf16"),
    "mixtral-q8_0.gguf": ("mixtral", QUANTIZE, ("mixtral-bf16.gguf", "Q8_0")),
    "qwen3moe-bf16.gguf": ("qwen3moe", CONVERT2026_PRE, ("qwen2", "bf16")),
    "gemma4-bf16.gguf": ("gemma4", CONVERT2026, "bf16"),
    "gemma4-moe-bf16.gguf": ("gemma4-moe", CONVERT2026, "bf16"),
    "gemma4-31b-Q4_0.gguf": ("gemma4-31b", QUANTIZE2026, ("gemma4-31b-bf16.gguf", "Q4_0")),
}
# llama-quantize's Q4_K_M of each family's bf16 file (on these narrow rows it falls back to Q5_0,
# Q5_1 and Q8_0, and keeps F16 / BF16 where a row is not even one 32-weight block: realistic for
# small models): c392e5094's tool where it knows the architecture, the fork's otherwise. Two are
# left out for size (Q4_K_M_LEFT_OUT: mistral is llama3's architecture); tests/test_gguf_q4_k_m.py makes
# those itself where the tool is installed.
Q4_K_M_FAMILIES = ["gemma", "gemma2", "gemma3", "gemma4", "gemma4-moe", "llama3", "mistral", "mixtral", "phi3",
                   "phi4mini", "qwen3", "qwen3moe", "smollm3"]
Q4_K_M_LEFT_OUT = {"qwen3moe", "mistral"}
FORK_ONLY_ARCHS = {"gemma3", "gemma4", "gemma4-moe", "qwen3", "qwen3moe", "smollm3"}  # unknown to c392e5094


def q4_k_m_entry(family):
    """GGUF_FILES' entry of family's Q4_K_M file, made from its bf16 file."""
    source = GGUF_FILES[f"{family}-bf16.gguf"][0]
    tool = QUANTIZE2026 if family in FORK_ONLY_ARCHS else QUANTIZE
    return source, tool, (f"{family}-bf16.gguf", "Q4_K_M")


GGUF_FILES.update({f"{f}-Q4_K_M.gguf": q4_k_m_entry(f) for f in Q4_K_M_FAMILIES if f not in Q4_K_M_LEFT_OUT})
NOT_KEPT = {f"{f}-Q4_K_M.gguf": q4_k_m_entry(f) for f in sorted(Q4_K_M_LEFT_OUT)}

# intermediate files the quantized ones are made from, not kept (too big or kept under another name)
INTERMEDIATE = {"llama256-f32.gguf": ("llama256", CONVERT, "f32"),
                "gemma4-31b-bf16.gguf": ("gemma4-31b", CONVERT2026, "bf16")}

TOOLS = {  # defaults: where they were on the machine that made the files
    CONVERT: os.environ.get("CONVERT", "/work/peers/tools/convert.sh"),
    CONVERT2026: os.environ.get("CONVERT2026", "/work/peers/tools/convert2026.sh"),
    CONVERT2026_PRE: os.environ.get("CONVERT2026_PRE", "/work/peers/tools/convert2026_pre.sh"),
    QUANTIZE: os.environ.get("QUANTIZE", "/work/peers/llama.cpp/build/bin/llama-quantize"),
    QUANTIZE2026: os.environ.get("QUANTIZE2026", "/work/peers/llama.cpp-2026/build/bin/llama-quantize"),
}


def command(file, out_dir, hf_root):
    """The command line making `file` in out_dir (HF directories under hf_root)."""
    source, tool, arg = {**GGUF_FILES, **INTERMEDIATE}[file]
    if tool in QUANTIZERS:
        return [TOOLS[tool], "--allow-requantize", str(Path(out_dir) / arg[0]), str(Path(out_dir) / file), arg[1]]
    if tool == CONVERT2026_PRE:
        return [TOOLS[tool], arg[0], str(Path(hf_root) / source), arg[1], str(Path(out_dir) / file)]
    return [TOOLS[tool], str(Path(hf_root) / source), arg, str(Path(out_dir) / file)]


def make(out_dir, files=None, hf_root=None):
    """Write the HF directories and run the tools: the files (default all) into out_dir."""
    out_dir = Path(out_dir)
    hf_root = Path(hf_root or out_dir / "hf")
    files = list(files or GGUF_FILES)
    todo = []
    for f in files:
        if GGUF_FILES[f][1] in QUANTIZERS and GGUF_FILES[f][2][0] not in todo:
            todo.append(GGUF_FILES[f][2][0])
        if f not in todo:
            todo.append(f)
    for f in todo:
        source = {**GGUF_FILES, **INTERMEDIATE}[f][0]
        if not (hf_root / source / "config.json").exists():
            hf_dir(source, hf_root / source)
        if (out_dir / f).exists() and f not in files:
            continue
        cmd = command(f, out_dir, hf_root)
        print("+", " ".join(cmd), flush=True)
        with open(out_dir / (f + ".log"), "w") as log:
            subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT, env=tool_env(cmd[0]))


def tool_env(tool):
    """The environment a tool runs in: a llama-quantize build loads the shared libraries beside
    it first (LD_LIBRARY_PATH), not another build's (the two quantize tools are two builds)."""
    env = dict(os.environ)
    if Path(tool).name == "llama-quantize":
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(Path(tool).parent), env.get("LD_LIBRARY_PATH")) if p)
    return env


# ---------------------------------------------------------------------------
# llama.cpp's own dequantization of the block fixtures (dequantized_sha256.json)
# ---------------------------------------------------------------------------

# the fixtures with 4-bit, 5-bit and K-quant blocks: tests/test_gguf_blocks.py compares what export.py
# widens them to with llama.cpp's dequantization, recorded as a sha256 per tensor
DEQUANTIZED = ["llama2-Q4_1.gguf", "llama2-Q5_0.gguf", "llama2-Q5_1.gguf", "llama256-Q4_0.gguf",
               "llama256-Q4_K_M.gguf", "llama256-Q5_K_S.gguf"]
GGUF_PY = os.environ.get("GGUF_PY", "/work/peers/llama.cpp/gguf-py")  # llama.cpp's own GGUF reader


def dequantized_sha256(out_dir, data_dir=GGUF_DATA):
    """{file: {tensor: sha256 of its float32 bytes}} of each DEQUANTIZED file's non-F32 tensors, as
    `llama-quantize --allow-requantize FILE OUT_DIR/FILE-F32.gguf F32` (its dequantize_row_*) writes
    them, read with llama.cpp's gguf-py (GGUFReader)."""
    sys.path.insert(0, GGUF_PY)
    from gguf import GGUFReader
    out = {}
    for f in DEQUANTIZED:
        wide = Path(out_dir) / f.replace(".gguf", "-F32.gguf")
        cmd = [TOOLS[QUANTIZE], "--allow-requantize", str(Path(data_dir) / f), str(wide), "F32"]
        print("+", " ".join(cmd), file=sys.stderr, flush=True)
        with open(str(wide) + ".log", "w") as log:
            subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT)
        blocks = {t.name for t in GGUFReader(Path(data_dir) / f).tensors if t.tensor_type != 0}
        out[f] = {t.name: hashlib.sha256(t.data.astype("<f4").tobytes()).hexdigest()
                  for t in GGUFReader(wide).tensors if t.name in blocks}
    return out


if __name__ == "__main__":
    if sys.argv[1:2] == ["--dequantized"]:  # gguf_fixtures.py --dequantized OUT_DIR: the JSON on stdout
        print(json.dumps(dequantized_sha256(sys.argv[2]), indent=1, sort_keys=True))
    else:
        make(sys.argv[1], sys.argv[2:] or None)
