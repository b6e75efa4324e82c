"""export.py's Gemma 4 exporter (model_type gemma4 and gemma4_text), end to end.

Checkpoints: tests/gemma4_fixtures.py (E2B, E4B and 31B shrunk, every layer kind, KV sharing,
double-wide MLPs, k = v, per-layer inputs; float32 and bf16). Judged by:
  - docs/format.md, read here with struct, independently of export.py: the header's fields,
    Gemma 4's per-layer records, the ragged tensor layout (each tensor compared with the one
    the source implies: rows permuted per head into adjacent pairs, the KV-shared layers'
    k/v/k_norm left out, wo's columns permuted on the k = v layers, norms as stored);
  - tests/gemma4_reference.py (an independent NumPy forward pass): run -m ppl's nll within
    1e-4 relative, and greedy decoding's tokens;
  - the refusals: one stderr line, exit 1, nothing written.

Run with: /usr/bin/python3 -m pytest tests/test_gemma4_export.py
"""
import json
import math
import re
import struct

import numpy as np
import pytest

import gemma4_fixtures as F
import gemma4_reference as g4
from conftest import LONG_TEXT, PREFILL_BLOCK, ROOT, TOK512, export, greedy_ids, run, tokens_of

MODELS = ["gemma-4-E2B-it", "gemma-4-E4B", "gemma-4-31B"]
# 40-odd tokens with tok512: longer than the fixtures' windows (8)
TEXT = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the "
        "park with her friends. One day, she saw a big red ball.")
PROMPT = "Once upon a time, there was a little girl named Lily. She"
STEPS = 24
WINDOW = 8
ALIGN = 64


def export_fixture(directory, name, dtype, **kw):
    """(config, tensors, the exported file, export's stderr) of one fixture."""
    config, tensors = F.write_checkpoint(directory, name, dtype, **kw)
    out = directory.parent / f"{directory.name}.bin"
    r = export(directory, out)
    return config, tensors, out, r.stderr


