"""The model families of "Real models II" end to end: a Hugging Face checkpoint with random
weights at each model's real shape (tests/family_fixtures.py: fewer layers, every layer kind
of the real pattern kept, windows made small), float32 and bf16, exported by export.py and
run by run, against tests/family_reference.py (an independent NumPy forward pass written
from the published modeling code, in float64 on the stored values).

Pinned, per family and source dtype:
  - `run -m ppl`'s nll within 1e-4 relative of the reference's, over a text longer than
    every window (so a sliding layer that saw too much or too little shows);
  - greedy decoding (`-t 0`, one token at a time: the decode path, where ppl runs the
    prefill blocks) gives the reference's argmax tokens;
  - what export.py wrote: version 2 for these blocks, and the per-layer table's NoPE layers
    and windows as the config says.
"""
import re
import struct

import numpy as np
import pytest

import family_fixtures
import family_reference
import hf_fixture
from conftest import LONG_TEXT, PREFILL_BLOCK, TOK512, export, greedy_ids, run, tokens_of

# the families this branch supports, by the fixture of the model the issue names
MODELS = ["Qwen2.5-0.5B", "Qwen3-0.6B", "SmolLM3-3B", "Mistral-7B-v0.1", "Gemma-2B", "Gemma-2-2B", "Gemma-3-270M",
          "Gemma-3-1B", "gemma-3-4b-text", "Phi-3-mini-4k", "Phi-4-mini"]  # the last: Gemma 3's multimodal layout, linear x8 on global layers
# 40-odd tokens with tok512: longer than every fixture's window (8)
TEXT = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the "
        "park with her friends. One day, she saw a big red ball.")
PROMPT = "Once upon a time, there was a little girl named Lily. She"
STEPS = 24  # -n: positions in all, prompt included
WINDOW = 8  # family_fixtures.shrink's default


def context_of(config):
    """run's default context: the file's seq_len, at most 4096 (longrope chooses its factors by it,
    as llama.cpp does; family_reference.forward's context= does the same)."""
    return min(family_reference.text_config(config)["max_position_embeddings"], 4096)


