"""The models and goldens the repository ships are the public originals, byte for byte."""
import hashlib
import re

import pytest

from conftest import ROOT

SHARED = ROOT.parent / "shared"
MODEL_FILES = ["stories260K.bin", "stories260K_v1.bin", "tok512.bin", "tokenizer.model", "tokenizer.bin"]
GOLDEN_FILES = ["stories260K_generate.json", "encode_llama2.json"]


def recorded_sha256():
    text = (ROOT / "models" / "README.md").read_text()
    return {name: digest for digest, name in re.findall(r"^([0-9a-f]{64})  (\S+)$", text, re.M)}


@pytest.mark.parametrize("name", MODEL_FILES)
def test_shipped_model_has_the_recorded_sha256(name):
    digest = hashlib.sha256((ROOT / "models" / name).read_bytes()).hexdigest()
    assert recorded_sha256()[name] == digest


@pytest.mark.parametrize("path", [f"models/{n}" for n in MODEL_FILES] + [f"tests/data/{n}" for n in GOLDEN_FILES])
def test_shipped_copy_equals_the_original_in_shared(path):
    original = SHARED / ("golden" if path.startswith("tests/data/") else "models") / path.split("/")[-1]
    if not original.exists():
        pytest.skip("no ../shared beside the repository (a bare clone): the sha256 test covers the models")
    assert (ROOT / path).read_bytes() == original.read_bytes()
