"""Encoding against SentencePiece's ids (../shared/golden/encode_llama2.json)."""
import json
import subprocess
import sys

import pytest

from conftest import GOLDEN, LLAMA_TOKENIZER, MODELS, ROOT, RUN_BIN, STORIES, TOK512, run

CASES = json.loads((GOLDEN / "encode_llama2.json").read_text(encoding="utf-8"))


def tokenize(model, tokenizer, text):
    r = run(model, "-z", tokenizer, "-m", "tokenize", "-p", text)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.decode("utf-8").splitlines()
    return [int(line.split("\t")[0]) for line in lines], lines


@pytest.mark.parametrize("case", CASES, ids=[repr(c["text"][:20]) for c in CASES])
def test_encode_equals_sentencepiece(case, llama_vocab_model):
    ids, _ = tokenize(llama_vocab_model, LLAMA_TOKENIZER, case["text"])
    assert ids == case["ids"]


def test_tokenize_prints_id_tab_printable_piece(llama_vocab_model):
    ids, lines = tokenize(llama_vocab_model, LLAMA_TOKENIZER, "Hello\tworld\n")
    assert lines[0] == "1\t\\n<s>\\n"          # BOS, its newlines escaped
    assert "13\t<0x0A>" in lines and "12\t<0x09>" in lines
    assert all(ch.isprintable() for line in lines for ch in line.replace("\t", ""))


def test_special_token_text_never_becomes_a_special_token(llama_vocab_model):
    ids, _ = tokenize(llama_vocab_model, LLAMA_TOKENIZER, "a\n<s>\nb\n</s>\n<0x0A>")
    assert ids[0] == 1 and 1 not in ids[1:] and 2 not in ids


def test_malformed_utf8_falls_back_to_bytes():
    # a lone continuation byte and a truncated 3-byte sequence: byte tokens (id = byte + 3)
    r = run(STORIES, "-z", TOK512, "-m", "tokenize", "-p", b"a\x80b\xe6\x97")
    assert r.returncode == 0
    ids = [int(l.split(b"\t")[0]) for l in r.stdout.splitlines()]
    assert 0x80 + 3 in ids and 0xE6 + 3 in ids and 0x97 + 3 in ids


def test_decode_strips_the_space_after_bos_and_prints_bytes():
    # the story model greedily continues "Once"; the output starts without a space
    r = run(STORIES, "-z", TOK512, "-t", 0, "-n", 5, "-p", "Once")
    assert r.stdout.startswith(b"Once upon")


def test_shipped_tokenizer_bin_equals_shared_and_export_output(tmp_path):
    shipped = (ROOT / "tokenizer.bin").read_bytes()
    assert shipped == (MODELS / "tokenizer.bin").read_bytes()
    made = tmp_path / "tokenizer.bin"
    r = subprocess.run([sys.executable, str(ROOT / "export.py"), "--tokenizer", str(MODELS / "tokenizer.model"),
                        "-o", str(made)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert shipped == made.read_bytes()


def test_run_from_repo_root_finds_the_shipped_tokenizer(llama_vocab_model):
    r = subprocess.run([RUN_BIN, str(llama_vocab_model), "-m", "tokenize", "-p", "Hello world"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert [int(line.split("\t")[0]) for line in r.stdout.splitlines()] == [1, 15043, 3186]