@pytest.fixture(scope="module", params=[(m, d) for m in MODELS for d in ("F32", "BF16")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def exported(request, tmp_path_factory):
    """(config, tensors, path of the exported .bin) for one fixture."""
    name, dtype = request.param
    d = tmp_path_factory.mktemp("families") / f"{name}-{dtype}"
    family_fixtures.write_checkpoint(d, name, dtype, seed=3)
    config, tensors = hf_fixture.load_hf_checkpoint(d)
    out = d.parent / f"{name}-{dtype}.bin"
    export(d, out)
    return config, tensors, out


def test_perplexity_matches_the_family_reference(exported):
    config, tensors, model = exported
    tokens = tokens_of(model, TEXT)
    assert len(tokens) > 4 * WINDOW
    r = run(model, "-z", TOK512, "-m", "ppl", "-p", TEXT)
    assert r.returncode == 0, r.stderr
    nll = float(re.search(rb"nll: (\S+)", r.stdout).group(1))
    expected = family_reference.nll(family_reference.forward(config, tensors, tokens, context_of(config)), tokens)
    assert abs(nll - expected) <= 1e-4 * abs(expected), (nll, expected)


# the families with sliding layers: every layer (Mistral, Phi-3 with a window), the local ones
# (Gemma 2's every other, Gemma 3's five of six)
SLIDING = ["Mistral-7B-v0.1", "Gemma-2-2B", "Gemma-3-1B", "Phi-3-mini-4k"]


@pytest.mark.parametrize("name", SLIDING)
def test_sliding_layers_past_their_ring_match_the_family_reference(tmp_path, name):
    """A sliding layer's cache holds W + PREFILL_BLOCK - 1 positions, a ring: a text of several
    rings (ppl: the prefill blocks, wrapping inside and across them) and greedy decoding from a
    prompt longer than the ring (decode steps on a wrapped ring) give the reference's numbers."""
    d = tmp_path / name
    family_fixtures.write_checkpoint(d, name, "F32", seed=5)
    config, tensors = hf_fixture.load_hf_checkpoint(d)
    model = tmp_path / f"{name}.bin"
    export(d, model)
    assert any(family_reference.layer_windows(config)), "the fixture has no sliding layer"
    tokens = tokens_of(model, LONG_TEXT)
    assert len(tokens) > 3 * (WINDOW + PREFILL_BLOCK)
    r = run(model, "-z", TOK512, "-m", "ppl", "-p", LONG_TEXT)
    assert r.returncode == 0, r.stderr
    nll = float(re.search(rb"nll: (\S+)", r.stdout).group(1))
    expected = family_reference.nll(family_reference.forward(config, tensors, tokens, context_of(config)), tokens)
    assert abs(nll - expected) <= 1e-4 * abs(expected), (nll, expected)
    prompt_text = LONG_TEXT[:700]
    prompt = tokens_of(model, prompt_text)
    assert len(prompt) > WINDOW + PREFILL_BLOCK
    generated = greedy_ids(model, prompt_text, len(prompt) + 12)
    assert len(generated) >= 12
    assert generated == family_reference.greedy(config, tensors, prompt, len(generated), context_of(config))


def test_greedy_tokens_match_the_family_reference(exported):
    config, tensors, model = exported
    prompt = tokens_of(model, PROMPT)
    generated = greedy_ids(model, PROMPT, STEPS)
    assert len(generated) >= STEPS - len(prompt)
    assert len(prompt) + len(generated) > WINDOW
    assert generated == family_reference.greedy(config, tensors, prompt, len(generated), context_of(config))


def read_header_and_table(path):
    data = path.read_bytes()
    version, n_layers = struct.unpack_from("<i", data, 4)[0], struct.unpack_from("<i", data, 16)[0]
    head_size, flags = struct.unpack_from("<i", data, 84)[0], struct.unpack_from("<I", data, 112)[0]
    rope2_theta = struct.unpack_from("<f", data, 152)[0]
    offset, size = struct.unpack_from("<2Q", data, 136)
    table = [struct.unpack_from("<2i", data, offset + 8 * i) for i in range(n_layers)] if size else None
    if size:
        assert offset % 64 == 0 and size == 8 * n_layers and offset + size == len(data)
    return version, head_size, flags, table, rope2_theta


def test_export_writes_the_block_options_and_layer_table_the_config_gives(exported):
    config, _, model = exported
    config = family_reference.text_config(config)
    version, head_size, flags, table, rope2_theta = read_header_and_table(model)
    assert version == 2
    fam = config["model_type"]
    n = config["num_hidden_layers"]
    explicit = config.get("head_dim") and config["head_dim"] * config["num_attention_heads"] != config["hidden_size"]
    assert head_size == (config["head_dim"] if explicit else 0)
    # bit 0 q/k/v biases, bit 1 q/k norms, bit 2 post norms
    assert flags == {"qwen2": 1, "qwen3": 2, "gemma2": 4, "gemma3_text": 6}.get(fam, 0)
    assert rope2_theta == (config["rope_local_base_freq"] if fam == "gemma3_text" else 0)
    sliding = [t == "sliding_attention" for t in family_reference.layer_types(config)]
    if fam == "gemma2":  # layers 0, 2, ... slide
        assert table == [(1, config["sliding_window"] if i % 2 == 0 else 0) for i in range(n)]
    elif fam == "gemma3_text":  # five local layers (the second setting, a window) to one global
        assert sliding == [True] * 5 + [False]
        assert table == [(2, config["sliding_window"]) if s else (1, 0) for s in sliding]
    elif fam == "smollm3":  # no_rope_layers: 0 marks a NoPE layer (the fourth of four)
        assert table == [(1 if r else 0, 0) for r in config["no_rope_layers"]] and table[3] == (0, 0)
    elif fam in ("mistral", "phi3") and config["sliding_window"] < config["max_position_embeddings"]:
        assert table == [(1, config["sliding_window"])] * n  # one window on every layer (Phi-3-mini's 2047 -> 7)
    else:  # Qwen (use_sliding_window false), Gemma, Phi-4-mini (a window beyond the length): no table
        assert table is None


@pytest.mark.parametrize("model_type, arch", [("gpt_neox", "GPTNeoXForCausalLM"), ("qwen2_moe", "Qwen2MoeForCausalLM")])
def test_families_this_format_does_not_carry_are_refused_in_one_line(tmp_path, model_type, arch):
    config = family_fixtures.shrink("Mistral-7B-v0.1")
    config.update(model_type=model_type, architectures=[arch])
    d = tmp_path / model_type
    family_fixtures.write_checkpoint(d, "Mistral-7B-v0.1", "F32", seed=3, config=config)
    r = export(d, tmp_path / "out.bin", check=False)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("export.py: error:") and "not supported" in lines[0], lines
    assert not (tmp_path / "out.bin").exists()


@pytest.mark.parametrize("change, words", [
    ({"vision_config": {"hidden_size": 8}}, "vision"),
    ({"num_local_experts": 8}, "mixtures of experts"),
    ({"num_experts": 4}, "mixtures of experts"),
    ({"no_rope_layers": [1, 1, 1]}, "no_rope_layers"),
    ({"no_rope_layers": [1, 1, 1, 2]}, "no_rope_layers"),
    ({"use_sliding_window": True}, "use_sliding_window"),
])
def test_inconsistent_or_unsupported_configs_are_refused_before_writing(tmp_path, change, words):
    config = family_fixtures.shrink("SmolLM3-3B")
    config.update(change)
    d = tmp_path / "m"
    family_fixtures.write_checkpoint(d, "SmolLM3-3B", "F32", seed=3, config=config)
    r = export(d, tmp_path / "out.bin", check=False)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], lines
    assert not (tmp_path / "out.bin").exists()


def test_nope_layer_keys_do_not_depend_on_position(tmp_path):
    """A model whose every layer is NoPE (no_rope_layers all 0): the reference's keys of one
    token at two positions are equal, export.py's table marks every layer NoPE, and run
    agrees with the reference (run.c's own keys: tests/test_rope.c's NoPE test)."""
    config = family_fixtures.shrink("SmolLM3-3B")
    config["no_rope_layers"] = [0] * config["num_hidden_layers"]
    d = tmp_path / "nope"
    family_fixtures.write_checkpoint(d, "SmolLM3-3B", "F32", seed=5, config=config)
    config, tensors = hf_fixture.load_hf_checkpoint(d)
    keys = family_reference.layer_keys(config, tensors, [1, 300, 300, 300])
    assert np.array_equal(keys[1], keys[3])
    out = tmp_path / "nope.bin"
    export(d, out)
    table = read_header_and_table(out)[3]
    assert table == [(0, 0)] * config["num_hidden_layers"]
    tokens = tokens_of(out, TEXT)
    r = run(out, "-z", TOK512, "-m", "ppl", "-p", TEXT)
    nll = float(re.search(rb"nll: (\S+)", r.stdout).group(1))
    expected = family_reference.nll(family_reference.forward(config, tensors, tokens), tokens)
    assert abs(nll - expected) <= 1e-4 * abs(expected)


def exported_one(tmp_path, name):
    d = tmp_path / name
    family_fixtures.write_checkpoint(d, name, "F32", seed=3)
    config, tensors = hf_fixture.load_hf_checkpoint(d)
    export(d, tmp_path / f"{name}.bin")
    return family_reference.text_config(config), tmp_path / f"{name}.bin"


def rope_blocks(stdout):
    """-m rope's pair tables: [[omega_i, ...] per setting], and its lines that are not pair rows."""
    tables, words = [], []
    for line in stdout.decode().splitlines():
        if line.startswith("attention_factor:"):
            tables.append([])
        elif re.match(r"^\d+ ", line):
            tables[-1].append(float(line.split()[1]))
        else:
            words.append(line)
    return tables, words


def test_rope_mode_prints_each_setting_and_the_layers_using_it(tmp_path):
    """Gemma 3: the global layers' theta 1e6 and the local layers' 10k, each with the layers
    that use it; the frequencies are the reference's inverse frequencies of each layer kind."""
    config, model = exported_one(tmp_path, "Gemma-3-1B")
    r = run(model, "-z", TOK512, "-m", "rope")
    assert r.returncode == 0, r.stderr
    tables, words = rope_blocks(r.stdout)
    settings = family_reference.layer_settings(config, config["max_position_embeddings"])
    local = [i for i, s in enumerate(settings) if s["window"]]
    glob = [i for i, s in enumerate(settings) if not s["window"]]
    assert len(tables) == 2 and local and glob
    for table, layer in ((tables[0], glob[0]), (tables[1], local[0])):
        np.testing.assert_allclose(table, settings[layer]["inv_freq"], rtol=1e-6)
    assert f"layers using this setting: {' '.join(map(str, glob))}" in words
    assert f"layers using the second setting: {' '.join(map(str, local))}" in words


def test_rope_and_inspect_modes_name_nope_and_sliding_layers(tmp_path):
    config, model = exported_one(tmp_path, "SmolLM3-3B")
    nope = [i for i, rotates in enumerate(family_reference.rotating_layers(config)) if not rotates]
    assert nope == [3]
    r = run(model, "-z", TOK512, "-m", "rope")
    assert f"NoPE layers (not rotated): {' '.join(map(str, nope))}" in r.stdout.decode().splitlines()
    r = run(model, "-z", TOK512, "-m", "inspect", "-p", "Once upon a time")
    assert r.returncode == 0, r.stderr
    assert "layers: L0 rope full, L1 rope full, L2 rope full, L3 NoPE full" in r.stdout.decode().splitlines()
    config, model = exported_one(tmp_path, "Gemma-2-2B")
    windows = [s["window"] for s in family_reference.layer_settings(config, 64)]
    r = run(model, "-z", TOK512, "-m", "inspect", "-p", "Once upon a time")
    expected = ", ".join(f"L{i} rope " + (f"sliding {w}" if w else "full") for i, w in enumerate(windows))
    assert "layers: " + expected in r.stdout.decode().splitlines()


@pytest.mark.parametrize("context, factors", [(32, "short"), (64, "long")])
def test_longrope_factors_follow_the_context_in_use(tmp_path, context, factors):
    """Phi-4-mini (trained length 32 in the fixture): within it (-c 32) the short factors,
    beyond it the long ones, as llama.cpp chooses by the context; the same text scores as
    the reference scores it with that choice, and not as with the other set."""
    name = "Phi-4-mini"
    d = tmp_path / name
    family_fixtures.write_checkpoint(d, name, "F32", seed=3)
    config, tensors = hf_fixture.load_hf_checkpoint(d)
    assert family_reference.longrope_factors_in_use(config, context) == factors
    out = tmp_path / "phi4.bin"
    export(d, out)
    text = "Once upon a time, there was a little girl named Lily."
    tokens = tokens_of(out, text)
    assert len(tokens) <= 32
    r = run(out, "-z", TOK512, "-m", "ppl", "-p", text, "-c", context)
    assert r.returncode == 0, r.stderr
    nll = float(re.search(rb"nll: (\S+)", r.stdout).group(1))
    expected = family_reference.nll(family_reference.forward(config, tensors, tokens, context), tokens)
    other_context = 64 if context == 32 else 32  # the other factor set
    other = family_reference.nll(family_reference.forward(config, tensors, tokens, other_context), tokens)
    assert abs(nll - expected) <= 1e-4 * abs(expected), (nll, expected)
    assert abs(nll - other) > 1e-3 * abs(other)
    # -m rope: the frequencies of the chosen set (the reference's inverse frequencies), and which set it is
    r = run(out, "-z", TOK512, "-m", "rope", "-c", context)
    tables, words = rope_blocks(r.stdout)
    settings = family_reference.layer_settings(config, context)[0]
    rotated = settings["rotated_pairs"]
    np.testing.assert_allclose(tables[0][:rotated], settings["inv_freq"], rtol=1e-6)
    assert tables[0][rotated:] == [0.0] * (len(tables[0]) - rotated)  # Phi-4-mini rotates 3/4 of each head
    assert any(w.startswith(f"longrope: each pair divided by its {factors} factor") for w in words)


@pytest.mark.parametrize("fraction, code", [("1", 2), ("0.5", 2), ("0.75", 0)])
def test_rope_fraction_that_changes_longropes_pairs_is_refused(tmp_path, fraction, code):
    """Phi-4-mini's longrope factors are one per rotated pair (48 of 64 in the real model): a
    --rope-fraction that rotates another number of pairs read past the factors' tensor (zeros
    from the rest of the file, or whatever bytes follow). Refused in one line; its own fraction
    runs."""
    config, model = exported_one(tmp_path, "Phi-4-mini")
    r = run(model, "-z", TOK512, "-t", "0", "-n", "4", "-p", "Once", "--rope-fraction", fraction)
    assert r.returncode == code, r.stderr
    if code == 2:
        lines = r.stderr.decode().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"run: error: --rope-fraction {fraction} rotates "), lines
        assert "this file's longrope factors are for its" in lines[0]


