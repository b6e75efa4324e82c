"""RUN_PLAIN=1 runs the plain loops of the forward pass and the sampler only (none of "Making it
fast"), for a learner stepping through the equations with a debugger. It must print the same
bytes as the default run: the fast kernels are refinements that compute the same sums. make
debug's build (run-debug: -O0 -g, built with RUN_PLAIN) runs under gdb with a breakpoint on
every function of "Making it fast", none of which may be entered."""
import os
import re
import shutil
import subprocess

import pytest

import family_fixtures
import gemma4_fixtures
import moe_fixtures
import run_c_source
from conftest import LONG_TEXT, ROOT, RUN_BIN, RUN_PREFIX, STORIES, TOK512, export
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


# ----------------------------------------------------------------------------
# make debug's build under gdb: no function of "Making it fast" is entered

# Each function gets a breakpoint that reports its entry and lets the run go on.
GDB_SCRIPT = """
import gdb
gdb.execute("set breakpoint pending off")
class Entered(gdb.Breakpoint):
    def stop(self):
        gdb.write("entered %s\\n" % self.location)
        return False
placed = 0
for name in NAMES:
    try:
        Entered("run.c:" + name)
        placed += 1
    except gdb.error:
        pass  # not in this build: the other target's SIMD, or a static inline never called
gdb.write("breakpoints placed: %d\\n" % placed)
"""


def making_it_fast():
    """The functions run.c's section "Making it fast" defines."""
    return sorted(set(run_c_source.functions_in(run_c_source.run_c_lines(), "// Making it fast")))


@pytest.fixture(scope="module")
def debug_build():
    if RUN_BIN != str(ROOT / "run"):
        pytest.skip("make debug's build is checked with the default build's tests")
    if shutil.which("gdb") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("gdb is not installed")
        pytest.skip("gdb is not installed")
    r = subprocess.run(["make", "-s", "run-debug"], cwd=ROOT, capture_output=True, timeout=600)
    assert r.returncode == 0, r.stderr.decode()
    return ROOT / "run-debug"


def entered_under_gdb(binary, tmp_path, *args):
    """Runs binary args under gdb; returns the "Making it fast" functions it entered."""
    names = making_it_fast()
    script = tmp_path / "breakpoints.py"
    script.write_text(f"NAMES = {names!r}\n" + GDB_SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("RUN_PLAIN", None)  # the build is plain by itself
    r = subprocess.run(["gdb", "-nx", "-batch", "-x", str(script), "-ex", "run", "--args", str(binary),
                        *map(str, args)], capture_output=True, text=True, timeout=600, env=env,
                       stdin=subprocess.DEVNULL)
    placed = re.search(r"breakpoints placed: (\d+)", r.stdout)
    assert placed and int(placed.group(1)) >= len(names) // 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert re.search(r"\[Inferior 1 \(process \d+\) exited normally\]", r.stdout), r.stdout[-2000:] + r.stderr
    return sorted(set(re.findall(r"^entered run\.c:(\w+)", r.stdout, re.M)))


@pytest.fixture(scope="module")
def family_models(tmp_path_factory):
    """Exported fixtures of the families' switches: Gemma 3 (two RoPE settings, sliding rings,
    GeGLU), Gemma 4 E2B (per-layer inputs, KV sharing), Qwen3-MoE and Gemma 4 26B-A4B (experts
    in place of the feed-forward, and beside it)."""
    root = tmp_path_factory.mktemp("debug")
    writers = {"Gemma-3-1B": lambda d: family_fixtures.write_checkpoint(d, "Gemma-3-1B", "F32", seed=11, window=13),
               "gemma-4-E2B-it": lambda d: gemma4_fixtures.write_checkpoint(d, "gemma-4-E2B-it", "BF16"),
               "Qwen3-30B-A3B": lambda d: moe_fixtures.write_checkpoint(d, "Qwen3-30B-A3B", "BF16", seed=3),
               "gemma-4-26B-A4B": lambda d: moe_fixtures.write_checkpoint_gemma4(d, "gemma-4-26B-A4B", "F32",
                                                                                seed=3)}
    models = []
    for name, write in writers.items():
        write(root / name)
        export(root / name, root / f"{name}.bin")
        models.append(root / f"{name}.bin")
    return models


def test_make_debug_prints_the_bytes_of_the_default_build(debug_build):
    args = [STORIES, "-z", TOK512, "-t", "0.8", "-s", "42", "-n", "120", "-p", "Once upon a time"]
    debug, default = (subprocess.run([str(b), *map(str, args)], capture_output=True, timeout=300,
                                     stdin=subprocess.DEVNULL) for b in (debug_build, RUN_BIN))
    assert debug.returncode == 0 and default.returncode == 0, debug.stderr + default.stderr
    assert debug.stdout and debug.stdout == default.stdout


def test_the_plain_loops_enter_no_function_of_making_it_fast(debug_build, tmp_path, bf16_model, family_models):
    # the forward pass in prefill blocks and decoding steps, greedy and sampled, inspect, and
    # every family's switch; gdb reports any entry into "Making it fast"
    runs = [(STORIES, "-z", TOK512, "-t", "0", "-n", "40", "-p", "Once upon a time"),
            (STORIES, "-z", TOK512, "-t", "0.8", "-s", "42", "-n", "24", "-p", STORY[:150]),
            (STORIES, "-z", TOK512, "-m", "inspect", "-p", STORY[:150]),
            (bf16_model, "-z", TOK512, "-m", "ppl", "-p", STORY),
            *[(model, "-z", TOK512, "-t", "0", "-n", "8", "-p", LONG_TEXT[:300]) for model in family_models]]
    entered = {str(args[0].name) + " " + " ".join(map(str, args[3:5])): entered_under_gdb(debug_build, tmp_path, *args)
               for args in runs}
    assert not any(entered.values()), {k: v for k, v in entered.items() if v}
