"""16-bit weights (ROPE version 2: bf16 and f16 matrices and embedding, float32 norms).

run computes in float32 from the widened weights, so a bf16 (or f16) file must give, bit for
bit, what the float32 file holding the same widened values gives: in every mode (generate
greedy and seeded, ppl, inspect's CSV, chat), with 1 and 2 threads, in the build under test
(RUN_BIN: native, ASan, or aarch64 under qemu) and, on x86-64, in an AVX2 build (no AVX-512)
and a plain C build (no SIMD) compiled here. The files are written by tests/ropefile.py from
the format's description, the 16-bit values rounded by NumPy. Then export.py's round trips
(the 16-bit values kept, --dtype f32 their widened values, narrowing only when asked) and
the files run must refuse.
"""
import json
import os
import platform
import shutil
import struct
import subprocess

import numpy as np
import pytest

from conftest import LLAMA_TOKENIZER, ROOT, RUN_BIN, RUN_PREFIX, TOK512, export, run
import hf_fixture
import ropefile

# dim 76 (rows of 9 whole vectors and a 4-float tail), hidden 100 (12 vectors and 4), one
# key/value head for two query heads; a 32000-token classifier, large enough for the decode
# matmul to be split across threads
DIMS = dict(dim=76, hidden_dim=100, n_layers=2, n_heads=2, n_kv_heads=1, vocab_size=32000, seq_len=96)
PROMPT = "Once upon a time, a little fox found a shiny stone by the river"
TEXT = ("The girl ran to the park. She saw a big dog and a small cat. They played all day, and at night "
        "they went home happy. The next morning the sun was warm and the birds sang.")
SANITIZED = "asan" in os.path.basename(RUN_BIN)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """{name: path}: for bf16 (an unshared classifier) and f16 (shared), the 16-bit file, the
    float32 version 1 file of its widened weights, and a version 2 file of float32 weights."""
    d = tmp_path_factory.mktemp("weight_types")
    out = {}
    for weight_type, shared, seed in (("bf16", False, 3), ("f16", True, 4)):
        tensors = ropefile.random_weights(**{k: v for k, v in DIMS.items() if k != "seq_len"},
                                          shared_classifier=shared, seed=seed)
        stored, widened = ropefile.as_16bit(tensors, weight_type)
        dims = dict(DIMS, shared_classifier=shared)
        out[weight_type] = ropefile.write_checkpoint(d / f"{weight_type}.bin", stored, dims, weight_type)
        out[f"{weight_type}-as-f32"] = ropefile.write_checkpoint(d / f"{weight_type}-f32.bin", widened, dims)
        out[f"{weight_type}-as-f32-v2"] = ropefile.write_checkpoint(d / f"{weight_type}-f32-v2.bin", widened, dims,
                                                                     version=2)
    return out


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """{name: binary}: the build under test, and (x86-64, not emulated, not the sanitizer run,
    which has its own build) an AVX2 build and a plain C build, compiled in parallel."""
    binaries = {"under-test": None}
    if RUN_PREFIX or SANITIZED or shutil.which(os.environ.get("CC", "cc")) is None:
        return binaries
    d = tmp_path_factory.mktemp("builds")
    cc = os.environ.get("CC", "cc")
    wanted = {"plain": ["-O2"]}
    if platform.machine() == "x86_64":
        wanted["avx2"] = ["-O3", "-march=native", "-mno-avx512f"]
    jobs = {name: subprocess.Popen([cc, *flags, "-ffp-contract=off", "-fopenmp", "-o", str(d / f"run-{name}"),
                                    str(ROOT / "run.c"), "-lm"], stderr=subprocess.PIPE, text=True)
            for name, flags in wanted.items()}
    for name, job in jobs.items():
        _, err = job.communicate(timeout=300)
        assert job.returncode == 0, err
        binaries[name] = str(d / f"run-{name}")
    return binaries


def outputs(binary, model, threads, mode, tmp_path):
    """Everything a mode prints that depends on the weights: stdout, the CSV, and stderr less
    the start-up line (it names the file and its format) and the timing."""
    csv = tmp_path / f"{mode}.csv"
    common = [model, "-z", LLAMA_TOKENIZER, "-T", threads]
    args, stdin = {
        "generate-greedy": (["-t", 0, "-n", 32, "-v", "-p", PROMPT], None),
        "generate-seeded": (["-t", 1, "-s", 42, "-n", 32, "-v", "-p", PROMPT], None),
        "ppl": (["-m", "ppl", "-p", TEXT, "--csv", csv], None),
        "inspect": (["-m", "inspect", "-p", PROMPT, "--csv", csv], None),
        "chat": (["-m", "chat", "-t", 0, "-n", 12, "-v", "-y", "Be brief.", "-p", "Hello there"], "And then?\n"),
    }[mode]
    if csv.exists():
        csv.unlink()
    r = run(*common, *args, input=stdin, binary=binary, timeout=300)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    stderr = [line for line in r.stderr.splitlines() if not line.startswith((b"run: ", b"timing:"))]
    return r.stdout, csv.read_bytes() if csv.exists() else b"", stderr