@pytest.mark.parametrize("model_type, dtype", [("mistral", "F32"), ("mistral", "BF16"), ("llama", "F32")])
def test_llama_and_mistral_with_a_head_dim_of_their_own_export_and_match(tmp_path, model_type, dtype):
    """Mistral NeMo (hidden 5120, 32 heads of 128): transformers' Llama and Mistral attention read
    config.head_dim, so q is heads x head_dim wide, not hidden_size. export.py refused them ("this
    format derives head_dim from dim / n_heads"), although version 2 stores the head size."""
    name = "Mistral-7B-v0.1"
    config = family_fixtures.shrink(name, dtype=dtype)
    if model_type == "llama":  # Mistral's block without its window is Llama's
        config.update(model_type="llama", architectures=["LlamaForCausalLM"])
        config.pop("sliding_window", None)
    heads = config["num_attention_heads"]
    config["head_dim"] = 2 * config["hidden_size"] // heads  # q twice as wide as the residual stream
    d = tmp_path / "nemo-like"
    family_fixtures.write_checkpoint(d, name, dtype, seed=5, config=config)
    config, tensors = hf_fixture.load_hf_checkpoint(d)
    assert tensors["model.layers.0.self_attn.q_proj.weight"].shape[0] == heads * config["head_dim"]
    out = tmp_path / "nemo-like.bin"
    export(d, out)
    tokens = tokens_of(out, TEXT)
    r = run(out, "-z", TOK512, "-m", "ppl", "-p", TEXT)
    assert r.returncode == 0, r.stderr
    nll = float(re.search(rb"nll: (\S+)", r.stdout).group(1))
    expected = family_reference.nll(family_reference.forward(config, tensors, tokens, context_of(config)), tokens)
    assert abs(nll - expected) <= 1e-4 * abs(expected), (nll, expected)
