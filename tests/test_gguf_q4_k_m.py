"""A Q4_K_M GGUF of each family converts and runs: llama-quantize's Q4_K_M of each family's bf16
fixture in tests/data/gguf/ (gguf_fixtures.Q4_K_M_FAMILIES; README there).

On these narrow models llama-quantize's Q4_K_M falls back, row width by row width, to Q5_0, Q5_1
and Q8_0 (Q4_K and Q6_K need rows of 256), and keeps F16 or BF16 where a row is not one 32-weight
block: the mixes of a real small model's Q4_K_M. Each file, converted by export.py (every piece
in its stored type, a type table), must compute what the float32 GGUF of its weights dequantized
by tests/block_reference.py computes (the same metadata, written by the tests' GGUF writer),
byte for byte in generate and ppl: the blocks are read exactly, whatever the family's layout.

Two families' files are not stored (gguf_fixtures.Q4_K_M_LEFT_OUT, for size): they are made here
from the stored bf16 file when llama-quantize is installed where gguf_fixtures.TOOLS says, and
skipped otherwise (CI has no llama.cpp).
"""
import subprocess
from pathlib import Path

import pytest

import gguf_fixtures as GF
from conftest import ROOT, export, load_export
from test_block_types import outputs, write_dequantized_gguf

DATA = ROOT / "tests" / "data" / "gguf"
BLOCK_TYPES = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"}


def q4_k_m_file(family, tmp_path):
    """The family's Q4_K_M GGUF: stored, or (a family left out) made now from its bf16 file."""
    name = f"{family}-Q4_K_M.gguf"
    if name in GF.GGUF_FILES:
        return DATA / name
    _, tool, (source, kind) = GF.NOT_KEPT[name]
    binary = GF.TOOLS[tool]
    if not Path(binary).exists():
        pytest.skip(f"{name} is not stored (size) and {binary} is not installed")
    cmd = [binary, "--allow-requantize", str(DATA / source), str(tmp_path / name), kind]
    subprocess.run(cmd, check=True, capture_output=True, env=GF.tool_env(binary))
    return tmp_path / name


def test_every_family_with_a_bf16_fixture_has_a_q4_k_m_file_or_is_left_out_by_name():
    # llama2 and qwen2 have their 4-bit files already (llama256-Q4_K_M, llama2-Q4_1 / Q5_0 / Q5_1, qwen2-Q4_0)
    families = {p.name.removesuffix("-bf16.gguf") for p in DATA.glob("*-bf16.gguf")} - {"llama2", "qwen2"}
    assert set(GF.Q4_K_M_FAMILIES) == families
    stored = {p.name.removesuffix("-Q4_K_M.gguf") for p in DATA.glob("*-Q4_K_M.gguf")} - {"llama256"}
    assert stored == families - GF.Q4_K_M_LEFT_OUT


@pytest.mark.parametrize("family", GF.Q4_K_M_FAMILIES)
def test_q4_k_m_file_computes_what_the_float32_gguf_of_its_dequantized_weights_computes(family, tmp_path):
    src = q4_k_m_file(family, tmp_path)
    g = load_export().read_gguf_file(str(src))
    kinds = {t.type_name for t in g.tensors.values()}
    assert kinds & BLOCK_TYPES, kinds  # 4- or 5-bit blocks beside Q8_0 and F32
    narrow, wide = tmp_path / "narrow.bin", tmp_path / "wide.bin"
    export(src, narrow)
    export(write_dequantized_gguf(src, tmp_path / "wide.gguf"), wide)
    assert narrow.stat().st_size < wide.stat().st_size / 2  # the blocks were kept, not widened
    for mode in ("generate-greedy", "ppl"):
        assert outputs(None, narrow, 1, mode, tmp_path) == outputs(None, wide, 1, mode, tmp_path), f"{family} {mode}"