MODES = ["generate-greedy", "generate-seeded", "ppl", "inspect", "chat"]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("build", ["under-test", "avx2", "plain"])
@pytest.mark.parametrize("weight_type", ["bf16", "f16"])
def test_16bit_file_equals_float32_file_of_widened_weights_bitwise(files, builds, weight_type, build, threads,
                                                                    tmp_path):
    if build not in builds:
        pytest.skip(f"no {build} build here (emulated, sanitizer run, not x86-64, or no compiler)")
    binary = builds[build]
    for mode in MODES:
        reference = outputs(binary, files[f"{weight_type}-as-f32"], threads, mode, tmp_path)
        assert reference[0] or reference[1], f"{mode}: no output to compare"
        assert outputs(binary, files[weight_type], threads, mode, tmp_path) == reference, \
            f"{weight_type} {mode} {build} -T {threads}: output differs from the float32 file's"
        if mode == "ppl":  # version 2 with float32 weights (64-byte aligned) reads as version 1 does
            assert outputs(binary, files[f"{weight_type}-as-f32-v2"], threads, mode, tmp_path) == reference


def test_startup_line_names_version_2_and_the_weight_type(files):
    for weight_type in ("bf16", "f16"):
        r = run(files[weight_type], "-z", LLAMA_TOKENIZER, "-m", "rope")
        assert r.returncode == 0
        assert f"(ROPE v2 {weight_type})".encode() in r.stderr.splitlines()[0]


def test_16bit_file_size_is_its_64_byte_aligned_layout(files):
    """The layout: every tensor at a multiple of 64 bytes, matrices 2 bytes a weight, norms 4."""
    dims = DIMS
    hd, L = dims["dim"] // dims["n_heads"], dims["n_layers"]
    sizes = [(True, dims["vocab_size"] * dims["dim"]), (False, L * dims["dim"]), (True, L * dims["dim"] ** 2),
             (True, L * hd * dims["dim"]), (True, L * hd * dims["dim"]), (True, L * dims["dim"] ** 2),
             (False, L * dims["dim"]), (True, L * dims["hidden_dim"] * dims["dim"]),
             (True, L * dims["hidden_dim"] * dims["dim"]), (True, L * dims["hidden_dim"] * dims["dim"]),
             (False, dims["dim"])]
    at = 256
    for matrix, n in sizes:
        at = (at + 63) // 64 * 64 + n * (2 if matrix else 4)
    shared_size = at
    assert os.path.getsize(files["f16"]) == shared_size
    assert os.path.getsize(files["bf16"]) == (at + 63) // 64 * 64 + 2 * dims["vocab_size"] * dims["dim"]


# ----------------------------------------------------------------------------
# Files run must refuse: one line, exit 1


def bad_file(files, tmp_path, edit):
    data = bytearray(open(files["bf16"], "rb").read())
    edit(data)
    path = tmp_path / "bad.bin"
    path.write_bytes(bytes(data))
    return path


def assert_refused(path, *words):
    r = run(path, "-z", LLAMA_TOKENIZER, "-n", 4, "-p", "hi")
    lines = r.stderr.decode(errors="replace").splitlines()
    assert r.returncode == 1, lines
    assert len(lines) == 1 and lines[0].startswith("run: error:"), lines
    for w in words:
        assert w in lines[0], lines[0]


@pytest.mark.parametrize("code, words", [(3, "weight_type 3 is not a type"), (-1, "weight_type -1 is not a type"),
                                          (0, "weight_type f32) implies")])
def test_weight_type_unknown_or_disagreeing_with_the_size_is_refused(files, tmp_path, code, words):
    assert_refused(bad_file(files, tmp_path, lambda d: struct.pack_into("<i", d, 88, code)), words)


@pytest.mark.parametrize("offset, value, words", [
    (84, 7, "head_size 7"), (92, 1, "byte 92"), (96, 1, "tokenizer_offset 1 is not"),
    (104, 7, "tokenizer_bytes is 7 but tokenizer_offset is 0"), (200, 1, "n_experts 1"),
    (216, 1, "reserved header byte 216")])
