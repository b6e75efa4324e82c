"""Memory follows the context in use, not the header's seq_len.

The context in use is -c N, else the file's seq_len capped at 4096 positions (the
start-up line says so). It sizes the KV cache, the attention scores and the RoPE
tables; before allocating them run compares what they need with the machine's memory
(physical, or a cgroup's limit) and refuses a context that does not fit: one line
naming the size needed and the largest -c that fits, exit 2 when -c asked for it (a
bad command line, as -c over the 64 GiB bound always was), 1 when the file's own
context does not fit. -m rope and -m tokenize run no model and allocate no run state.

The models are random ROPE files (tests/ropefile.py) with real models' context
lengths and tiny widths, so that the run state, not the weights, is what is big.
"""
import os
import re
import shutil
import subprocess
import tempfile

import pytest

import family_fixtures
from conftest import LONG_TEXT, RUN_BIN, RUN_PREFIX, SANITIZED, TOK512, export, run, tokens_of
from ropefile import write_random_checkpoint

ERROR = "run: error:"
STARTUP = re.compile(r"^run: .+ \(ROPE v\d+\): dim \d+")
PREFILL_BLOCK = 128  # run.c's block of tokens: the scores hold PREFILL_BLOCK rows of n_heads x context

# Llama 3.2 1B's shape (16 layers, 32 query heads, 8 key/value heads, 131,072 positions,
# theta 500000, llama3 x32 from 8192) with heads of 4 dimensions and a 512-token vocabulary
LLAMA32 = dict(dim=128, hidden_dim=32, n_layers=16, n_heads=32, n_kv_heads=8, vocab_size=512, seq_len=131072,
               rope_theta=500000.0, rope_scaling=4, rope_factor=32.0, rope_original_len=8192)
# 1024 layers of one 32-dimension head: 256 KiB of KV cache per position, 256 GiB for the
# header's 2^20 positions (four times run's 64 GiB bound), in a 20 MB file
DEEP = dict(dim=32, hidden_dim=8, n_layers=1024, n_heads=1, n_kv_heads=1, vocab_size=512, seq_len=2**20)


def kv_bytes_per_position(shape):
    return 2 * shape["n_layers"] * shape["n_kv_heads"] * (shape["dim"] // shape["n_heads"]) * 4


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("memory")
    return {"llama32": write_random_checkpoint(d / "llama32_shape.bin", seed=3, **LLAMA32),
            "deep": write_random_checkpoint(d / "deep.bin", seed=4, **DEEP)}


# The child's peak RSS from wait4 counts what the process held before exec too: a child
# forked by this pytest process starts with pytest's pages (hundreds of MiB once other test
# files have loaded large arrays). So a fresh, small Python forks run and reports its peak.
SPAWN = """
import os, resource, sys
limit, out = int(sys.argv[1]), sys.argv[2]
pid = os.fork()
if pid == 0:
    if limit:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    os.execv(sys.argv[3], sys.argv[3:])
_, status, usage = os.wait4(pid, 0)
with open(out, "w") as f:
    f.write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status) & 255)
"""


def run_limited(*args, address_space=None, timeout=120):
    """Runs run with args; returns (CompletedProcess-like, peak RSS in bytes) measured on this child
    alone (os.wait4 in a small helper process), under an address-space limit in bytes when given."""
    cmd = RUN_PREFIX + [RUN_BIN] + [str(a) for a in args]
    with tempfile.NamedTemporaryFile("r") as peak:
        r = subprocess.run(["/usr/bin/python3", "-S", "-c", SPAWN, str(address_space or 0), peak.name,
                            shutil.which(cmd[0]) or cmd[0], *cmd[1:]],
                           capture_output=True, stdin=subprocess.DEVNULL, timeout=timeout,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))
        kilobytes = peak.read()
    result = subprocess.CompletedProcess(cmd, r.returncode if r.returncode < 128 else r.returncode - 256,
                                         r.stdout, r.stderr)
    return result, int(kilobytes) * 1024  # Linux: kilobytes


def error_line(r, code):
    """The one error line of a failed run: alone on stderr for a usage error (exit 2), else
    after the start-up line at most."""
    err = r.stderr.decode()
    assert r.returncode == code, err
    lines = err.splitlines()
    errors = [line for line in lines if line.startswith(ERROR)]
    assert len(errors) == 1, err
    assert all(STARTUP.match(line) for line in lines if not line.startswith(ERROR)), err
    assert len(lines) <= (1 if code == 2 else 2), err
    if code == 2:
        assert r.stdout == b"", r.stdout
    return errors[0]


def startup_line(r):
    lines = [line for line in r.stderr.decode().splitlines() if STARTUP.match(line)]
    assert len(lines) == 1, r.stderr.decode()
    return lines[0]


