"""export.py reads back every file it writes (issue 50): a ROPE file of any family, re-exported with
--dtype T, is byte for byte the file that exporting the Hugging Face checkpoint with --dtype T
writes, and ./run computes with it what it computes with that file.

The reference is the direct export: the same program, reached by another input path (config.json
and safetensors instead of the ROPE header, its tables and sections), which the family tests
(test_families.py, test_gemma4_export.py, test_moe_export.py) check against the NumPy references.
Every family's small checkpoint (tests/family_fixtures.py, gemma4_fixtures.py, moe_fixtures.py:
the per-layer tables, the second RoPE setting, longrope's factors, Gemma 4's records and extra
tensors, the experts), stored in bf16 with a tokenizer beside it (the tokenizer section), exported
as bf16, then re-exported as f32, f16, q8_0 and bf16 itself; a q8_0 file re-exported as q8_0. A
type a model cannot take (q8_0 with rows that are not whole blocks) is refused alike on both paths.

Run with: /usr/bin/python3 -m pytest tests/test_export_round_trip.py
"""
import subprocess

import pytest

import family_fixtures
import gemma4_fixtures
import moe_fixtures
from conftest import TOK512, run
from test_export_property import call_export
from test_export_tokenizer import sentencepiece_json, write_tokenizer

FAMILIES = ["Qwen2.5-0.5B", "Qwen3-0.6B", "SmolLM3-3B", "Mistral-7B-v0.1", "Gemma-2B", "Gemma-2-2B", "Gemma-3-1B",
            "gemma-3-4b-text", "Phi-3-mini-4k", "Phi-4-mini"]
GEMMA4 = ["gemma-4-E2B-it", "gemma-4-E4B", "gemma-4-31B"]
EXPERTS = ["Qwen3-30B-A3B", "Mixtral-8x7B-v0.1", "gemma-4-26B-A4B"]
TEXT = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park."


def write_source(directory, name):
    """model `name`'s small checkpoint in bf16, with a tokenizer (the file's tokenizer section)."""
    if name in FAMILIES:
        family_fixtures.write_checkpoint(directory, name, "BF16", seed=7)
    elif name in GEMMA4:
        gemma4_fixtures.write_checkpoint(directory, name, "BF16", seed=7)
    elif name.startswith("gemma-4"):
        moe_fixtures.write_checkpoint_gemma4(directory, name, "BF16", seed=7)
    else:
        moe_fixtures.write_checkpoint(directory, name, "BF16", seed=7)
    write_tokenizer(directory, sentencepiece_json(), {"bos_token": "<s>", "eos_token": "</s>"})


def export(*args, check=True):
    """export.py's main() in this process (no interpreter start per export), as a CompletedProcess."""
    code, out, err = call_export(*args)
    assert code == 0 or not check, err
    return subprocess.CompletedProcess(args, code, out, err)


def ppl(model):
    r = run(model, "-z", TOK512, "-m", "ppl", "-p", TEXT)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize("name", FAMILIES + GEMMA4 + EXPERTS)
def test_a_re_exported_file_is_the_direct_export_of_its_type(tmp_path, name):
    source = tmp_path / name
    write_source(source, name)
    first = tmp_path / "first.bin"
    export(source, first)
    assert first.read_bytes()[4] == 2 and first.read_bytes()[88] == 1  # version 2, bf16
    for dtype in ("bf16", "f32", "f16", "q8_0"):
        direct, again = tmp_path / f"direct-{dtype}.bin", tmp_path / f"again-{dtype}.bin"
        want = export(source, direct, "--dtype", dtype, check=False)
        got = export(first, again, "--dtype", dtype, check=False)
        if want.returncode:  # q8_0 for a model whose rows are not whole blocks: refused alike
            assert dtype == "q8_0" and got.returncode == want.returncode == 1, (got.stderr, want.stderr)
            assert got.stderr == want.stderr and not again.exists()
            continue
        assert got.returncode == 0, got.stderr
        assert again.read_bytes() == direct.read_bytes(), dtype
        assert ppl(again) == ppl(direct)
        if dtype == "q8_0":  # a q8_0 file read back keeps its blocks
            export(again, tmp_path / "kept.bin")
            assert (tmp_path / "kept.bin").read_bytes() == direct.read_bytes()