def test_version_2_fields_that_must_be_zero_are_checked(files, tmp_path, offset, value, words):
    assert_refused(bad_file(files, tmp_path, lambda d: struct.pack_into("<i", d, offset, value)), words)


def test_16bit_tensors_without_their_64_byte_alignment_are_refused(tmp_path):
    dims = dict(DIMS, vocab_size=512, shared_classifier=True)  # norms of 2 x 76 floats: padding needed
    tensors = ropefile.random_weights(**{k: v for k, v in dims.items() if k != "seq_len"})
    stored, _ = ropefile.as_16bit(tensors, "bf16")
    path = ropefile.write_checkpoint(tmp_path / "packed.bin", stored, dims, "bf16", aligned=False)
    assert_refused(path, "weight_type bf16) implies")


def test_version_1_with_a_16bit_weight_type_is_refused(files, tmp_path):
    assert_refused(bad_file(files, tmp_path, lambda d: struct.pack_into("<i", d, 4, 1)), "reserved header byte 88")


# ----------------------------------------------------------------------------
# export.py: the source's type kept, --dtype, narrowing only when asked


def read_v2(path):
    """(header fields, {name: stored array}) of a ROPE file by the format's description."""
    data = open(path, "rb").read()
    version, dim, hidden, layers, heads, kv_heads, vocab, seq, shared = struct.unpack_from("<9i", data, 4)
    weight_type = struct.unpack_from("<i", data, 88)[0] if version == 2 else 0
    kind = ["<f4", "<u2", "<f2"][weight_type]
    hd = dim // heads
    shapes = [("token_embedding", (vocab, dim)), ("rms_att", (layers, dim)), ("wq", (layers, dim, dim)),
              ("wk", (layers, kv_heads * hd, dim)), ("wv", (layers, kv_heads * hd, dim)), ("wo", (layers, dim, dim)),
              ("rms_ffn", (layers, dim)), ("w1", (layers, hidden, dim)), ("w2", (layers, dim, hidden)),
              ("w3", (layers, hidden, dim)), ("rms_final", (dim,))] + ([] if shared else [("wcls", (vocab, dim))])
    tensors, at = {}, 256
    for name, shape in shapes:
        if version == 2:
            at = (at + 63) // 64 * 64
        dtype = np.dtype(kind if name in ropefile.MATRICES else "<f4")
        n = int(np.prod(shape))
        tensors[name] = np.frombuffer(data, dtype, n, at).reshape(shape)
        at += n * dtype.itemsize
    assert at == len(data), "the file is not exactly its tensors"
    return dict(version=version, weight_type=weight_type), tensors


def widened(a):
    return ropefile.bf16_bits_to_f32(a) if a.dtype == np.dtype("<u2") else a.astype(np.float32)


