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


def build_or_skip(builds, build):
    """The binary of this build, or a skip where it cannot be had."""
    if build not in builds:
        pytest.skip(f"no {build} build here (emulated, sanitizer run, not x86-64, or no compiler)")
    return builds[build]


def assert_every_mode_equals(binary, narrow, wide, threads, tmp_path, label):
    """Every mode's output of the narrow file equals the wide (float32) file's, byte for byte;
    returns [(mode, the wide file's output)]."""
    references = []
    for mode in MODES:
        reference = outputs(binary, wide, threads, mode, tmp_path)
        assert reference[0] or reference[1], f"{mode}: no output to compare"
        assert outputs(binary, narrow, threads, mode, tmp_path) == reference, \
            f"{label} {mode}: output differs from the float32 file's"
        references.append((mode, reference))
    return references


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("build", ["under-test", "avx2", "plain"])
@pytest.mark.parametrize("weight_type", ["bf16", "f16"])
def test_16bit_file_equals_float32_file_of_widened_weights_bitwise(files, builds, weight_type, build, threads,
                                                                    tmp_path):
    binary = build_or_skip(builds, build)
    for mode, reference in assert_every_mode_equals(binary, files[weight_type], files[f"{weight_type}-as-f32"],
                                                    threads, tmp_path, f"{weight_type} {build} -T {threads}"):
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


@pytest.mark.parametrize("code, words", [(5, "weight_type 5 is not a type"), (-1, "weight_type -1 is not a type"),
                                          (0, "weight_type f32) implies"),
                                          (4, "weight_type 4 (per piece) needs a type table")])
def test_weight_type_unknown_or_disagreeing_with_the_size_is_refused(files, tmp_path, code, words):
    assert_refused(bad_file(files, tmp_path, lambda d: struct.pack_into("<i", d, 88, code)), words)


@pytest.mark.parametrize("offset, value, words", [
    (84, 7, "head_size 7"), (92, 1, "byte 92"), (96, 1, "tokenizer_offset 1 is not"),
    (104, 7, "tokenizer_bytes is 7 but tokenizer_offset is 0"), (200, 1, "n_experts 1"),
    (216, 1, "type_table_offset 1 and type_table_bytes 0 must be 0 with weight_type 1"),
    (224, 1, "type_table_offset 0 and type_table_bytes 1 must be 0 with weight_type 1"),
    (232, 1, "reserved header byte 232")])
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


# ----------------------------------------------------------------------------
# Q8_0 (weight_type 3): GGUF's 8-bit blocks, d * q exact in float32, so a Q8_0 file must
# give, bit for bit, what the float32 file of its dequantized weights gives. Every row is
# whole 32-weight blocks: dim 96 (three heads of 32), hidden 160, one key/value head.

Q8_DIMS = dict(dim=96, hidden_dim=160, n_layers=2, n_heads=3, n_kv_heads=1, vocab_size=32000, seq_len=96)


@pytest.fixture(scope="module")
def q8_files(tmp_path_factory):
    """{name: path}: for an unshared and a shared classifier, the Q8_0 file (blocks by the
    transcription of llama.cpp's quantize_row_q8_0_ref in ropefile.py) and the float32
    version 1 file of its dequantized weights."""
    d = tmp_path_factory.mktemp("q8_0")
    out = {}
    for shared, seed in ((False, 5), (True, 6)):
        name = "shared" if shared else "unshared"
        tensors = ropefile.random_weights(**{k: v for k, v in Q8_DIMS.items() if k != "seq_len"},
                                          shared_classifier=shared, seed=seed)
        stored, dequantized = ropefile.as_q8_0(tensors)
        dims = dict(Q8_DIMS, shared_classifier=shared)
        out[name] = ropefile.write_checkpoint(d / f"{name}-q8_0.bin", stored, dims, "q8_0")
        out[f"{name}-as-f32"] = ropefile.write_checkpoint(d / f"{name}-f32.bin", dequantized, dims)
    return out


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("build", ["under-test", "avx2", "plain"])
@pytest.mark.parametrize("classifier", ["unshared", "shared"])
def test_q8_0_file_equals_float32_file_of_dequantized_weights_bitwise(q8_files, builds, classifier, build, threads,
                                                                       tmp_path):
    binary = build_or_skip(builds, build)
    assert_every_mode_equals(binary, q8_files[classifier], q8_files[f"{classifier}-as-f32"], threads, tmp_path,
                             f"q8_0 {classifier} {build} -T {threads}")


def test_q8_0_plain_loops_equal_the_fast_kernels(q8_files, tmp_path):
    """RUN_PLAIN=1 (the plain loops only) against the kernels of the build under test."""
    common = [q8_files["unshared"], "-z", LLAMA_TOKENIZER, "-m", "ppl", "-p", TEXT]
    fast = run(*common)
    env = dict(os.environ, RUN_PLAIN="1")
    plain = subprocess.run(RUN_PREFIX + [RUN_BIN] + list(map(str, common)), capture_output=True, env=env,
                           timeout=300, stdin=subprocess.DEVNULL)
    assert fast.returncode == 0 and plain.returncode == 0, plain.stderr
    assert fast.stdout == plain.stdout and fast.stdout