def test_131072_position_model_starts_in_little_memory_with_the_default_context(models):
    # The old runner sized the scores and the RoPE tables by the header's 131,072 positions and
    # wrote them at start-up: 128 x 32 x 131072 floats of scores alone are 2 GiB resident.
    # Capped at 4096 positions they are 64 MiB, the KV cache 16 MiB (of which -n 8 touches 8 positions).
    r, peak = run_limited(models["llama32"], "-z", TOK512, "-t", "0", "-n", "8", "-p", "Once")
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout.strip()
    assert peak < 300 << 20, f"peak RSS {peak >> 20} MiB"
    line = startup_line(r)
    assert "context 4096 (the file's 131072, capped: -c 131072 for all)" in line, line


@pytest.mark.skipif(SANITIZED, reason="ASan's allocator maps and counts large blocks its own way: resident memory is not the program's")
def test_memory_follows_the_context_given_with_c(models):
    # the scores grow by 128 rows x 32 heads x 4 bytes = 16 KiB per position: -c 16384 adds 192 MiB
    # resident over -c 4096 (they are cleared at start-up), which the peaks must show; the KV cache
    # (4 KiB a position) adds up to 48 MiB more where its 2 MB pages span positions -n never reaches
    small, peak_small = run_limited(models["llama32"], "-z", TOK512, "-t", "0", "-n", "4", "-p", "Once", "-c", "4096")
    large, peak_large = run_limited(models["llama32"], "-z", TOK512, "-t", "0", "-n", "4", "-p", "Once",
                                    "-c", "16384")
    assert small.returncode == 0 and large.returncode == 0, (small.stderr, large.stderr)
    assert small.stdout == large.stdout  # greedy, 4 positions: the context does not change them
    assert "context 16384 (-c; the file's 131072)" in startup_line(large)
    grown, positions = peak_large - peak_small, 16384 - 4096
    scores = PREFILL_BLOCK * LLAMA32["n_heads"] * positions * 4
    cache = kv_bytes_per_position(LLAMA32) * positions
    # at least half the scores: pages the kernel backs with its shared zero page (read before
    # written) do not count as resident, and how many it does so varies with the machine's load
    assert 0.5 * scores < grown < 1.1 * (scores + cache), f"grew {grown >> 20} MiB, expected {scores >> 20} to " \
                                                          f"{(scores + cache) >> 20}"


def test_c_rescues_a_file_whose_seq_len_is_over_the_64_gib_bound(models):
    # 2^20 positions x 256 KiB: the header's seq_len needs a 256 GiB KV cache; 64 positions need 16 MiB
    assert kv_bytes_per_position(DEEP) * DEEP["seq_len"] > 64 << 30
    r, peak = run_limited(models["deep"], "-z", TOK512, "-t", "0", "-n", "6", "-p", "Once", "-c", "64")
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout.strip()
    assert "context 64 (-c; the file's 1048576)" in startup_line(r)
    assert peak < 200 << 20, f"peak RSS {peak >> 20} MiB"


def largest_c_in(line):
    m = re.search(r"the largest -c (?:that fits|under it) is (\d+)", line)
    assert m, line
    return int(m.group(1))


def test_c_beyond_the_machines_memory_is_refused_with_one_line(models):
    # 2^20 positions of the deep model need 256 GiB of KV cache: more than this machine's memory
    # (or, on a machine with more, over run's 64 GiB bound); refused before anything is allocated,
    # as a bad command line
    r, _ = run_limited(models["deep"], "-z", TOK512, "-t", "0", "-n", "4", "-p", "Once", "-c", str(2**20),
                       address_space=None if SANITIZED else 256 << 20)
    line = error_line(r, 2)
    assert "-c 1048576: a context of 1048576 positions" in line, line
    assert "out of memory" not in line
    m = re.search(r"more than the (?:physical memory|cgroup memory limit) of ([\d.]+) GiB", line)
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if m:
        needed = re.search(r"needs ([\d.]+) GiB of memory \(KV cache ([\d.]+) GiB\)", line)
        assert needed, line
        kv = kv_bytes_per_position(DEEP) * 2**20
        assert abs(float(needed.group(2)) - kv / 2**30) < 0.01, line
        assert float(needed.group(1)) > float(needed.group(2))  # the scores and tables come on top
        memory = float(m.group(1)) * 2**30
        assert memory <= physical * 1.001, line  # a cgroup limit only ever lowers it
        # the largest context that fits: about the memory over the bytes per position
        per_position = kv_bytes_per_position(DEEP) + 4 * (PREFILL_BLOCK * DEEP["n_heads"] + 2 * 16)
        assert abs(largest_c_in(line) - memory / per_position) < 0.01 * 2**30 / per_position + 2, line
    else:
        assert physical > 64 << 30, line  # only a machine with more memory than the bound gets here
        assert "over run's bound of 64 GiB" in line, line
        assert largest_c_in(line) == (64 << 30) // kv_bytes_per_position(DEEP)


