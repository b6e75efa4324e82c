"""16-bit weights (ROPE version 2: bf16 and f16 matrices and embedding, float32 norms).

run computes in float32 from the widened weights, so a bf16 (or f16) file must give, bit for
bit, what the float32 file holding the same widened values gives: in every mode (generate
greedy and seeded, ppl, inspect's CSV, chat), with 1 and 2 threads, in the build under test
(RUN_BIN: native, ASan, or aarch64 under qemu) and, on x86-64, in an AVX2 build (no AVX-512)
and a plain C build (no SIMD) compiled once for the session (conftest.py's builds). The files
are written by tests/ropefile.py from the format's description, the 16-bit values rounded by
NumPy. Then export.py's round trips
(the 16-bit values kept, --dtype f32 their widened values, narrowing only when asked) and
the files run must refuse.
"""
import io
import json
import os
import struct
import subprocess

import numpy as np
import pytest

from conftest import LLAMA_TOKENIZER, RUN_BIN, RUN_PREFIX, TOK512, assert_run_refused, export, run
import hf_fixture
import ropefile

# dim 76 (rows of 9 whole vectors and a 4-float tail), hidden 100 (12 vectors and 4), one
# key/value head for two query heads; a 32000-token classifier, large enough for the decode
# matmul to be split across threads
DIMS = dict(dim=76, hidden_dim=100, n_layers=2, n_heads=2, n_kv_heads=1, vocab_size=32000, seq_len=96)
PROMPT = "Once upon a time, a little fox found a shiny stone by the river"
TEXT = ("The girl ran to the park. She saw a big dog and a small cat. They played all day, and at night "
        "they went home happy. The next morning the sun was warm and the birds sang.")


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
    assert_run_refused(run(path, "-z", LLAMA_TOKENIZER, "-n", 4, "-p", "hi"), *words)