def test_q8_0_startup_line_and_file_size_are_34_bytes_a_block(q8_files):
    r = run(q8_files["shared"], "-z", LLAMA_TOKENIZER, "-m", "rope")
    assert r.returncode == 0 and b"(ROPE v2 q8_0)" in r.stderr.splitlines()[0]
    dims = Q8_DIMS
    hd, L, dim, hidden = dims["dim"] // dims["n_heads"], dims["n_layers"], dims["dim"], dims["hidden_dim"]
    sizes = [(True, dims["vocab_size"] * dim), (False, L * dim), (True, L * dim * dim), (True, L * hd * dim),
             (True, L * hd * dim), (True, L * dim * dim), (False, L * dim), (True, L * hidden * dim),
             (True, L * hidden * dim), (True, L * hidden * dim), (False, dim)]
    at = 256
    for matrix, n in sizes:
        at = (at + 63) // 64 * 64 + (n // 32 * 34 if matrix else 4 * n)
    assert os.path.getsize(q8_files["shared"]) == at


def q8_bad_file(q8_files, tmp_path, edit):
    data = bytearray(open(q8_files["unshared"], "rb").read())
    edit(data)
    path = tmp_path / "bad.bin"
    path.write_bytes(bytes(data))
    return path


EMBEDDING_AT = 256  # the first tensor, at the first multiple of 64 after the header


@pytest.mark.parametrize("scale, words", [(0x7C00, "is inf"), (0xFC00, "is -inf"), (0x7E00, "is nan")])
def test_q8_0_scale_that_is_not_finite_is_refused(q8_files, tmp_path, scale, words):
    block = 7  # of the token embedding
    path = q8_bad_file(q8_files, tmp_path, lambda d: struct.pack_into("<H", d, EMBEDDING_AT + 34 * block, scale))
    assert_refused(path, "token_embedding", "q8_0 block 7", words)


def test_q8_0_scale_in_the_last_matrix_is_checked(q8_files, tmp_path):
    size = os.path.getsize(q8_files["unshared"])  # wcls ends the file: its last block's scale
    path = q8_bad_file(q8_files, tmp_path, lambda d: struct.pack_into("<H", d, size - 34, 0x7C00))
    assert_refused(path, "wcls", "scales must be finite")


@pytest.mark.parametrize("change", ["one block short", "one block more", "one byte more"])
def test_q8_0_size_that_disagrees_with_the_shapes_is_refused(q8_files, tmp_path, change):
    def edit(d):
        if change == "one block short":
            del d[-34:]
        else:
            d.extend(bytes(34 if change == "one block more" else 1))
    assert_refused(q8_bad_file(q8_files, tmp_path, edit), "weight_type q8_0) implies")


def test_q8_0_unknown_type_after_it_is_refused(q8_files, tmp_path):
    assert_refused(q8_bad_file(q8_files, tmp_path, lambda d: struct.pack_into("<i", d, 88, 5)),
                   "weight_type 5 is not a type", "3 q8_0", "4 per piece")


@pytest.mark.parametrize("dims, words", [
    (dict(DIMS), "dim a multiple of 32, not 76"),
    (dict(Q8_DIMS, hidden_dim=100), "layer 0 has q_dim 96 and hidden_dim 100")])
def test_q8_0_rows_that_are_not_whole_blocks_are_refused(tmp_path, dims, words):
    """Written with the 34-byte blocks over every tensor's weights (so that only the rows are wrong)."""
    tensors = ropefile.random_weights(**{k: v for k, v in dims.items() if k != "seq_len"}, seed=1)
    padded = [(n, np.concatenate([t.reshape(-1), np.zeros(-t.size % 32, np.float32)])
               if n in ropefile.MATRICES else t) for n, t in tensors]
    stored, _ = ropefile.as_q8_0(padded)
    path = ropefile.write_checkpoint(tmp_path / "rows.bin", stored, dict(dims, shared_classifier=True), "q8_0")
    assert_refused(path, words)


# export.py --dtype q8_0


def read_q8_0_blocks(path):
    """{name: the tensor's Q8_0 bytes, or float32 norms} of a version 2 q8_0 file, by the format's description."""
    data = open(path, "rb").read()
    version, dim, hidden, layers, heads, kv_heads, vocab, seq, shared = struct.unpack_from("<9i", data, 4)
    assert version == 2 and struct.unpack_from("<i", data, 88)[0] == 3
    hd = dim // heads
    shapes = [("token_embedding", vocab * dim), ("rms_att", layers * dim), ("wq", layers * dim * dim),
              ("wk", layers * kv_heads * hd * dim), ("wv", layers * kv_heads * hd * dim), ("wo", layers * dim * dim),
              ("rms_ffn", layers * dim), ("w1", layers * hidden * dim), ("w2", layers * dim * hidden),
              ("w3", layers * hidden * dim), ("rms_final", dim)] + ([] if shared else [("wcls", vocab * dim)])
    tensors, at = {}, 256
    for name, n in shapes:
        at = (at + 63) // 64 * 64
        nbytes = n // 32 * 34 if name in ropefile.MATRICES else 4 * n
        tensors[name] = np.frombuffer(data, np.uint8, nbytes, at)
        at += nbytes
    assert at == len(data), "the file is not exactly its tensors"
    return tensors