@pytest.mark.skipif(SANITIZED, reason="sanitizers reserve terabytes of address space: no RLIMIT_AS")
def test_largest_c_that_fits_is_the_exact_boundary(models):
    # -c N (the largest the refusal names) passes the check and fails only where the allocation does,
    # here under a 256 MiB address-space limit; -c N + 1 is refused by the check itself
    r, _ = run_limited(models["deep"], "-m", "ppl", "-z", TOK512, "-p", "Once", "-c", str(2**20))
    n = largest_c_in(error_line(r, 2))
    if n >= 2**20 - 1:
        pytest.skip("this machine holds 2^20 positions of the deep model")
    fits, _ = run_limited(models["deep"], "-m", "ppl", "-z", TOK512, "-p", "Once", "-c", str(n),
                          address_space=256 << 20)
    assert "out of memory allocating the run state" in error_line(fits, 1)
    over, _ = run_limited(models["deep"], "-m", "ppl", "-z", TOK512, "-p", "Once", "-c", str(n + 1),
                          address_space=256 << 20)
    line = error_line(over, 2)
    assert f"a context of {n + 1} positions" in line and largest_c_in(line) == n, line


@pytest.mark.parametrize("mode", ["rope", "tokenize"])
@pytest.mark.parametrize("context", [None, 2**20], ids=["default-context", "c-2-20"])
def test_rope_and_tokenize_allocate_no_kv_cache(models, mode, context):
    # neither runs the model: with the context that needs 256 GiB they still answer, in little memory
    # (under a 256 MiB address-space limit where the build allows one)
    args = [models["deep"], "-z", TOK512, "-m", mode, "-p", "Once upon a time"]
    if context:
        args += ["-c", str(context)]
    r, peak = run_limited(*args, address_space=None if SANITIZED else 256 << 20)
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout.strip()
    assert ERROR not in r.stderr.decode()
    assert peak < 200 << 20, f"peak RSS {peak >> 20} MiB"
    if mode == "tokenize":
        assert r.stdout == run(models["deep"], "-z", TOK512, "-m", "tokenize", "-p", "Once upon a time", "-c",
                               "16").stdout


# Mistral's shape where the KV cache is what is big: 16 layers, every one sliding with a window
# of 64, four key/value heads of 128 (64 KiB of keys and values a position, 512 MiB for 8192
# positions) on a residual stream of 64 (weights of 10 MB)
@pytest.fixture(scope="module")
def mistral_ring(tmp_path_factory):
    d = tmp_path_factory.mktemp("ring") / "mistral"
    config = family_fixtures.shrink("Mistral-7B-v0.1", window=64, max_len=32768)
    config.update(num_hidden_layers=16, num_attention_heads=4, num_key_value_heads=4, head_dim=128, hidden_size=64,
                  intermediate_size=160)
    family_fixtures.write_checkpoint(d, "Mistral-7B-v0.1", config=config, seed=2)
    out = d.parent / "mistral_ring.bin"
    export(d, out)
    return out, 2 * 16 * 4 * 128 * 4  # the file, its KV cache bytes per position without the ring


@pytest.mark.skipif(SANITIZED, reason="ASan's allocator maps and counts large blocks its own way: resident memory is not the program's")
def test_sliding_layers_kv_cache_does_not_grow_with_the_context(tmp_path, mistral_ring):
    # Every layer slides (window 64): its cache is a ring of 64 + 127 positions, so filling a
    # context of 8192 positions (ppl's windows are the context) takes what filling 2048 does.
    # A cache of every position would grow by 6144 x 64 KiB = 384 MiB; the RoPE tables grow
    # by 6144 x 64 pairs x 8 bytes = 3 MiB.
    model, kv_per_position = mistral_ring
    text = (LONG_TEXT + " ") * 22  # over 8192 tokens
    peaks, runs = {}, {}
    for context in (2048, 8192):
        runs[context], peaks[context] = run_limited(model, "-z", TOK512, "-m", "ppl", "-p", text, "-c", context)
        assert runs[context].returncode == 0, runs[context].stderr.decode()
        windows = -(-len(tokens_of(model, text)[1:]) // (context - 1))  # each fills the context
        assert f"windows: {windows}" in runs[context].stdout.decode(), runs[context].stdout
    grown = peaks[8192] - peaks[2048]
    assert grown < 24 << 20, f"grew {grown >> 20} MiB; a cache of every position grows by " \
                             f"{kv_per_position * 6144 >> 20} MiB"
    for r in runs.values():
        assert "KV cache 11.9 MiB (sliding layers: window 64, a ring of 191 positions)" in r.stderr.decode()


def test_a_long_context_of_sliding_layers_is_sized_by_their_rings(mistral_ring):
    # -c 131072: the rings (12 MiB) and the RoPE tables (64 MiB), not a 8 GiB cache of every
    # position, which this machine's check would refuse or run's 64 GiB bound would not
    model, _ = mistral_ring
    r = run(model, "-z", TOK512, "-t", "0", "-n", "4", "-p", "Once", "-c", "131072")
    assert r.returncode == 0, r.stderr
    assert "context 131072 (-c; the file's 32768)" in r.stderr.decode()
    assert "KV cache 11.9 MiB (sliding layers: window 64, a ring of 191 positions)" in r.stderr.decode()