@pytest.mark.parametrize("code, words", [(12, "weight_type 12 is not a type"), (-1, "weight_type -1 is not a type"),
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
    assert_refused(q8_bad_file(q8_files, tmp_path, lambda d: struct.pack_into("<i", d, 88, 12)),
                   "weight_type 12 is not a type", "3 q8_0", "11 q6_k", "4 per piece")


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


# ----------------------------------------------------------------------------
# A type per matrix piece (weight_type 4, a type table): GGUF's files give each tensor of each
# layer its own type. Each piece widens to float32 exactly as a file of one type does, so a
# file of mixed pieces must give, bit for bit, what the float32 file of the widened weights
# gives. The pieces' bytes are rounded and quantized here by tests/ropefile.py (independently
# of export.py), given to export.write_rope as Blocks of their types (weight_type None: each
# piece keeps its own); the Llama reference is written by ropefile.py from the format's
# description.

from conftest import load_export  # noqa: E402
import moe_fixtures  # noqa: E402
import gemma4_fixtures  # noqa: E402

EXPORT = load_export()
KINDS = ["q8_0", "bf16", "f16", "f32"]


def stored_as(kind, values):
    """(values stored as kind, as uint8 bytes; their widened float32 values), by ropefile.py."""
    values = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
    if kind == "bf16":
        bits = ropefile.to_bf16_bits(values)
        return bits.view(np.uint8), ropefile.bf16_bits_to_f32(bits)
    if kind == "f16":
        half = values.astype("<f2")
        return half.view(np.uint8), half.astype(np.float32)
    if kind == "q8_0":
        blocks = ropefile.quantize_row_q8_0_ref(values)
        return blocks, ropefile.q8_0_to_f32(blocks)
    return values.view(np.uint8), values


def typed_model(src, choose):
    """From the float32 ROPE file src: (Config, tensors with each matrix piece a Blocks of the type
    choose(name, piece index, shape) gives, the same tensors with the widened float32 values, the
    file's tokenizer section). A layered matrix is given as one Blocks per layer (per layer with
    experts for the router and the experts); the pieces are cut from the float32 tensor in file
    order, as docs/format.md lays them out."""
    c, tensors, weight_type, tokenizer = EXPORT.read_flat_checkpoint(str(src))
    assert weight_type == "f32"
    typed, wide = dict(tensors), dict(tensors)
    for name, shapes in EXPORT.matrix_piece_shapes(c).items():
        flat, at, pieces, widened_parts = np.asarray(tensors[name], np.float32).reshape(-1), 0, [], []
        for i, shape in enumerate(shapes):
            n = int(np.prod(shape))
            kind = choose(name, i, shape) if n else "f32"
            data, widened_values = stored_as(kind, flat[at:at + n])
            pieces.append(EXPORT.Blocks(kind, shape, data, f"{name} {i}"))
            widened_parts.append(widened_values)
            at += n
        assert at == flat.size, name
        typed[name] = pieces[0] if name in EXPORT.WHOLE_MATRICES else pieces
        wide[name] = np.concatenate(widened_parts).reshape(np.shape(tensors[name]))
    return c, typed, wide, tokenizer


def write_with(path, c, tensors, weight_type, tokenizer=None):
    with open(path, "wb") as f:
        EXPORT.write_rope(f, c, tensors, str(path), weight_type, tokenizer)
    return path


def cycling(kinds):
    """Each piece the next of kinds in turn (q8_0 only where its rows are whole blocks, else bf16)."""
    counter = iter(range(10 ** 6))

    def choose(name, i, shape):
        kind = kinds[next(counter) % len(kinds)]
        return "bf16" if kind == "q8_0" and shape[-1] % 32 else kind
    return choose


@pytest.fixture(scope="module")
def typed_files(tmp_path_factory):
    """The Llama fixture (Q8_DIMS: every row whole q8_0 blocks, an unshared classifier): the file of
    mixed pieces (every matrix tensor's pieces in more than one type, the embedding q8_0), and the
    float32 version 1 file of its widened weights by ropefile.py."""
    d = tmp_path_factory.mktemp("typed")
    tensors = ropefile.random_weights(**{k: v for k, v in Q8_DIMS.items() if k != "seq_len"},
                                      shared_classifier=False, seed=9)
    dims = dict(Q8_DIMS, shared_classifier=False)
    src = ropefile.write_checkpoint(d / "src.bin", tensors, dims)
    c, typed, wide, _ = typed_model(src, cycling(KINDS))
    out = {"typed": write_with(d / "typed.bin", c, typed, None), "c": c}
    order = ["token_embedding", "rms_att", "wq", "wk", "wv", "wo", "rms_ffn", "w1", "w2", "w3", "rms_final", "wcls"]
    out["wide"] = ropefile.write_checkpoint(d / "wide.bin", [(n, wide[n]) for n in order], dims)
    return out


def expected_typed_layout(path, dims):
    """(the type codes, the size) of a Llama file with a type table, from docs/format.md: the header,
    then each tensor and each matrix piece at the next multiple of 64 (norms float32, a piece in its
    table entry's type), the table at the first multiple of 64 after the last tensor."""
    data = open(path, "rb").read()
    assert struct.unpack_from("<ii", data, 0)[1] == 2 and struct.unpack_from("<i", data, 88)[0] == 4
    table_at, table_bytes = struct.unpack_from("<2Q", data, 216)
    codes = list(data[table_at:table_at + table_bytes])
    L, dim, hidden, vocab = dims["n_layers"], dims["dim"], dims["hidden_dim"], dims["vocab_size"]
    kv = dims["n_kv_heads"] * dim // dims["n_heads"]
    pieces = ([("m", vocab * dim), ("n", L * dim)] + [("m", dim * dim)] * L + [("m", kv * dim)] * 2 * L +
              [("m", dim * dim)] * L + [("n", L * dim)] + [("m", hidden * dim)] * 3 * L + [("n", dim)] +
              [("m", vocab * dim)])
    at, code = 256, iter(codes)
    for kind, n in pieces:
        at += -at % 64
        if kind == "n":
            at += 4 * n
        else:
            t = next(code)
            at += n // 32 * 34 if t == 3 else n * (4 if t == 0 else 2)
    assert next(code, None) is None
    return codes, at + -at % 64, table_at, table_bytes


def test_per_piece_file_is_laid_out_as_the_format_says(typed_files):
    codes, table_at, header_at, header_bytes_ = expected_typed_layout(typed_files["typed"], Q8_DIMS)
    L = Q8_DIMS["n_layers"]
    assert len(codes) == header_bytes_ == 1 + 7 * L + 1 and header_at == table_at
    assert os.path.getsize(typed_files["typed"]) == table_at + len(codes)
    assert codes[0] == 3 and len(set(codes)) == 4  # the embedding q8_0; all four types
    for first in range(1, 1 + 7 * L, L):  # each layered matrix's pieces: not all one type
        assert len(set(codes[first:first + L])) == L, codes


@pytest.mark.parametrize("threads", [1, 2])
def test_per_piece_file_equals_float32_file_of_widened_weights_bitwise(typed_files, builds, threads, tmp_path):
    assert_every_mode_equals(build_or_skip(builds, "under-test"), typed_files["typed"], typed_files["wide"], threads,
                             tmp_path, f"per piece -T {threads}")


@pytest.mark.parametrize("build", ["avx2", "plain"])
def test_per_piece_file_equals_float32_file_in_the_other_builds(typed_files, builds, build, tmp_path):
    assert_every_mode_equals(build_or_skip(builds, build), typed_files["typed"], typed_files["wide"], "2", tmp_path,
                             f"per piece {build}")


def test_per_piece_startup_line_names_the_type_table(typed_files):
    r = run(typed_files["typed"], "-z", LLAMA_TOKENIZER, "-m", "rope")
    assert r.returncode == 0 and b"(ROPE v2 per-piece types)" in r.stderr.splitlines()[0]


def fixture_outputs(model, threads, tmp_path):
    """generate (greedy), ppl and inspect's CSV of a small fixture model with tok512."""
    csv = tmp_path / "out.csv"
    out = []
    for args in (["-t", 0, "-n", 24, "-v", "-p", PROMPT], ["-m", "ppl", "-p", TEXT],
                 ["-m", "inspect", "-p", PROMPT, "--csv", csv]):
        if csv.exists():
            csv.unlink()
        r = run(model, "-z", TOK512, "-T", threads, *args)
        assert r.returncode == 0, r.stderr
        out.append((r.stdout, csv.read_bytes() if csv.exists() else b""))
    return out


def fixture_typed_and_wide(tmp_path, write_source, choose):
    source = tmp_path / "hf"
    write_source(source)
    src = tmp_path / "src.bin"
    export(source, src, "--dtype", "f32")
    c, typed, wide, tokenizer = typed_model(src, choose)
    return (write_with(tmp_path / "typed.bin", c, typed, None, tokenizer),
            write_with(tmp_path / "wide.bin", c, wide, "f32", tokenizer))


def moe_choice(name, i, shape):
    """The router float32 (as a BF16 Mixtral GGUF keeps it), the experts bf16 on one layer and
    q8_0 (or f16, rows not whole blocks) on the next, the rest by turns."""
    if name == "router":
        return "f32"
    if name.startswith("expert_"):
        return ["bf16", "q8_0" if shape[-1] % 32 == 0 else "f16"][i % 2]
    kind = KINDS[(i + len(name)) % 4]
    return "f16" if kind == "q8_0" and shape[-1] % 32 else kind


@pytest.mark.parametrize("name", ["Mixtral-8x7B-v0.1", "gemma-4-E2B-it"])
def test_per_piece_fixture_equals_float32_file_of_widened_weights(tmp_path, name):
    """A mixture of experts (a float32 router beside experts whose type changes by layer; its
    layers' w1, w2, w3 are pieces of no weights) and Gemma 4 E2B (KV-shared layers without wk, wv;
    the per-layer inputs' matrices): every mode alike, 1 and 2 threads; export.py's round trips."""
    def write_source(d):
        if name.startswith("gemma-4"):
            gemma4_fixtures.write_checkpoint(d, name, "F32", seed=11)
        else:
            moe_fixtures.write_checkpoint(d, name, "F32", seed=11)
    typed, wide = fixture_typed_and_wide(tmp_path, write_source, moe_choice)
    assert struct.unpack_from("<i", typed.read_bytes(), 88)[0] == 4
    for threads in ("1", "2"):
        assert fixture_outputs(typed, threads, tmp_path) == fixture_outputs(wide, threads, tmp_path), threads
    # export.py reads it back: as it is, byte for byte; widened when asked, the float32 file
    export(typed, tmp_path / "again.bin")
    export(typed, tmp_path / "again-f32.bin", "--dtype", "f32")
    assert (tmp_path / "again.bin").read_bytes() == typed.read_bytes()
    assert (tmp_path / "again-f32.bin").read_bytes() == wide.read_bytes()


# export.py reads a file of typed pieces back: as it is (byte for byte), or converted when asked


def test_export_reads_a_per_piece_file_back_unchanged_and_widens_it_when_asked(typed_files, tmp_path):
    again, wide = tmp_path / "again.bin", tmp_path / "wide.bin"
    export(typed_files["typed"], again)
    assert again.read_bytes() == typed_files["typed"].read_bytes()
    export(typed_files["typed"], wide, "--dtype", "f32")
    assert wide.read_bytes() == typed_files["wide"].read_bytes()  # the widened values, version 1


def typed_bad_file(typed_files, tmp_path, edit):
    data = bytearray(typed_files["typed"].read_bytes())
    edit(data)
    path = tmp_path / "bad.bin"
    path.write_bytes(bytes(data))
    return path


def table_place(data):
    return struct.unpack_from("<2Q", data, 216)


@pytest.mark.parametrize("case, words", [
    ("no table", ["weight_type 4 (per piece) needs a type table", "weight_type 4 with type_table_offset 0"]),
    ("table with weight_type 1", ["must be 0 with weight_type 1", "weight_type 1 with type_table_offset"]),
    ("bytes one short", ["type_table_bytes 15 is not 16", "type_table_bytes 15 is not 16"]),
    ("offset one block on", ["is not", "the type table is at"]),
    ("unknown code", ["type table entry 5 is 12", "type table entry 5 is 12"]),
    ("q8_0 rows not whole blocks", ["w2 of layer 0 is q8_0 with rows of 112 weights", "q8_0 rows of 112 weights"]),
    ("truncated", ["is not inside the file", "runs past the end"]),
])
def test_run_and_export_refuse_a_bad_type_table(typed_files, tmp_path, case, words):
    """run: one line, exit 1 (words[0]); export.py reading it back: one line, exit 1 (words[1])."""
    def edit(d):
        at, n = table_place(d)
        if case == "no table":
            struct.pack_into("<2Q", d, 216, 0, 0)
        elif case == "table with weight_type 1":
            struct.pack_into("<i", d, 88, 1)
        elif case == "bytes one short":
            struct.pack_into("<2Q", d, 216, at, n - 1)
        elif case == "offset one block on":
            struct.pack_into("<2Q", d, 216, at + 64, n)
            d.extend(bytes(64))
            d[at + 64:at + 64 + n] = d[at:at + n]
        elif case == "unknown code":
            d[at + 5] = 12  # 4 is no type; 0..3 and 5..11 are
        elif case == "truncated":
            del d[-5:]
    if case == "q8_0 rows not whole blocks":
        path = odd_rows_q8_0_file(tmp_path)
    else:
        path = typed_bad_file(typed_files, tmp_path, edit)
    r = run(path, "-z", LLAMA_TOKENIZER, "-n", 4, "-p", "hi")
    lines = r.stderr.decode(errors="replace").splitlines()
    assert r.returncode == 1 and len(lines) == 1 and lines[0].startswith("run: error:"), lines
    assert words[0] in lines[0], lines[0]
    e = export(path, tmp_path / "out.bin", check=False)
    lines = e.stderr.splitlines()
    assert e.returncode == 1 and len(lines) == 1 and lines[0].startswith("export.py: error:"), lines
    assert words[1] in lines[0], lines[0]
    assert not (tmp_path / "out.bin").exists()


def odd_rows_q8_0_file(tmp_path):
    """A Llama file whose w2 rows (hidden 112) are not whole blocks, its pieces bf16 but layer 0's
    wq (f16), with layer 0's w2 piece then declared q8_0 in its table."""
    dims = dict(Q8_DIMS, hidden_dim=112, vocab_size=512)
    tensors = ropefile.random_weights(**{k: v for k, v in dims.items() if k != "seq_len"}, shared_classifier=True,
                                      seed=2)
    src = ropefile.write_checkpoint(tmp_path / "src.bin", tensors, dict(dims, shared_classifier=True))
    c, typed, _, _ = typed_model(src, lambda name, i, shape: "bf16")
    typed["wq"][0] = EXPORT.Blocks("f16", typed["wq"][0].shape, typed["wq"][0].widened().astype("<f2").view(np.uint8))
    path = write_with(tmp_path / "odd.bin", c, typed, None)
    data = bytearray(path.read_bytes())
    at, n = table_place(data)
    w2_layer0 = 1 + 5 * c.n_layers  # after the embedding and wq wk wv wo w1
    assert data[at + w2_layer0] == 1  # bf16; as q8_0, a row of 112 weights would be 3.5 blocks
    data[at + w2_layer0] = 3
    path.write_bytes(bytes(data))
    return path


def test_write_rope_refuses_a_layer_piece_given_in_two_types(typed_files):
    """Layer 0's w1 given as two parts, float32 then bf16: one piece of the file, two types."""
    c, typed, _, _ = typed_model(typed_files["wide"], lambda name, i, shape: "bf16")
    first = typed["w1"][0].widened().reshape(-1)
    n = first.size // 2
    typed["w1"] = [first[:n], EXPORT.Blocks("bf16", (first.size - n,), ropefile.to_bf16_bits(first[n:]).view(np.uint8))
                   ] + typed["w1"][1:]
    with pytest.raises(EXPORT.ExportError, match=r"tensor w1: file piece 0 \(a layer's\) is given in bf16 and f32"):
        EXPORT.write_rope(io.BytesIO(), c, typed, "x.bin", None)


def test_write_rope_refuses_a_q8_0_piece_whose_rows_are_not_whole_blocks(tmp_path):
    """Layer 1's w2 (rows of hidden 112 weights) given as q8_0 blocks over its flat weights: run would
    refuse the file, so write_rope refuses to write it."""
    dims = dict(Q8_DIMS, hidden_dim=112, vocab_size=512)
    tensors = ropefile.random_weights(**{k: v for k, v in dims.items() if k != "seq_len"}, shared_classifier=True,
                                      seed=3)
    src = ropefile.write_checkpoint(tmp_path / "src.bin", tensors, dict(dims, shared_classifier=True))
    c, typed, _, _ = typed_model(src, lambda name, i, shape: "bf16" if name != "wq" else "f16")
    flat = typed["w2"][1].widened().reshape(-1)
    typed["w2"][1] = EXPORT.Blocks("q8_0", (flat.size,), ropefile.quantize_row_q8_0_ref(flat))
    with pytest.raises(EXPORT.ExportError, match="tensor w2: piece 1 is q8_0, but its rows of 112 weights"):
        EXPORT.write_rope(io.BytesIO(), c, typed, "x.bin", None)
