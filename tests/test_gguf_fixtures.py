"""tests/data/gguf/: every GGUF file there is listed in its README with its sha256, and the
Hugging Face directory each was converted from is what tests/gguf_fixtures.py recreates
(hf_sha256.json). Fast: no llama.cpp, no conversion; the directories are tiny."""
import hashlib
import json
import re

import pytest

import gguf_fixtures as G
from conftest import ROOT

DATA = ROOT / "tests" / "data" / "gguf"
README = DATA / "README.md"


def readme_sha256():
    return {name: digest for digest, name in re.findall(r"^([0-9a-f]{64})  (\S+)$", README.read_text(), re.M)}


def recorded_hf_sha256():
    return json.loads((DATA / "hf_sha256.json").read_text())


def test_every_gguf_file_is_in_the_readme_with_its_sha256():
    listed = readme_sha256()
    files = sorted(p.name for p in DATA.glob("*.gguf"))
    assert files == sorted(listed), "tests/data/gguf/*.gguf and the README's sha256 lines differ"
    for name in files:
        assert hashlib.sha256((DATA / name).read_bytes()).hexdigest() == listed[name], name


def test_the_fixture_table_lists_exactly_the_shipped_files():
    # tiny.gguf is not a model: llama.cpp's gguf-py wrote it for the container reader's tests
    assert sorted(G.GGUF_FILES) == sorted(p.name for p in DATA.glob("*.gguf") if p.name != "tiny.gguf")
    assert sorted(G.SOURCES) == sorted(recorded_hf_sha256())
    assert {source for source, _, _ in G.GGUF_FILES.values()} <= set(G.SOURCES)


@pytest.mark.parametrize("source", sorted(G.SOURCES))
def test_the_recreated_source_is_the_one_converted(tmp_path, source):
    d = G.hf_dir(source, tmp_path / source)
    assert G.hf_sha256(d) == recorded_hf_sha256()[source]


def test_the_tokenizer_files_are_the_ones_the_readme_records(tmp_path):
    text = README.read_text()
    model = G.make_tok512_model(tmp_path / "tokenizer.model")
    assert hashlib.sha256(model.read_bytes()).hexdigest() in text
    for make in (G.make_tok512_bpe_json, G.make_tok512_hf_json):
        d = tmp_path / make.__name__
        d.mkdir()
        make(d)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            assert hashlib.sha256((d / name).read_bytes()).hexdigest() in text, (make.__name__, name)


def test_tok512_model_encodes_like_tok512(tmp_path):
    spm = pytest.importorskip("sentencepiece")
    sp = spm.SentencePieceProcessor(model_file=str(G.make_tok512_model(tmp_path / "tokenizer.model")))
    assert (sp.vocab_size(), sp.unk_id(), sp.bos_id(), sp.eos_id()) == (512, 0, 1, 2)
    assert [sp.id_to_piece(i) for i in (0, 1, 2, 3, 259)] == ["<unk>", "<s>", "</s>", "<0x00>", "\u2581t"]
    # the ids `run -z models/tok512.bin -m tokenize` gives (without its BOS)
    assert sp.encode("Once upon a time, there was a little girl named Lily.") == [
        403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426]
    assert sp.encode("Hello  world\n\t\u00fc\u00f1 123 \u2122[]") == [
        346, 306, 414, 410, 263, 304, 341, 13, 12, 198, 191, 493, 410, 475, 479, 472, 410, 507, 508, 509]
