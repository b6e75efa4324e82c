"""run.c against karpathy/llama2.c's own output (../shared/golden), byte for byte."""
import json

import pytest

from conftest import GOLDEN, STORIES, STORIES_V1, TOK512, run

CASES = json.loads((GOLDEN / "stories260K_generate.json").read_text())


def golden_args(case):
    args = ["-z", TOK512, "-t", case["temperature"], "--top-p", case["topp"], "-s", case["seed"],
            "-n", case["steps"]]
    if case["prompt"]:
        args += ["-p", case["prompt"]]
    return args


@pytest.mark.parametrize("model", [STORIES, STORIES_V1], ids=["legacy", "v1"])
@pytest.mark.parametrize("case", CASES, ids=[f"{i}-T{c['temperature']}-{c['prompt'][:12]}" for i, c in enumerate(CASES)])
def test_generation_matches_llama2c_byte_for_byte(model, case):
    r = run(model, *golden_args(case))
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode("utf-8", "replace") == case["stdout"]


def test_timing_goes_to_stderr_not_stdout():
    r = run(STORIES, "-z", TOK512, "-t", 0, "-n", 20, "-p", "Once")
    assert b"tok/s" in r.stderr and b"tok/s" not in r.stdout


def test_i_is_an_alias_for_p():
    a = run(STORIES, "-z", TOK512, "-t", 0, "-n", 30, "-p", "Tim had")
    b = run(STORIES, "-z", TOK512, "-t", 0, "-n", 30, "-i", "Tim had")
    assert a.stdout == b.stdout and a.returncode == 0


def test_prompt_longer_than_steps_is_cut_like_llama2c():
    # llama2.c prints one prompt token per step and samples nothing
    r = run(STORIES, "-z", TOK512, "-t", 0, "-n", 3, "-p", "Once upon a time there was")
    assert r.returncode == 0
    assert r.stdout == b"Once upon a\n"


@pytest.fixture(scope="module")
def stories_rope(tmp_path_factory):
    """stories260K upgraded to the ROPE format by export.py."""
    import subprocess
    import sys
    from conftest import ROOT
    out = tmp_path_factory.mktemp("rope") / "stories260K_rope.bin"
    r = subprocess.run([sys.executable, str(ROOT / "export.py"), str(STORIES), str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return out


@pytest.mark.parametrize("case", CASES, ids=[f"{i}-T{c['temperature']}" for i, c in enumerate(CASES)])
def test_generation_in_rope_format_matches_llama2c(stories_rope, case):
    r = run(stories_rope, *golden_args(case))
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode("utf-8", "replace") == case["stdout"]


def test_rope_legacy_rope_round_trip_is_byte_identical(stories_rope, tmp_path):
    import subprocess
    import sys
    from conftest import ROOT
    legacy, again = tmp_path / "legacy.bin", tmp_path / "again.bin"
    for src, dst, flags in ((stories_rope, legacy, ["--legacy"]), (legacy, again, [])):
        r = subprocess.run([sys.executable, str(ROOT / "export.py"), *flags, str(src), str(dst)], capture_output=True)
        assert r.returncode == 0, r.stderr
    assert again.read_bytes() == stories_rope.read_bytes()