@pytest.mark.parametrize("dtype", ["F32", "BF16", "F16"])
def test_export_q8_0_blocks_are_llama_cpp_quantize_row_q8_0_ref_of_the_source(hf_models, tmp_path, dtype):
    """The blocks of w1, w2 (not permuted), the embedding and the classifier: the transcription of
    llama.cpp's quantizer applied to the source's weights widened to float32, byte for byte."""
    model, source = hf_models[dtype]
    r = export(model, tmp_path / "q8.bin", "--dtype", "q8_0")
    assert "q8_0" in r.stderr and "of bf16's" in r.stderr and "largest change of a weight" in r.stderr, r.stderr
    t = read_q8_0_blocks(tmp_path / "q8.bin")
    pairs = [("w1", "model.layers.0.mlp.gate_proj.weight", 0), ("w2", "model.layers.1.mlp.down_proj.weight", 1),
             ("token_embedding", "model.embed_tokens.weight", None), ("wcls", "lm_head.weight", None)]
    for ours, theirs, layer in pairs:
        blocks = t[ours].reshape(-1, 34)
        if layer is not None:
            blocks = blocks.reshape(2, -1, 34)[layer]
        want = ropefile.quantize_row_q8_0_ref(source[theirs].astype(np.float32))
        assert np.array_equal(blocks.reshape(-1), want), ours


def test_quantize_row_q8_0_ref_transcription_rounds_as_the_c_does():
    """The cases the C's arithmetic decides: a block of zeros (d 0, id 0), a product exactly
    half-way (roundf: away from zero), amax giving q = +-127, and a scale that is an f16 subnormal."""
    zeros = ropefile.quantize_row_q8_0_ref(np.zeros(32, np.float32))
    assert not zeros.any()
    ramp = np.zeros(32, np.float32)
    ramp[0], ramp[1], ramp[2] = 127.0, 2.5, -2.5  # d = 1, id = 1: x0 = 2.5 -> 3, -2.5 -> -3
    b = ropefile.quantize_row_q8_0_ref(ramp)
    assert b[:2].view("<f2")[0] == 1.0 and list(b[2:5].view(np.int8)) == [127, 3, -3]
    tiny = np.full(32, 1e-6, np.float32)
    b = ropefile.quantize_row_q8_0_ref(tiny)
    d = np.float32(np.float32(1e-6) / np.float32(127))
    assert b[:2].view("<f2")[0] == np.float16(d) and b[:2].view("<u2")[0] < 0x400  # a subnormal f16
    assert (b[2:].view(np.int8) == 127).all()


def test_export_q8_0_round_trip_through_dequantized_float32_gives_the_same_bytes(hf_models, tmp_path):
    model, _ = hf_models["BF16"]
    export(model, tmp_path / "q8.bin", "--dtype", "q8_0")
    export(tmp_path / "q8.bin", tmp_path / "wide.bin", "--dtype", "f32")
    export(tmp_path / "wide.bin", tmp_path / "again.bin", "--dtype", "q8_0")
    export(tmp_path / "q8.bin", tmp_path / "kept.bin")  # a q8_0 source stays q8_0
    assert (tmp_path / "again.bin").read_bytes() == (tmp_path / "q8.bin").read_bytes()
    assert (tmp_path / "kept.bin").read_bytes() == (tmp_path / "q8.bin").read_bytes()
    # and the float32 file holds d * q, which run computes alike
    _, wide = read_v2(tmp_path / "wide.bin")
    blocks = read_q8_0_blocks(tmp_path / "q8.bin")
    assert np.array_equal(wide["w3"].reshape(-1), ropefile.q8_0_to_f32(blocks["w3"]))
    a = run(tmp_path / "q8.bin", "-z", TOK512, "-m", "ppl", "-p", TEXT)
    b = run(tmp_path / "wide.bin", "-z", TOK512, "-m", "ppl", "-p", TEXT)
    assert a.returncode == 0 and a.stdout == b.stdout


def test_export_q8_0_refuses_rows_that_are_not_whole_blocks(tmp_path):
    hf_fixture.make_hf_checkpoint(tmp_path / "m", dtype="F32", hidden_dim=100, vocab_size=512, seed=5)
    r = export(tmp_path / "m", tmp_path / "out.bin", "--dtype", "q8_0", check=False)
    lines = r.stderr.splitlines()
    assert r.returncode == 1 and len(lines) == 1 and lines[0].startswith("export.py: error:"), lines
    assert "multiple of 32" in lines[0] and "hidden_dim is 100" in lines[0], lines
    assert not (tmp_path / "out.bin").exists()
