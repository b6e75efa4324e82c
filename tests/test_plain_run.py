"""RUN_PLAIN=1 runs the plain loops of the forward pass and the sampler only (none of "Making it
fast"), for a learner stepping through the equations with a debugger. It must print the same
bytes as the default run: the fast kernels are refinements that compute the same sums."""
import os
import subprocess

import pytest

import family_fixtures
from conftest import LONG_TEXT, RUN_BIN, RUN_PREFIX, STORIES, TOK512, export
from ropefile import as_16bit, random_weights, write_checkpoint

STORY = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
         "One day, she saw a big red ball under a tree. She ran to get it, but a dog took it first. ") * 3


def run_env(plain, *args, threads=1):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    env.pop("RUN_PLAIN", None)
    if plain is not None:
        env["RUN_PLAIN"] = plain
    cmd = RUN_PREFIX + [RUN_BIN] + [str(a) for a in args]
    return subprocess.run(cmd, capture_output=True, env=env, timeout=300, stdin=subprocess.DEVNULL)


def same_output(*args, threads=1, csv=None):
    """The default run and the RUN_PLAIN=1 run of args: stdout (and the CSV file) equal."""
    outputs = []
    for plain in (None, "1"):
        if csv is not None and csv.exists():
            csv.unlink()
        r = run_env(plain, *args, threads=threads)
        assert r.returncode == 0, r.stderr
        outputs.append((r.stdout, csv.read_bytes() if csv is not None else b""))
    assert outputs[0][0], "the run printed nothing"
    assert outputs[0] == outputs[1]
    return outputs[0]


@pytest.fixture(scope="module")
def bf16_model(tmp_path_factory):
    """A random bf16 model wide enough for every fast kernel (rows of 256, several heads, GQA)."""
    dims = dict(dim=256, hidden_dim=640, n_layers=2, n_heads=8, n_kv_heads=2, vocab_size=512, seq_len=512)
    tensors = random_weights(**{k: v for k, v in dims.items() if k != "seq_len"}, shared_classifier=True, seed=7)
    stored, _ = as_16bit(list(tensors), "bf16")
    path = tmp_path_factory.mktemp("plain") / "bf16.bin"
    return write_checkpoint(path, stored, dims, weight_type="bf16")


@pytest.mark.parametrize("threads", [1, 2])
def test_plain_loops_generate_the_same_greedy_story(threads):
    same_output(STORIES, "-z", TOK512, "-t", "0", "-n", "200", "-p", "Once upon a time", threads=threads)


@pytest.mark.parametrize("threads", [1, 2])
def test_plain_loops_generate_the_same_seeded_story(threads):
    same_output(STORIES, "-z", TOK512, "-t", "0.8", "-s", "42", "-n", "200", "-p", "Once upon a time",
                threads=threads)


@pytest.mark.parametrize("threads", [1, 2])
def test_plain_loops_give_the_same_perplexity_csv_on_a_bf16_model(tmp_path, bf16_model, threads):
    # a text of several hundred tokens: prefill runs blocks of many tokens, decode one
    csv = tmp_path / "nll.csv"
    out, table = same_output(bf16_model, "-z", TOK512, "-m", "ppl", "-p", STORY, "--csv", csv,
                             threads=threads, csv=csv)
    assert len(table.splitlines()) > 100


@pytest.mark.parametrize("threads", [1, 2])
def test_plain_loops_generate_the_same_tokens_on_a_bf16_model(bf16_model, threads):
    same_output(bf16_model, "-z", TOK512, "-t", "0.9", "-s", "3", "-n", "300", "-p", STORY[:200],
                threads=threads)


@pytest.fixture(scope="module", params=["Mistral-7B-v0.1", "Gemma-3-1B"])
def ring_model(request, tmp_path_factory):
    """A model whose sliding layers (every layer: Mistral; five of six: Gemma 3) keep their
    cache in a ring of W + 127 positions, W = 13: odd, so that the ring's wrap falls anywhere
    in a prefill block and in the score tiles."""
    d = tmp_path_factory.mktemp("ring") / request.param
    family_fixtures.write_checkpoint(d, request.param, "F32", seed=11, window=13)
    out = d.parent / f"{request.param}.bin"
    export(d, out)
    return out


@pytest.mark.parametrize("threads", [1, 2])
def test_plain_loops_give_the_same_bytes_on_sliding_layers_past_their_ring(tmp_path, ring_model, threads):
    # ppl: 422 tokens in prefill blocks, the rings wrapping inside them; generation: 400
    # positions decoded one at a time after a prompt longer than a ring
    csv = tmp_path / "nll.csv"
    out, table = same_output(ring_model, "-z", TOK512, "-m", "ppl", "-p", LONG_TEXT, "--csv", csv,
                             threads=threads, csv=csv)
    assert len(table.splitlines()) > 400
    same_output(ring_model, "-z", TOK512, "-t", "0.9", "-s", "5", "-n", "400", "-p", LONG_TEXT[:600],
                threads=threads)


def test_run_plain_says_so_under_v_instead_of_the_read_order():
    plain, fast = (run_env(p, STORIES, "-z", TOK512, "-n", "8", "-v").stderr.decode() for p in ("1", "0"))
    assert "run: RUN_PLAIN=1: the plain loops only" in plain and "read order" not in plain
    assert "read order" in fast and "RUN_PLAIN" not in fast


def test_run_plain_other_than_0_or_1_is_a_usage_error():
    r = run_env("yes", STORIES, "-z", TOK512, "-n", "4")
    assert r.returncode == 2
    assert r.stderr.decode().splitlines() == [
        "run: error: RUN_PLAIN expects 1 (plain loops) or 0, got 'yes' (run -h for usage)"]
