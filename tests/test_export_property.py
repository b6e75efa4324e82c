"""What export.py writes, run loads (issue 32, seam 1); and export.py's config reading under random input.

Property: for random Hugging Face configs (sizes, epsilons, thetas and the scaling
rules' parameters drawn across float32's range: normal, subnormal, rounding to 0,
overflowing) and random SentencePiece models (piece lengths up to past run's limit,
NaN and infinite scores), export.py either refuses with one "export.py: error:" line
and exit 1, or writes a file that run loads and computes with: -m rope, a short
greedy generation, -m tokenize. Seeded, so a failure reproduces; bounded (a few
dozen cases, well under 20 s, also under ASan).

The same property for every family (tests/family_fixtures.py's configs with their own
fields drawn wide: Gemma 2's soft-caps, query_pre_attn_scalar, Gemma 3's local theta,
longrope's factors, the activation), with ./run loading each file export.py writes.

Fuzz targets: export.py's config reading (config_from_json: hf_config, hf_rope; then
Config.check) on config.json values of random JSON types, for Llama and for each
family's own keys; and its tokenizer reading on random values in tokenizer.json,
tokenizer_config.json and generation_config.json. Every input ends in an ExportError
(one line, naming the key) or a result that passes its checks (a Config that packs into
a header; a TOKN file ./run loads), never another exception: main's "unexpected"
handler is a last resort these never reach. There is no hypothesis package here; a
seeded random generator stands in for it.
"""
import contextlib
import io
import json
import math
import random
import struct

import numpy as np
import pytest

from conftest import TOK512, load_export, run
from ropefile import write_random_checkpoint
from test_export_errors import safetensors_bytes, sentencepiece_model

export = load_export()

N_CONFIGS = 80
N_TOKENIZERS = 60
N_FUZZ = 3000