@pytest.fixture(scope="module", params=[(m, d) for m in MODELS for d in ("F32", "BF16")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def exported(request, tmp_path_factory):
    name, dtype = request.param
    d = tmp_path_factory.mktemp("gemma4") / f"{name}-{dtype}"
    return export_fixture(d, name, dtype)


# ----------------------------------------------------------------------------
# The file, read from docs/format.md


def read_header(data):
    h = {}
    (h["magic"], h["version"], h["dim"], h["hidden_dim"], h["n_layers"], h["n_heads"], h["n_kv_heads"],
     h["vocab_size"], h["seq_len"], h["shared_classifier"]) = struct.unpack_from("<I9i", data, 0)
    h["norm_eps"], h["rope_theta"], h["rope_fraction"], h["rope_factor"] = struct.unpack_from("<4f", data, 40)
    h["rope_scaling"], h["rope_original_len"] = struct.unpack_from("<2i", data, 56)
    h["rule_fields"] = struct.unpack_from("<5f", data, 64)
    h["head_size"], h["weight_type"], h["reserved92"] = struct.unpack_from("<3i", data, 84)
    h["tokenizer_offset"], h["tokenizer_bytes"] = struct.unpack_from("<2Q", data, 96)
    h["block_flags"], h["activation"] = struct.unpack_from("<Ii", data, 112)
    (h["embedding_multiplier"], h["attention_scale"], h["attention_softcap"],
     h["final_softcap"]) = struct.unpack_from("<4f", data, 120)
    h["layer_table_offset"], h["layer_table_bytes"] = struct.unpack_from("<2Q", data, 136)
    h["rope2_theta"], h["rope2_fraction"], h["rope2_factor"] = struct.unpack_from("<3f", data, 152)
    h["rope2_scaling"], h["rope2_original_len"] = struct.unpack_from("<2i", data, 164)
    h["rope2_rule_fields"] = struct.unpack_from("<5f", data, 172)
    h["per_layer_input_dim"], h["per_layer_embedding_multiplier"] = struct.unpack_from("<if", data, 192)
    h["reserved200"] = data[200:256]
    return h


def read_records(data, h):
    n, at, size = h["n_layers"], h["layer_table_offset"], h["layer_table_bytes"]
    assert size == 32 * n
    return [struct.unpack_from("<8i", data, at + 32 * l) for l in range(n)]


def layout(h, records):
    """[(name, floats, is_matrix, offset)] of the tensors, as docs/format.md places them, and their end."""
    dim, L, nh, V = h["dim"], h["n_layers"], h["n_heads"], h["vocab_size"]
    hs = [r[2] or h["head_size"] for r in records]
    kvh = [r[3] or h["n_kv_heads"] for r in records]
    hid = [r[4] or h["hidden_dim"] for r in records]
    own = [r[5] == 0 for r in records]
    q = sum(nh * x for x in hs)
    kv = sum(k * x for k, x, o in zip(kvh, hs, own) if o)
    v = sum(k * x for k, x, o, r in zip(kvh, hs, own, records) if o and not r[6])
    hidden = sum(hid)
    flags, P = h["block_flags"], h["per_layer_input_dim"]
    tensors = [("token_embedding", V * dim, 1), ("rms_att", L * dim, 0), ("wq", q * dim, 1), ("wk", kv * dim, 1),
               ("wv", v * dim, 1), ("wo", dim * q, 1), ("rms_ffn", L * dim, 0), ("w1", hidden * dim, 1),
               ("w2", dim * hidden, 1), ("w3", hidden * dim, 1), ("rms_final", dim, 0)]
    if not h["shared_classifier"]:
        tensors.append(("wcls", V * dim, 1))
    assert not flags & 1
    if flags & 2:
        tensors += [("q_norm", sum(hs), 0), ("k_norm", sum(x for x, o in zip(hs, own) if o), 0)]
    if flags & 4:
        tensors += [("rms_post_att", L * dim, 0), ("rms_post_ffn", L * dim, 0)]
    if flags & 16:
        tensors.append(("layer_scalars", L, 0))
    if flags & 32:
        tensors += [("per_layer_embedding", V * L * P, 1), ("per_layer_projection_in", L * P * dim, 1),
                    ("per_layer_projection_norm", P, 0), ("per_layer_gate", L * P * dim, 1),
                    ("per_layer_projection_out", L * dim * P, 1), ("rms_per_layer", L * dim, 0)]
    out, at = [], 256
    width = {0: 4, 1: 2, 2: 2}[h["weight_type"]]
    for name, n, matrix in tensors:
        at += -at % ALIGN
        out.append((name, n, matrix, at))
        at += n * (width if matrix else 4)
    return out, at


def read_tensors(data, h, records):
    """{name: float64 flat array} of every tensor in the file."""
    placed, _ = layout(h, records)
    out = {}
    for name, n, matrix, at in placed:
        if matrix and h["weight_type"] == 1:
            bits = np.frombuffer(data, "<u2", n, at).astype(np.uint32) << 16
            out[name] = bits.view(np.float32).astype(np.float64)
        elif matrix and h["weight_type"] == 2:
            out[name] = np.frombuffer(data, "<f2", n, at).astype(np.float64)
        else:
            out[name] = np.frombuffer(data, "<f4", n, at).astype(np.float64)
    return out


def adjacent_pairs(hd):
    """Row order per head: rotate_half's pair (i, i + hd/2) -> adjacent rows (2i, 2i + 1)."""
    order = np.empty(hd, dtype=int)
    order[0::2], order[1::2] = np.arange(hd // 2), np.arange(hd // 2) + hd // 2
    return order


def expected_records(config):
    c = g4.text_config(config)
    sources = g4.kv_sources(c)
    out = []
    for i, kind in enumerate(g4.layer_kinds(c)):
        full = kind == "full_attention"
        src = sources[i]
        out.append((1 if full else 2, 0 if full else c["sliding_window"], g4.head_dim(c, i), g4.kv_heads(c, i),
                    g4.intermediate_size(c, i), 0 if src == i else src + 1, int(g4.k_eq_v(c, i) and src == i), 0))
    return out


def expected_tensors(config, tensors):
    """{name: float64 flat array} the source implies, from docs/format.md and the reference's
    reading of the model."""
    c = g4.text_config(config)
    w = g4.strip_prefix(tensors)
    L, nh, H = c["num_hidden_layers"], c["num_attention_heads"], c["hidden_size"]
    sources = g4.kv_sources(c)
    pieces = {}

    def add(name, array):
        pieces.setdefault(name, []).append(np.asarray(array).reshape(-1))

    add("token_embedding", w["embed_tokens.weight"])
    add("rms_final", w["norm.weight"])
    for i in range(L):
        p, hd = f"layers.{i}.", g4.head_dim(c, i)
        order, own = adjacent_pairs(hd), sources[i] == i
        add("rms_att", w[p + "input_layernorm.weight"])
        add("rms_post_att", w[p + "post_attention_layernorm.weight"])
        add("rms_ffn", w[p + "pre_feedforward_layernorm.weight"])
        add("rms_post_ffn", w[p + "post_feedforward_layernorm.weight"])
        add("wq", w[p + "self_attn.q_proj.weight"].reshape(nh, hd, H)[:, order])
        add("q_norm", w[p + "self_attn.q_norm.weight"][order])
        if own:
            add("wk", w[p + "self_attn.k_proj.weight"].reshape(-1, hd, H)[:, order])
            add("k_norm", w[p + "self_attn.k_norm.weight"][order])
            if not g4.k_eq_v(c, i):
                add("wv", w[p + "self_attn.v_proj.weight"])
        wo = w[p + "self_attn.o_proj.weight"]
        if g4.k_eq_v(c, sources[i]):  # the values arrive in wk's permuted order
            wo = wo.reshape(H, nh, hd)[:, :, order]
        add("wo", wo)
        add("w1", w[p + "mlp.gate_proj.weight"])
        add("w2", w[p + "mlp.down_proj.weight"])
        add("w3", w[p + "mlp.up_proj.weight"])
        add("layer_scalars", w[p + "layer_scalar"])
        if c["hidden_size_per_layer_input"]:
            add("per_layer_gate", w[p + "per_layer_input_gate.weight"])
            add("per_layer_projection_out", w[p + "per_layer_projection.weight"])
            add("rms_per_layer", w[p + "post_per_layer_input_norm.weight"])
    if c["hidden_size_per_layer_input"]:
        add("per_layer_embedding", w["embed_tokens_per_layer.weight"])
        add("per_layer_projection_in", w["per_layer_model_projection.weight"])
        add("per_layer_projection_norm", w["per_layer_projection_norm.weight"])
    return {name: np.concatenate(parts) for name, parts in pieces.items()}


# ----------------------------------------------------------------------------
# What export.py wrote


def test_header_holds_what_the_config_implies(exported):
    config, _, path, _ = exported
    c = g4.text_config(config)
    data = path.read_bytes()
    h = read_header(data)
    dtype = g4.model_dtype(c)
    P = c["hidden_size_per_layer_input"]
    assert (h["magic"], h["version"]) == (0x45504F52, 2)
    assert (h["dim"], h["hidden_dim"], h["n_layers"], h["n_heads"], h["n_kv_heads"], h["vocab_size"], h["seq_len"]) == (
        c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["num_attention_heads"],
        c["num_key_value_heads"], c["vocab_size"], c["max_position_embeddings"])
    assert h["shared_classifier"] == 1
    assert h["norm_eps"] == np.float32(c["rms_norm_eps"])
    # the first setting: the full layers' p-RoPE over global_head_dim, theta as is, no rule
    full = c["rope_parameters"]["full_attention"]
    assert h["head_size"] == c["global_head_dim"]
    assert h["rope_theta"] == full["rope_theta"]
    pairs = int(full["partial_rotary_factor"] * c["global_head_dim"] // 2)
    assert math.floor(h["rope_fraction"] * h["head_size"] / 2) == pairs == 4
    assert h["rope_fraction"] == pytest.approx(0.25, abs=1e-6)
    assert (h["rope_factor"], h["rope_scaling"], h["rope_original_len"], h["rule_fields"]) == (1.0, 0, 0, (0.0,) * 5)
    # the second: the sliding layers' default RoPE
    assert h["rope2_theta"] == c["rope_parameters"]["sliding_attention"]["rope_theta"] == 10000
    assert (h["rope2_fraction"], h["rope2_factor"], h["rope2_scaling"], h["rope2_original_len"]) == (1.0, 1.0, 0, 0)
    assert h["rope2_rule_fields"] == (0.0,) * 5
    assert h["weight_type"] == {"F32": 0, "BF16": 1}[dtype] and h["reserved92"] == 0
    assert h["block_flags"] == 2 | 4 | 8 | 16 | (32 if P else 0)
    assert h["activation"] == 1
    assert h["embedding_multiplier"] == g4.round_to(math.sqrt(c["hidden_size"]), dtype)
    if dtype == "BF16":
        assert h["embedding_multiplier"] != np.float32(math.sqrt(c["hidden_size"]))  # the rounding shows
    assert (h["attention_scale"], h["attention_softcap"], h["final_softcap"]) == (1.0, 0.0, 30.0)
    if P:
        assert h["per_layer_input_dim"] == P == 24
        assert h["per_layer_embedding_multiplier"] == g4.round_to(math.sqrt(P), dtype)
    else:
        assert (h["per_layer_input_dim"], h["per_layer_embedding_multiplier"]) == (0, 0.0)
    assert h["reserved200"] == bytes(56)
    assert (h["tokenizer_offset"], h["tokenizer_bytes"]) == (0, 0)  # the fixtures have no tokenizer


def test_layer_records_are_what_the_config_implies(exported):
    config, _, path, _ = exported
    data = path.read_bytes()
    h = read_header(data)
    records = read_records(data, h)
    assert records == expected_records(config)
    _, end = layout(h, records)
    assert h["layer_table_offset"] == end + -end % ALIGN and data[end:h["layer_table_offset"]] == bytes(
        h["layer_table_offset"] - end)
    assert len(data) == h["layer_table_offset"] + h["layer_table_bytes"]
    # what each fixture is there for
    name = path.name
    if "E2B" in name:  # KV sharing with double-wide MLPs on the shared layers
        assert [r[5] for r in records] == [0] * 5 + [4, 4, 4, 4, 5] and records[9][4] == records[0][4] * 2
    if "E4B" in name:
        assert [r[5] for r in records] == [0] * 6 + [5] * 5 + [6]
        assert {r[4] for r in records} == {128}
    if "31B" in name:  # k = v on the full layers, with their own kv head count
        assert [(r[3], r[6]) for r in records if r[0] == 1] == [(1, 1), (1, 1)]
        assert {(r[2], r[3], r[6]) for r in records if r[0] == 2} == {(16, 4, 0)}


def test_every_tensor_is_the_source_in_the_formats_layout(exported):
    """Ragged pieces in layer order, q/k rows and norms in adjacent pairs per head, shared layers'
    k/v/k_norm skipped, wo's columns permuted on k = v layers, norms as stored (no 1 + w)."""
    config, tensors, path, _ = exported
    data = path.read_bytes()
    h = read_header(data)
    got = read_tensors(data, h, read_records(data, h))
    want = expected_tensors(config, tensors)
    assert set(got) == set(want)
    for name in want:
        assert got[name].shape == want[name].shape, name
        assert np.array_equal(got[name], want[name]), name


def test_success_says_what_was_left_out(exported):
    _, _, _, stderr = exported
    lines = stderr.splitlines()
    assert sum("vision and audio towers are left out" in x for x in lines) == 1, lines
    assert not any("defaults taken" in x for x in lines), lines  # the fixtures give every key


@pytest.mark.parametrize("key, default", [
    ("rope_parameters", F.ROPE),  # the fixtures' are the published defaults
    ("sliding_window", 512),
    ("max_position_embeddings", 131072),
    ("final_logit_softcapping", None),
])
def test_a_key_config_json_does_not_give_takes_its_published_default_and_says_so(tmp_path, key, default):
    """Without the key: Gemma4TextConfig's default, one note line naming it, and the file the config that
    gives the default explicitly exports."""
    d = tmp_path / "e2b"
    config, _ = F.write_checkpoint(d, "gemma-4-E2B-it", "F32")
    config["text_config"][key] = default
    (d / "config.json").write_text(json.dumps(config))
    export(d, tmp_path / "given.bin")
    del config["text_config"][key]
    (d / "config.json").write_text(json.dumps(config))
    r = export(d, tmp_path / "taken.bin")
    notes = [x for x in r.stderr.splitlines() if "defaults taken" in x]
    assert len(notes) == 1 and notes[0].startswith(f"export.py: note: config.json gives no {key}:"), r.stderr
    assert f"{key} {json.dumps(default)}" in notes[0] or isinstance(default, dict), notes
    assert (tmp_path / "taken.bin").read_bytes() == (tmp_path / "given.bin").read_bytes()


# ----------------------------------------------------------------------------
# run against the reference


def ppl_of(model, text=TEXT):
    r = run(model, "-z", TOK512, "-m", "ppl", "-p", text)
    assert r.returncode == 0, r.stderr
    return float(re.search(rb"nll: (\S+)", r.stdout).group(1))


def test_perplexity_matches_the_reference(exported):
    config, tensors, model, _ = exported
    tokens = tokens_of(model, TEXT)
    assert len(tokens) > 4 * WINDOW
    nll = ppl_of(model)
    expected = g4.nll(g4.forward(config, tensors, tokens), tokens)
    assert abs(nll - expected) <= 1e-4 * abs(expected), (nll, expected)


def test_greedy_tokens_match_the_reference(exported):
    config, tensors, model, _ = exported
    prompt = tokens_of(model, PROMPT)
    generated = greedy_ids(model, PROMPT, STEPS)
    assert len(generated) >= STEPS - len(prompt)
    assert len(prompt) + len(generated) > WINDOW
    assert generated == g4.greedy(config, tensors, prompt, len(generated))


def test_sliding_layers_past_their_ring_match_the_reference(exported):
    """A sliding layer's cache holds W + PREFILL_BLOCK - 1 positions, a ring (KV-shared layers
    read their source's): a text of several rings through the prefill blocks, and decoding from
    a prompt longer than the ring, give the reference's nll and tokens."""
    config, tensors, model, _ = exported
    tokens = tokens_of(model, LONG_TEXT)
    assert len(tokens) > 3 * (WINDOW + PREFILL_BLOCK)
    expected = g4.nll(g4.forward(config, tensors, tokens), tokens)
    nll = ppl_of(model, LONG_TEXT)
    assert abs(nll - expected) <= 1e-4 * abs(expected), (nll, expected)
    prompt_text = LONG_TEXT[:700]
    prompt = tokens_of(model, prompt_text)
    assert len(prompt) > WINDOW + PREFILL_BLOCK
    generated = greedy_ids(model, prompt_text, len(prompt) + 12)
    assert len(generated) >= 12
    assert generated == g4.greedy(config, tensors, prompt, len(generated))


def test_text_only_checkpoint_exports_and_matches(tmp_path):
    """gemma4_text (Gemma4ForCausalLM): the weights under model., no note about towers."""
    name = "gemma-4-E2B-it"
    config = F.shrink(name, text_only=True)
    config, tensors, model, stderr = export_fixture(tmp_path / "text", name, "F32", config=config)
    assert config["model_type"] == "gemma4_text" and "model.layers.0.self_attn.q_proj.weight" in tensors
    assert "towers" not in stderr
    tokens = tokens_of(model, TEXT)
    expected = g4.nll(g4.forward(config, tensors, tokens), tokens)
    assert abs(ppl_of(model) - expected) <= 1e-4 * abs(expected)


def test_k_eq_v_layers_need_wo_permuted(tmp_path):
    """31B's full layers take their values from wk (permuted rows): wo's columns are permuted per
    head to match. Put the source's unpermuted wo back on those layers and run no longer agrees
    with the reference; the exported file does."""
    name = "gemma-4-31B"
    config, tensors, model, _ = export_fixture(tmp_path / "b31", name, "F32")
    c = g4.text_config(config)
    w = g4.strip_prefix(tensors)
    data = bytearray(model.read_bytes())
    h = read_header(data)
    records = read_records(data, h)
    wo_at = [at for n, _, _, at in layout(h, records)[0] if n == "wo"][0]
    H, nh = c["hidden_size"], c["num_attention_heads"]
    kv_layers = [i for i in range(c["num_hidden_layers"]) if g4.k_eq_v(c, i)]
    assert kv_layers and all(records[i][6] == 1 for i in kv_layers)
    at = wo_at
    for i in range(c["num_hidden_layers"]):
        hd = g4.head_dim(c, i)
        stored = np.frombuffer(bytes(data[at:at + 4 * H * nh * hd]), "<f4").reshape(H, nh, hd)
        source = w[f"layers.{i}.self_attn.o_proj.weight"].reshape(H, nh, hd)
        if i in kv_layers:
            assert np.array_equal(stored, source[:, :, adjacent_pairs(hd)])
            assert not np.array_equal(stored, source)
            data[at:at + 4 * H * nh * hd] = source.astype("<f4").tobytes()  # undo the permutation
        else:
            assert np.array_equal(stored, source)
        at += 4 * H * nh * hd
    unpermuted = tmp_path / "unpermuted.bin"
    unpermuted.write_bytes(bytes(data))
    tokens = tokens_of(model, TEXT)
    expected = g4.nll(g4.forward(config, tensors, tokens), tokens)
    assert abs(ppl_of(model) - expected) <= 1e-4 * abs(expected)
    wrong = ppl_of(unpermuted)
    assert abs(wrong - expected) > 1e-3 * abs(expected), (wrong, expected)


def gemma4_directory(tmp_path, template_file):
    """A Gemma 4 E4B directory whose tokenizer has Gemma 4's turn tokens and end tokens, and the
    published chat template template_file (tests/data/gemma4/); the tokenizer.json's ids."""
    from test_export_tokenizer import sentencepiece_json, write_tokenizer
    d = tmp_path / "e4b"
    F.write_checkpoint(d, "gemma-4-E4B-it", "F32")
    j = sentencepiece_json()
    for text in ["<|turn>", "<turn|>", "<|tool_response>"]:
        j["model"]["vocab"][text] = len(j["model"]["vocab"])
        j["added_tokens"].append(dict(j["added_tokens"][0], id=j["model"]["vocab"][text], content=text))
    ids = j["model"]["vocab"]
    template = (ROOT / "tests" / "data" / "gemma4" / template_file).read_text(encoding="utf-8")
    write_tokenizer(d, j, {"bos_token": "<s>", "eos_token": "<turn|>", "chat_template": template},
                    {"eos_token_id": [ids["</s>"], ids["<turn|>"], ids["<|tool_response>"]]})
    return d, ids


def test_gemma4_e2b_e4b_chat_template_is_recognised_with_its_three_end_tokens(tmp_path):
    """The published E2B/E4B template is stored as gemma4; <turn|> closes a turn; the end tokens
    are generation_config.json's three (<eos>, <turn|>, <|tool_response>)."""
    from test_export_tokenizer import read_tokn
    d, ids = gemma4_directory(tmp_path, "chat_template.jinja")
    out = tmp_path / "e4b.bin"
    r = export(d, out)
    assert "chat template" not in r.stderr
    data = out.read_bytes()
    h = read_header(data)
    tok = read_tokn(data[h["tokenizer_offset"]:])
    assert tok["chat_template"] == 9  # run.c's TEMPLATE_GEMMA4
    assert tok["eot_id"] == ids["<turn|>"]
    assert tok["eos_ids"][:tok["n_eos"]] == [ids["</s>"], ids["<turn|>"], ids["<|tool_response>"]]


def test_gemma4_26b_31b_chat_template_is_stored_as_gemma4_large(tmp_path):
    """The large models' template (an empty thought channel in the thinking-off prompt) is run's
    gemma4-large (10), with Gemma 4's end tokens; --template gemma4 still chooses E2B/E4B's."""
    from test_export_tokenizer import read_tokn
    d, ids = gemma4_directory(tmp_path, "chat_template_26b_31b.jinja")
    out = tmp_path / "large.bin"
    r = export(d, out)
    assert "chat template" not in r.stderr
    data = out.read_bytes()
    tok = read_tokn(data[read_header(data)["tokenizer_offset"]:])
    assert tok["chat_template"] == 10  # run.c's TEMPLATE_GEMMA4_LARGE
    assert tok["eot_id"] == ids["<turn|>"]
    assert tok["eos_ids"][:tok["n_eos"]] == [ids["</s>"], ids["<turn|>"], ids["<|tool_response>"]]
    r = export(d, out, "--template", "gemma4")
    assert "chat template" not in r.stderr
    assert read_tokn(out.read_bytes()[read_header(out.read_bytes())["tokenizer_offset"]:])["chat_template"] == 9


# ----------------------------------------------------------------------------
# Refusals


@pytest.mark.parametrize("change, words", [
    ({"enable_moe_block": True, "num_experts": None}, "num_experts null must be an integer >= 1"),
    ({"enable_moe_block": True, "num_experts": 4, "top_k_experts": 5, "moe_intermediate_size": 8},
     "top_k_experts 5 is above the 4 experts"),
    ({"vocab_size_per_layer_input": 1024}, "vocab_size_per_layer_input"),
    ({"use_bidirectional_attention": "all"}, "use_bidirectional_attention 'all'"),
    ({"attention_bias": True}, "attention_bias"),
    # head sizes: even (RoPE rotates pairs), within run.c's limit, and the checkpoint's (issue 50)
    ({"head_dim": 15}, "config.json: head_dim 15: a head size must be even"),
    ({"global_head_dim": 33}, "config.json: global_head_dim 33: a head size must be even"),
    ({"head_dim": 0}, "config.json: head_dim 0 must be an integer >= 1"),
    ({"global_head_dim": 2**14}, "config.json: global_head_dim 16384: n_heads 8 heads of it are above run.c's limit"),
    ({"head_dim": 14}, "config.json: head_dim 14: the checkpoint's heads of layer 0 are not 14 wide "
                       "(model.language_model.layers.0.self_attn.q_norm.weight has shape [16])"),
    ({"global_head_dim": 64}, "config.json: global_head_dim 64: the checkpoint's heads of layer 4 are not 64 wide"),
    # a config that contradicts the checkpoint's tensors, naming both (issue 50): exported as the config says,
    # the per-layer inputs, or the full layers' v_proj, would be dropped; the sliding layers' window is not given
    ({"hidden_size_per_layer_input": 0}, "config.json: hidden_size_per_layer_input 0, but the checkpoint has the "
                                         "per-layer inputs (model.language_model.embed_tokens_per_layer.weight)"),
    ({"hidden_size_per_layer_input": None}, "config.json: hidden_size_per_layer_input null, but the checkpoint has"),
    ({"attention_k_eq_v": True, "num_global_key_value_heads": 1},
     "config.json: attention_k_eq_v true, but the checkpoint has the full layers' value projection "
     "(model.language_model.layers.4.self_attn.v_proj.weight)"),
    ({"sliding_window": None}, "config.json: sliding_window null, but layer_types has 8 sliding layers"),
    ({"hidden_size": None}, "config.json: hidden_size null must be an integer >= 1"),
])
def test_unsupported_gemma4_configs_are_refused_in_one_line(tmp_path, change, words):
    d = tmp_path / "e2b"
    config, _ = F.write_checkpoint(d, "gemma-4-E2B-it", "F32")
    config["text_config"].update(change)
    (d / "config.json").write_text(json.dumps(config))
    out = tmp_path / "out.bin"
    r = export(d, out, check=False)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("export.py: error:") and words in lines[0], lines
    assert not out.exists() and not list(tmp_path.glob("out.bin*"))


def test_without_per_layer_inputs_a_vocab_mismatch_does_not_matter(tmp_path):
    """hidden_size_per_layer_input 0 (31B): no bit 5, and vocab_size_per_layer_input unused."""
    d = tmp_path / "b31"
    config, _ = F.write_checkpoint(d, "gemma-4-31B", "F32")
    config["text_config"]["vocab_size_per_layer_input"] = 262144
    (d / "config.json").write_text(json.dumps(config))
    export(d, tmp_path / "out.bin")
    h = read_header((tmp_path / "out.bin").read_bytes())
    assert not h["block_flags"] & 32 and h["per_layer_input_dim"] == 0


def run_with(model, env, *args):
    import os
    import subprocess
    from conftest import RUN_BIN, RUN_PREFIX
    e = {k: v for k, v in os.environ.items() if k != "RUN_PLAIN"}
    e.update(env)
    r = subprocess.run(RUN_PREFIX + [RUN_BIN, str(model), *map(str, args)], capture_output=True, env=e, timeout=300,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_plain_loops_and_threads_give_the_same_bytes(exported, tmp_path):
    """Gemma 4's switches in the fast paths (per-layer head sizes in the attention tiles, the
    shared caches, the per-layer inputs' matmuls) compute what the plain loops compute, bit for
    bit, at 1 and 2 threads: a seeded story and the ppl CSV, a text crossing the windows and the
    sliding layers' rings."""
    model = exported[2]
    outs = set()
    for env in ({"OMP_NUM_THREADS": "1"}, {"OMP_NUM_THREADS": "2"}, {"RUN_PLAIN": "1", "OMP_NUM_THREADS": "2"}):
        csv = tmp_path / "nll.csv"
        story = run_with(model, env, "-z", TOK512, "-t", "0.9", "-s", "7", "-n", "300", "-p", TEXT[:60])
        run_with(model, env, "-z", TOK512, "-m", "ppl", "-p", LONG_TEXT, "--csv", csv)  # past the rings
        outs.add((story, csv.read_bytes()))
    assert len(outs) == 1


def test_inspect_marks_head_sizes_and_shared_layers(exported):
    config, model = exported[0], exported[2]
    c = g4.text_config(config)
    out = run(model, "-z", TOK512, "-m", "inspect", "-p", TEXT)
    assert out.returncode == 0, out.stderr
    layers = [line for line in out.stdout.decode().splitlines() if line.startswith("layers:")][0]
    sources = g4.kv_sources(c)
    for i, kind in enumerate(g4.layer_kinds(c)):
        entry = layers.split(": ", 1)[1].split(", ")[i]
        assert entry.startswith(f"L{i} {'rope full' if kind == 'full_attention' else 'rope2 sliding'}"), entry
        if kind == "sliding_attention":  # the header's head size is the full layers'
            assert f"head {g4.head_dim(c, i)}" in entry
        shared = sources[i] is not None and sources[i] != i
        assert (f"keys of L{sources[i]}" in entry) == shared, entry