@pytest.fixture(scope="module")
def hf_models(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf16")
    models = {}
    for dtype in ("BF16", "F16", "F32"):
        config, tensors = hf_fixture.make_hf_checkpoint(d / dtype, dtype=dtype, vocab_size=512, tied=False,
                                                        seed=21)
        models[dtype] = (d / dtype, tensors)
    return models


@pytest.mark.parametrize("dtype, weight_type", [("BF16", 1), ("F16", 2)])
def test_export_keeps_16bit_source_values_and_dtype_f32_widens_them(hf_models, tmp_path, dtype, weight_type):
    model, source = hf_models[dtype]
    r = export(model, tmp_path / "kept.bin")
    assert r.stderr == "", r.stderr
    export(model, tmp_path / "wide.bin", "--dtype", "f32")
    header, kept = read_v2(tmp_path / "kept.bin")
    wide_header, wide = read_v2(tmp_path / "wide.bin")
    assert header == dict(version=2, weight_type=weight_type) and wide_header == dict(version=1, weight_type=0)
    # w1 (not permuted): the source's values exactly; every tensor: the widened file's values
    assert np.array_equal(widened(kept["w1"][0]).astype(np.float64), source["model.layers.0.mlp.gate_proj.weight"])
    assert np.array_equal(widened(kept["token_embedding"]).astype(np.float64), source["model.embed_tokens.weight"])
    for name in kept:
        assert np.array_equal(widened(kept[name]), wide[name]), name
    # and run reads them alike
    a = run(tmp_path / "kept.bin", "-z", TOK512, "-m", "ppl", "-p", TEXT)
    b = run(tmp_path / "wide.bin", "-z", TOK512, "-m", "ppl", "-p", TEXT)
    assert a.returncode == 0 and a.stdout == b.stdout


def test_export_narrows_float32_only_when_asked_rounding_to_nearest_even(hf_models, tmp_path):
    model, source = hf_models["F32"]
    r = export(model, tmp_path / "plain.bin")
    assert r.stderr == "" and read_v2(tmp_path / "plain.bin")[0]["version"] == 1
    r = export(model, tmp_path / "bf16.bin", "--dtype", "bf16")
    assert "narrowing" in r.stderr and "nearest even" in r.stderr
    _, t = read_v2(tmp_path / "bf16.bin")
    want = hf_fixture.float32_to_bf16_bits(source["model.layers.1.mlp.down_proj.weight"].astype(np.float32))
    assert np.array_equal(t["w2"][1], want)
    r = export(model, tmp_path / "f16.bin", "--dtype", "f16")
    assert "narrowing" in r.stderr
    _, t = read_v2(tmp_path / "f16.bin")
    assert np.array_equal(t["w3"][0], source["model.layers.0.mlp.up_proj.weight"].astype(np.float16))


def test_export_refuses_an_f16_narrowing_that_overflows(tmp_path):
    config, tensors = hf_fixture.make_hf_checkpoint(tmp_path / "m", dtype="F32", vocab_size=512, seed=5)
    path = tmp_path / "m" / "model.safetensors"
    data = bytearray(path.read_bytes())
    header_len = struct.unpack_from("<Q", data)[0]
    entry = json.loads(data[8:8 + header_len])["model.layers.0.mlp.up_proj.weight"]
    struct.pack_into("<f", data, 8 + header_len + entry["data_offsets"][0], 1e5)
    path.write_bytes(bytes(data))
    r = export(tmp_path / "m", tmp_path / "out.bin", "--dtype", "f16", check=False)
    lines = r.stderr.splitlines()
    assert r.returncode == 1 and lines[-1].startswith("export.py: error:") and "overflows f16" in lines[-1], lines
    assert not (tmp_path / "out.bin").exists()


def test_export_legacy_widens_a_16bit_source_and_refuses_a_16bit_dtype(hf_models, tmp_path):
    model, _ = hf_models["BF16"]
    export(model, tmp_path / "legacy.bin", "--legacy")
    export(model, tmp_path / "wide.bin", "--dtype", "f32")
    a = run(tmp_path / "legacy.bin", "-z", TOK512, "-m", "ppl", "-p", TEXT)
    b = run(tmp_path / "wide.bin", "-z", TOK512, "-m", "ppl", "-p", TEXT)
    assert a.returncode == 0 and a.stdout == b.stdout
    r = export(model, tmp_path / "x.bin", "--legacy", "--dtype", "bf16", check=False)
    assert r.returncode == 2 and r.stderr.startswith("export.py: error:") and len(r.stderr.splitlines()) == 1


def test_export_reads_a_version_2_file_back(hf_models, tmp_path):
    model, _ = hf_models["BF16"]
    export(model, tmp_path / "bf16.bin")
    export(tmp_path / "bf16.bin", tmp_path / "again.bin")
    export(tmp_path / "bf16.bin", tmp_path / "wide.bin", "--dtype", "f32")
    assert (tmp_path / "again.bin").read_bytes() == (tmp_path / "bf16.bin").read_bytes()
    export(model, tmp_path / "direct.bin", "--dtype", "f32")
    assert (tmp_path / "wide.bin").read_bytes() == (tmp_path / "direct.bin").read_bytes()


def test_export_writes_float32_when_the_matrices_mix_types(tmp_path):
    """A model whose embedding is F32 and whose layers are BF16: float32 (exact for both), with a
    warning; the values are the stored ones."""
    config, source = hf_fixture.make_hf_checkpoint(tmp_path / "m", dtype="BF16", vocab_size=512, seed=6)
    path = tmp_path / "m" / "model.safetensors"
    tensors = hf_fixture.read_safetensors(path)
    header, chunks, offset = {}, [], 0
    for name, values in tensors.items():
        dtype = "F32" if name == "model.embed_tokens.weight" else "BF16"
        data = hf_fixture.to_bytes(values, dtype)
        header[name] = {"dtype": dtype, "shape": list(values.shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(chunks))
    r = export(tmp_path / "m", tmp_path / "out.bin")
    assert "more than one type" in r.stderr and "float32" in r.stderr
    header, t = read_v2(tmp_path / "out.bin")
    assert header == dict(version=1, weight_type=0)
    assert np.array_equal(t["token_embedding"].astype(np.float64), source["model.embed_tokens.weight"])
    assert np.array_equal(t["w1"][0].astype(np.float64), source["model.layers.0.mlp.gate_proj.weight"])