def call_export(*args):
    """(exit code, stdout, stderr) of export.py's main() in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = export.main([str(a) for a in args])
        except SystemExit as e:
            code = e.code
    return code, out.getvalue(), err.getvalue()


def assert_one_error_line(code, stderr, what):
    """A refusal is one stderr line: no warning or note printed before it."""
    assert code == 1, (what, code, stderr)
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("export.py: error: "), (what, stderr)
    assert "unexpected" not in lines[0], (what, stderr)


def assert_runs(r, what):
    err = r.stderr.decode("utf-8", "replace")
    assert r.returncode == 0, (what, err)
    assert "run: error" not in err and "Sanitizer" not in err and "runtime error:" not in err, (what, err)


# ----------------------------------------------------------------------------
# Random values across float32's range


def wild_float(rng, typical):
    """A float that is usually near typical, else tiny, subnormal in float32, 0 in float32, huge or overflowing."""
    if rng.random() < 0.8:
        return typical * rng.uniform(0.5, 2)
    return rng.choice([1e-40, 1.4e-45, 1e-46, 1e-300, 10 ** rng.uniform(-50, 40), 3e38, 1e39, 0.0, -typical])


def random_rope(rng):
    """A rope_scaling dict (or None) with parameters drawn wide."""
    kind = rng.choice([None, "linear", "yarn", "llama3"])
    if kind is None:
        return None
    rope = {"rope_type": kind, "factor": rng.choice([1.0, 2.0, 4.0, 0.5, 1e30, 1e39, 10 ** rng.uniform(0, 5)])}
    if rng.random() < 0.5:
        rope["original_max_position_embeddings"] = rng.choice([8, 16, 2**20, 2**21, 0])
    if kind == "yarn":
        for key, typical in (("beta_fast", 32.0), ("beta_slow", 1.0), ("attention_factor", 1.2)):
            if rng.random() < 0.6:
                rope[key] = wild_float(rng, typical)
        if rng.random() < 0.2:
            rope.update(mscale=wild_float(rng, 1.0), mscale_all_dim=wild_float(rng, 1.0))
    if kind == "llama3":
        rope["low_freq_factor"] = wild_float(rng, 1.0)
        rope["high_freq_factor"] = wild_float(rng, 4.0)
    return rope


def random_config(rng):
    heads = rng.choice([1, 2])
    head_dim = rng.choice([2, 4, 8, 64])
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": heads * head_dim, "intermediate_size": rng.choice([4, 8]), "num_hidden_layers": 1,
        "num_attention_heads": heads, "num_key_value_heads": rng.choice([1, heads]),
        "vocab_size": rng.choice([3, 5, 16, 16, 16, 2]),
        "max_position_embeddings": rng.choice([1, 8, 64, 64, 512, 4096, 2**20 + 1]),
        "rms_norm_eps": wild_float(rng, 1e-5), "rope_theta": wild_float(rng, 10000.0),
        "rope_scaling": random_rope(rng), "tie_word_embeddings": rng.random() < 0.5,
        "partial_rotary_factor": rng.choice([1.0, 1.0, 0.5, 0.0]),
    }


def hf_directory(path, config, seed):
    """config.json and random small weights of the shapes the config names."""
    rng = np.random.default_rng(seed)
    dim, hidden, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    head_dim = dim // config["num_attention_heads"]
    kv = config["num_key_value_heads"] * head_dim
    shapes = {"model.embed_tokens.weight": (vocab, dim), "model.norm.weight": (dim,),
              "model.layers.0.input_layernorm.weight": (dim,), "model.layers.0.post_attention_layernorm.weight": (dim,),
              "model.layers.0.self_attn.q_proj.weight": (dim, dim), "model.layers.0.self_attn.k_proj.weight": (kv, dim),
              "model.layers.0.self_attn.v_proj.weight": (kv, dim), "model.layers.0.self_attn.o_proj.weight": (dim, dim),
              "model.layers.0.mlp.gate_proj.weight": (hidden, dim), "model.layers.0.mlp.up_proj.weight": (hidden, dim),
              "model.layers.0.mlp.down_proj.weight": (dim, hidden)}
    if not config["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (vocab, dim)
    tensors = {name: ("F32", shape, (rng.standard_normal(shape) * 0.5).astype("<f4").tobytes())
               for name, shape in shapes.items()}
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    (path / "model.safetensors").write_bytes(safetensors_bytes(tensors))
    return path


def tokenizer_bin(vocab_size):
    """llama2.c's tokenizer.bin with vocab_size pieces: <unk>, <s>, </s>, then letters."""
    pieces = [b"<unk>", b"<s>", b"</s>"] + [bytes([97 + i % 26]) * (1 + i // 26) for i in range(vocab_size - 3)]
    out = struct.pack("<i", max(len(p) for p in pieces))
    for i, p in enumerate(pieces):
        out += struct.pack("<fi", -float(i), len(p)) + p
    return out


# ----------------------------------------------------------------------------
# The property


def export_and_load(model, out, tokenizer, what):
    """True when export.py writes out and ./run loads it and generates with it (-z tokenizer); False
    when export.py refuses in one line, writing nothing."""
    code, _, stderr = call_export(model, out)
    if code != 0:
        assert_one_error_line(code, stderr, what)
        assert not out.exists()
        return False
    assert_runs(run(out, "-m", "rope"), what)
    assert_runs(run(out, "-z", tokenizer, "-t", "0", "-n", "3", "-p", ""), what)  # BOS only: seq_len may be 1
    return True


def test_every_checkpoint_export_writes_run_loads(tmp_path):
    rng = random.Random(32)
    written = 0
    for case in range(N_CONFIGS):
        config = random_config(rng)
        model = hf_directory(tmp_path / f"hf{case}", config, case)
        tok = tmp_path / f"tok{case}.bin"
        tok.write_bytes(tokenizer_bin(config["vocab_size"]))
        written += export_and_load(model, tmp_path / f"out{case}.bin", tok, f"case {case}: {json.dumps(config)}")
    # not vacuous: both outcomes occur
    assert N_CONFIGS // 5 <= written <= N_CONFIGS - N_CONFIGS // 5, written


def random_pieces(rng, n):
    alphabet = ["a", "b", " ", "\u2581", "\u00e9", "\u65e5", "<", ">", "\n"]
    pieces = []
    for _ in range(n):
        length = rng.choice([0, 1, 2, 5, 340, 1024, 1025, rng.randint(1, 1100)])
        text = "".join(rng.choice(alphabet) for _ in range(length))
        score = rng.choice([0.0, -1.0, rng.uniform(-1e4, 1e4), -3e38, float("nan"), float("inf"), float("-inf")]
                           if rng.random() < 0.3 else [rng.uniform(-100, 0)])
        pieces.append((text, score))
    return pieces


def test_every_tokenizer_export_writes_run_loads(tmp_path):
    rng = random.Random(320)
    written = refused = 0
    for case in range(N_TOKENIZERS):
        n = rng.choice([3, 4, 8, 20])
        pieces = random_pieces(rng, n)
        bos, eos = rng.choice([(None, None), (-1, -1), (1, 2), (0, n + 3)])
        model = tmp_path / f"sp{case}.model"
        model.write_bytes(sentencepiece_model(pieces, bos_id=bos, eos_id=eos))
        out = tmp_path / f"tok{case}.bin"
        what = f"case {case}: {n} pieces, bos {bos}, eos {eos}, lengths {[len(p.encode()) for p, _ in pieces]}"
        code, _, stderr = call_export("--tokenizer", model, "-o", out)
        if code != 0:
            assert_one_error_line(code, stderr, what)
            refused += 1
            continue
        written += 1
        checkpoint = write_random_checkpoint(tmp_path / f"m{case}.bin", dim=8, hidden_dim=8, n_layers=1, n_heads=1,
                                             n_kv_heads=1, vocab_size=n, seq_len=16)
        assert_runs(run(checkpoint, "-z", out, "-m", "tokenize", "-p", "ab \u00e9"), what)
    assert written >= N_TOKENIZERS // 5 and refused >= N_TOKENIZERS // 5, (written, refused)


# ----------------------------------------------------------------------------
# Fuzz target: config reading on values of random JSON types

CONFIG_KEYS = ["architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
               "num_attention_heads", "num_key_value_heads", "vocab_size", "max_position_embeddings", "rms_norm_eps",
               "rope_theta", "rope_scaling", "rope_parameters", "hidden_act", "tie_word_embeddings", "attention_bias",
               "mlp_bias", "sliding_window", "head_dim", "partial_rotary_factor", "original_max_position_embeddings"]
ROPE_KEYS = ["rope_type", "type", "factor", "original_max_position_embeddings", "attention_factor", "beta_fast",
             "beta_slow", "mscale", "mscale_all_dim", "truncate", "low_freq_factor", "high_freq_factor",
             "rope_theta", "partial_rotary_factor"]


def random_json(rng, depth=0):
    """A JSON value of a random type: null, booleans, numbers and strings that mean something to a config
    reader, lists, and (two levels deep at most) objects with rope keys."""
    makers = [lambda: None, lambda: True, lambda: False,
              lambda: rng.choice([0, 1, 2, 8, -1, 2**31, 2**63, 10**30]),
              lambda: rng.choice([0.0, 0.5, 1.0, 4.0, 1e-50, 1e39, -2.0, 1e308]),
              lambda: rng.choice(["", "false", "true", "yarn", "linear", "llama3", "default", "dynamic", "silu",
                                  "llama", "LlamaForCausalLM", "4096"]),
              lambda: rng.choice([[], ["LlamaForCausalLM"], [1], ["x", None]]),
              lambda: [random_json(rng, depth + 1) for _ in range(rng.randrange(3))],
              lambda: {rng.choice(ROPE_KEYS): random_json(rng, depth + 1) for _ in range(rng.randrange(4))}]
    return makers[rng.randrange(len(makers) if depth < 2 else len(makers) - 2)]()


def base_config():
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8, "intermediate_size": 12,
            "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 16,
            "max_position_embeddings": 32, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
            "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8},
            "tie_word_embeddings": True}


def read_config(config):
    """export.py's reading of a config.json, up to the checks before any tensor is read."""
    _, c, _ = export.config_from_json(config)
    c.check()
    return c


def fuzz_read(config, what, outcomes, reader=read_config):
    """reader(config), or None when it is refused in one line; counted in outcomes. Any other
    exception fails the test: the reader met a value it did not check."""
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # warnings
            c = reader(config)
    except export.ExportError as e:
        outcomes["refused"] += 1
        assert "\n" not in " ".join(str(e).split()), (what, config, e)
        return None
    except Exception as e:
        pytest.fail(f"{what}: {type(e).__name__}: {e}\nconfig: {json.dumps(config)}")
    outcomes["accepted"] += 1
    return c


def test_config_reading_fuzz():
    rng = random.Random(3232)
    outcomes = {"accepted": 0, "refused": 0}
    for case in range(N_FUZZ):
        config = base_config()
        for _ in range(rng.randint(1, 3)):
            target = config["rope_scaling"] if rng.random() < 0.4 and isinstance(config.get("rope_scaling"), dict) \
                else config
            keys = ROPE_KEYS if target is not config else CONFIG_KEYS
            target[rng.choice(keys)] = random_json(rng)
        c = fuzz_read(config, f"case {case}", outcomes)
        if c is None:
            continue
        # what was accepted has the types the header stores
        assert all(isinstance(getattr(c, k), int) and not isinstance(getattr(c, k), bool)
                   for k in ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len"))
        assert isinstance(c.shared_classifier, bool)
        assert math.isfinite(export.f32(c.rope_theta)) and export.f32(c.norm_eps) > 0
    assert outcomes["accepted"] > N_FUZZ // 20 and outcomes["refused"] > N_FUZZ // 20, outcomes


# ----------------------------------------------------------------------------
# Fuzz target: every family's config.json (the keys each family reads besides Llama's)

import family_fixtures  # noqa: E402  (tests/ is on sys.path: conftest.py)

FAMILY_KEYS = CONFIG_KEYS + ["query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping",
                             "rope_local_base_freq", "hidden_activation", "layer_types", "sliding_window_pattern",
                             "_sliding_window_pattern", "no_rope_layers", "no_rope_layer_interval",
                             "use_sliding_window", "max_window_layers", "torch_dtype", "dtype", "text_config",
                             "num_experts", "vision_config"]
FAMILY_ROPE_KEYS = ROPE_KEYS + ["short_factor", "long_factor"]
N_FAMILY_FUZZ = 1000


def family_json(rng, length):
    """random_json, or a value of the shapes the family keys take: lists of layer types, of 0/1 flags, of
    factors (length: the family's own list length, or another), the GELU names, dtype names."""
    n = rng.choice([length, length, 1, 0, length + 1])
    makers = [lambda: random_json(rng),
              lambda: [rng.choice(["sliding_attention", "full_attention", "x", 0, None]) for _ in range(n)],
              lambda: [rng.choice([0, 1, 1, 2, True, -1]) for _ in range(n)],
              lambda: [rng.choice([1.0, 1.5, 32.0, 0.0, -1.0, 1e-40, 1e-46, 1e39, 10**400, "1", None, True])
                       if rng.random() < 0.2 else rng.uniform(1, 40) for _ in range(n)],
              lambda: rng.choice(["gelu", "gelu_pytorch_tanh", "gelu_new", "silu", "bfloat16", "float16", "float32",
                                  "gemma3_text", "longrope", "sliding_attention"]),
              lambda: wild_float(rng, rng.choice([50.0, 256.0, 10000.0, 1.0]))]
    return makers[rng.randrange(len(makers))]()


def text_config(config):
    return config["text_config"] if config.get("model_type") == "gemma3" else config


@pytest.mark.parametrize("name", sorted(family_fixtures.REAL_CONFIGS))
def test_family_config_reading_fuzz(name):
    """config.json of each family with random values: an ExportError (one line) or a Config that passes
    its checks and packs into a header; never another exception (main's "unexpected" handler)."""
    rng = random.Random(f"family {name}")
    outcomes = {"accepted": 0, "refused": 0}
    for case in range(N_FAMILY_FUZZ):
        config = family_fixtures.shrink(name)
        text = text_config(config)
        length = text["num_hidden_layers"]
        for _ in range(rng.randint(1, 3)):
            rope = text.get("rope_scaling")
            if isinstance(rope, dict) and rng.random() < 0.3:
                key = rng.choice(FAMILY_ROPE_KEYS)
                rope[key] = family_json(rng, 48)  # Phi-4-mini: 48 factors per set
            else:
                target = config if rng.random() < 0.1 else text
                target[rng.choice(FAMILY_KEYS)] = family_json(rng, length)
        c = fuzz_read(config, f"{name} case {case}", outcomes)
        if c is not None:
            export.rope_header(c, "f32", export.ROPE_VERSION_2)  # every value fits the field it is stored in
    assert outcomes["accepted"] > N_FAMILY_FUZZ // 20 and outcomes["refused"] > N_FAMILY_FUZZ // 20, outcomes


# ----------------------------------------------------------------------------
# Fuzz target: tokenizer.json, tokenizer_config.json and generation_config.json

from test_export_tokenizer import TEMPLATES, byte_level_json, sentencepiece_json  # noqa: E402

N_TOKENIZER_FUZZ = 600
TOKENIZER_KEYS = {  # where in the files, and the keys a reader looks at there
    "tokenizer.json": ["added_tokens", "normalizer", "pre_tokenizer", "post_processor", "decoder", "model"],
    "model": ["type", "vocab", "merges", "byte_fallback", "dropout", "ignore_merges", "continuing_subword_prefix"],
    "post_processor": ["type", "single", "special_tokens", "processors"],
    "added_token": ["id", "content", "special", "lstrip", "normalized"],
    "tokenizer_config.json": ["bos_token", "eos_token", "add_bos_token", "chat_template"],
    "generation_config.json": ["eos_token_id"],
}


def tokenizer_json_value(rng):
    """random_json, or a value of the shapes tokenizer files hold: token texts (one with a lone surrogate,
    a byte piece in lower case), ids in and out of range, special-token objects, templates."""
    makers = [lambda: random_json(rng),
              lambda: rng.choice(["<s>", "</s>", "<unk>", "<|endoftext|>", "<|im_end|>", "\ud800", "<0x0a>", "h",
                                  "\u2581", "BPE", "ByteLevel", "TemplateProcessing", "Sequence"]),
              lambda: rng.choice([-1, 0, 1, 2, 6, 258, 259, 10**6, 2**31, [6], [1, 2], [[6]], [-1], ["6"]]),
              lambda: {rng.choice(["content", "id", "ids", "<s>", "<|endoftext|>"]): tokenizer_json_value(rng)},
              lambda: [{"SpecialToken": {"id": rng.choice(["<s>", "<|endoftext|>", 5, None])}},
                       {"Sequence": {"id": "A"}}][:rng.randint(0, 2)],
              lambda: rng.choice([t for t, _ in TEMPLATES.values()])]
    return makers[rng.randrange(len(makers))]()


def fuzzed_tokenizer_files(rng):
    """(tokenizer.json, tokenizer_config.json, generation_config.json) of a good tokenizer, then 1-3 values changed."""
    if rng.random() < 0.5:
        files = [byte_level_json(extra=["<|im_end|>", "<|im_start|>"]),
                 {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}, {}]
    else:
        files = [sentencepiece_json(), {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True}, {}]
    for _ in range(rng.randint(1, 3)):
        where = rng.choice(list(TOKENIZER_KEYS))
        added = files[0].get("added_tokens")
        target = {"tokenizer.json": files[0], "model": files[0].get("model"), "tokenizer_config.json": files[1],
                  "generation_config.json": files[2], "post_processor": files[0].get("post_processor"),
                  "added_token": rng.choice(added) if isinstance(added, list) and added else None}[where]
        if isinstance(target, dict):
            target[rng.choice(TOKENIZER_KEYS[where])] = tokenizer_json_value(rng)
    return files


def test_tokenizer_reading_fuzz(tmp_path):
    """Every input ends in one error line (never main's "unexpected" handler) or a TOKN file run loads."""
    rng = random.Random(3233)
    checkpoint = write_random_checkpoint(tmp_path / "m.bin", dim=8, hidden_dim=8, n_layers=1, n_heads=1,
                                         n_kv_heads=1, vocab_size=300, seq_len=16)
    outcomes = {"accepted": 0, "refused": 0}
    for case in range(N_TOKENIZER_FUZZ):
        files = fuzzed_tokenizer_files(rng)
        folder = tmp_path / f"t{case}"
        folder.mkdir()
        for name, content in zip(["tokenizer.json", "tokenizer_config.json", "generation_config.json"], files):
            (folder / name).write_text(json.dumps(content))  # ASCII: a lone surrogate stays a valid escape
        out = tmp_path / f"t{case}.bin"
        code, _, stderr = call_export("--tokenizer", folder / "tokenizer.json", "-o", out)
        what = f"case {case}: {json.dumps(files)[:3000]}"
        if code != 0:
            lines = stderr.splitlines()
            assert code in (1, 2) and len(lines) == 1 and lines[0].startswith("export.py: error: "), (what, stderr)
            assert "unexpected" not in lines[0], (what, stderr)
            outcomes["refused"] += 1
            continue
        outcomes["accepted"] += 1
        if struct.unpack_from("<i", out.read_bytes(), 12)[0] <= 300:  # n_tokens: a tokenizer of this model
            assert_runs(run(checkpoint, "-z", out, "-m", "tokenize", "-p", "hi <|im_end|> \u00e9"), what)
    assert outcomes["accepted"] > N_TOKENIZER_FUZZ // 20 and outcomes["refused"] > N_TOKENIZER_FUZZ // 20, outcomes


# ----------------------------------------------------------------------------
# The property for every family: random values of the fields each family adds

N_FAMILY_CONFIGS = 44


def random_family_config(rng, name):
    """A small config of model `name` with its own fields (soft-caps, the attention scalar, the local theta,
    longrope's factors, the activation) and the shared ones drawn across float32's range."""
    config = family_fixtures.shrink(name)
    text = text_config(config)
    draws = {
        "rope_theta": lambda: wild_float(rng, 10000.0),
        "rms_norm_eps": lambda: wild_float(rng, 1e-6),
        "query_pre_attn_scalar": lambda: wild_float(rng, 256.0),
        "attn_logit_softcapping": lambda: rng.choice([None, wild_float(rng, 50.0)]),
        "final_logit_softcapping": lambda: rng.choice([None, wild_float(rng, 30.0)]),
        "rope_local_base_freq": lambda: wild_float(rng, 10000.0),
        "hidden_activation": lambda: rng.choice(["gelu_pytorch_tanh", "gelu", None]),
        "max_position_embeddings": lambda: rng.choice([1, 8, 64, 1024, 2**20 + 1]),
    }
    for key in rng.sample(sorted(draws), rng.randint(1, 3)):
        text[key] = draws[key]()
    rope = text.get("rope_scaling")
    if isinstance(rope, dict) and rope.get("long_factor") and rng.random() < 0.7:
        which = rng.choice(["short_factor", "long_factor"])
        i = rng.randrange(len(rope[which]))
        rope[which][i] = wild_float(rng, rope[which][i])
    return config


def test_every_family_export_writes_run_loads(tmp_path):
    rng = random.Random(3234)
    names = sorted(family_fixtures.REAL_CONFIGS)
    written = 0
    for case in range(N_FAMILY_CONFIGS):
        name = names[case % len(names)]
        config = random_family_config(rng, name)
        what = f"case {case} ({name}): {json.dumps(family_fixtures._text(config))[:3000]}"
        family_fixtures.write_checkpoint(tmp_path / f"hf{case}", name, config=config)
        written += export_and_load(tmp_path / f"hf{case}", tmp_path / f"out{case}.bin", TOK512, what)
    assert N_FAMILY_CONFIGS // 5 <= written <= N_FAMILY_CONFIGS - N_FAMILY_CONFIGS // 5, written


# ----------------------------------------------------------------------------
# Fuzz target: Gemma 4's text_config and the mixtures of experts' keys

import gemma4_fixtures  # noqa: E402
import moe_fixtures  # noqa: E402

GEMMA4_MODELS = ["gemma-4-E2B-it", "gemma-4-E4B", "gemma-4-31B", "gemma-4-26B-A4B"]
EXPERT_MODELS = ["Qwen3-30B-A3B", "Mixtral-8x7B-v0.1"]
# every key of Gemma 4's published text_config (E2B's and 26B-A4B's: the per-layer inputs, KV
# sharing, k = v, the head sizes, the experts), and of the experts families' config.json
GEMMA4_KEYS = sorted(set(gemma4_fixtures._E2B_TEXT) | set(moe_fixtures.GEMMA4_26B_TEXT) | {"text_config"})
EXPERT_KEYS = sorted(set(moe_fixtures.REAL_CONFIGS["Qwen3-30B-A3B"]) | set(moe_fixtures.REAL_CONFIGS["Mixtral-8x7B-v0.1"]))
N_GEMMA4_FUZZ = 500  # per model


def shrunk(name):
    """A small config of a Gemma 4 or experts model (tests/gemma4_fixtures.py, tests/moe_fixtures.py)."""
    if name == "gemma-4-26B-A4B":
        return moe_fixtures.shrink_gemma4(name)
    if name.startswith("gemma-4"):
        return gemma4_fixtures.shrink(name)
    return moe_fixtures.shrink(name)


def near(rng, value):
    """An integer near a size the config gives (one off, odd, halved, doubled), or at the edges."""
    return rng.choice([value - 1, value + 1, value // 2, 2 * value, value + 1 - value % 2, 0, -value, 1, 15,
                       2**16, 2**20 + 1, 2**31 - 1, 2**31])


def read_any_config(config):
    """export.py's reading of a config.json up to the checks before a tensor is read: Gemma 4's
    reader for gemma4 and gemma4_text, config_from_json for the others."""
    if config.get("model_type") in ("gemma4", "gemma4_text"):
        c = export.gemma4_config(export.text_config(config)[0])[0]
        c.check()
        return c
    return read_config(config)


@pytest.mark.parametrize("name", GEMMA4_MODELS + EXPERT_MODELS)
def test_gemma4_and_expert_config_reading_fuzz(name):
    """Every key of text_config (Gemma 4) or config.json (Qwen3-MoE, Mixtral), the head sizes, the
    per-layer inputs, KV sharing and the experts' among them, with values of random JSON types and
    sizes near the real ones: an ExportError (one line) or a Config that passes its checks and packs
    into a header; never another exception (main's "unexpected" handler)."""
    rng = random.Random(f"gemma4 and experts {name}")
    outcomes = {"accepted": 0, "refused": 0}
    for case in range(N_GEMMA4_FUZZ):
        config = shrunk(name)
        text = config.get("text_config", config)
        keys = GEMMA4_KEYS if name.startswith("gemma-4") else EXPERT_KEYS
        for _ in range(rng.randint(1, 3)):
            rope = text.get("rope_parameters") if isinstance(text, dict) else None
            if isinstance(rope, dict) and rng.random() < 0.2:
                kind = rope.get(rng.choice(["full_attention", "sliding_attention"]))
                if isinstance(kind, dict):
                    kind[rng.choice(ROPE_KEYS)] = family_json(rng, 1)
                    continue
            key = rng.choice(keys)
            target = config if key == "text_config" or not isinstance(text, dict) else text
            value = text.get(key) if isinstance(text, dict) else None
            if is_size(value) and rng.random() < 0.6:
                target[key] = near(rng, value)
            else:
                layers = text.get("num_hidden_layers") if isinstance(text, dict) else None
                target[key] = family_json(rng, layers if is_size(layers) and layers < 100 else 2)
        c = fuzz_read(config, f"{name} case {case}", outcomes, read_any_config)
        if c is not None:
            export.rope_header(c, "f32", export.ROPE_VERSION_2)  # every value fits the field it is stored in
    assert outcomes["accepted"] > N_GEMMA4_FUZZ // 20 and outcomes["refused"] > N_GEMMA4_FUZZ // 20, outcomes


def is_size(value):
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


# ----------------------------------------------------------------------------
# The property for Gemma 4 and the experts: a checkpoint whose config.json then changes

N_GEMMA4_CHECKPOINTS = 30
ISSUE_50_KEYS = {"head_dim", "global_head_dim", "hidden_size_per_layer_input", "num_kv_shared_layers", "sliding_window",
                 "rope_parameters", "attention_k_eq_v", "enable_moe_block", "moe_intermediate_size", "top_k_experts",
                 "num_experts", "num_local_experts", "num_experts_per_tok", "decoder_sparse_step", "mlp_only_layers"}


def write_shrunk(directory, name):
    """The small checkpoint of `name` (its weights are the unchanged config's); its config."""
    if name == "gemma-4-26B-A4B":
        return moe_fixtures.write_checkpoint_gemma4(directory, name, "F32", seed=1)[0]
    if name.startswith("gemma-4"):
        return gemma4_fixtures.write_checkpoint(directory, name, "F32", seed=1)[0]
    return moe_fixtures.write_checkpoint(directory, name, "F32", seed=1)[0]


def test_every_gemma4_and_expert_export_writes_run_loads(tmp_path):
    """A checkpoint's config.json with one to three keys changed (a size near its own, null, removed, a
    boolean flipped), so that it may contradict the tensors: export.py refuses in one line (naming what
    contradicts what), or writes a file ./run loads and generates with."""
    rng = random.Random(3235)
    names = GEMMA4_MODELS + EXPERT_MODELS
    written = 0
    for case in range(N_GEMMA4_CHECKPOINTS):
        name = names[case % len(names)]
        directory = tmp_path / f"hf{case}"
        config = write_shrunk(directory, name)
        text = config.get("text_config", config)
        keys = GEMMA4_KEYS[:-1] if name.startswith("gemma-4") else EXPERT_KEYS  # text_config's own keys
        # half of them the keys issue 50 names (head sizes, per-layer inputs, KV sharing, window, experts)
        named = [key for key in keys if key in ISSUE_50_KEYS]
        for key in {rng.choice(named if rng.random() < 0.5 else keys) for _ in range(rng.randint(1, 3))}:
            value = text.get(key)
            change = rng.choice(["near", "null", "remove", "flip"])
            if change == "remove":
                text.pop(key, None)
            elif change == "null":
                text[key] = None
            elif is_size(value) and change == "near":
                text[key] = rng.choice([value - 1, value + 1, value // 2, 2 * value, 0])
            elif isinstance(value, bool):
                text[key] = not value
        (directory / "config.json").write_text(json.dumps(config))
        what = f"case {case} ({name}): {json.dumps(text)[:3000]}"
        written += export_and_load(directory, tmp_path / f"out{case}.bin", TOK512, what)
    assert N_GEMMA4_CHECKPOINTS // 5 <= written <= N_GEMMA4_CHECKPOINTS - N_GEMMA4_CHECKPOINTS // 5, written
