"""What export.py writes, run loads (issue 32, seam 1); and export.py's config reading under random input.

Property: for random Hugging Face configs (sizes, epsilons, thetas and the scaling
rules' parameters drawn across float32's range: normal, subnormal, rounding to 0,
overflowing) and random SentencePiece models (piece lengths up to past run's limit,
NaN and infinite scores), export.py either refuses with one "export.py: error:" line
and exit 1, or writes a file that run loads and computes with: -m rope, a short
greedy generation, -m tokenize. Seeded, so a failure reproduces; bounded (a few
dozen cases, well under 20 s, also under ASan).

Fuzz target: export.py's config reading (hf_config, hf_rope, Config.check) on
config.json values of random JSON types: every input ends in an ExportError (one
line, naming the key) or a Config that passes its checks, never another exception.
There is no hypothesis package here; a seeded random generator stands in for it.
"""
import contextlib
import importlib.util
import io
import json
import math
import random
import struct
import subprocess

import numpy as np
import pytest

from conftest import ROOT, run
from ropefile import write_random_checkpoint
from test_export_errors import safetensors_bytes, sentencepiece_model

_spec = importlib.util.spec_from_file_location("export_for_property", ROOT / "export.py")
export = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(export)

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
    assert code == 1, (what, code, stderr)
    lines = stderr.splitlines()
    errors = [line for line in lines if line.startswith("export.py: error: ")]
    assert len(errors) == 1 and "unexpected" not in errors[0], (what, stderr)
    assert all(line.startswith("export.py: warning: ") for line in lines if line not in errors), (what, stderr)


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


def test_every_checkpoint_export_writes_run_loads(tmp_path):
    rng = random.Random(32)
    written = refused = 0
    for case in range(N_CONFIGS):
        config = random_config(rng)
        what = f"case {case}: {json.dumps(config)}"
        model = hf_directory(tmp_path / f"hf{case}", config, case)
        out = tmp_path / f"out{case}.bin"
        code, _, stderr = call_export(model, out)
        if code != 0:
            assert_one_error_line(code, stderr, what)
            assert not out.exists()
            refused += 1
            continue
        written += 1
        assert_runs(run(out, "-m", "rope"), what)
        tok = tmp_path / f"tok{case}.bin"
        tok.write_bytes(tokenizer_bin(config["vocab_size"]))
        assert_runs(run(out, "-z", tok, "-t", "0", "-n", "3", "-p", ""), what)  # BOS only: seq_len may be 1
    # not vacuous: both outcomes occur
    assert written >= N_CONFIGS // 5 and refused >= N_CONFIGS // 5, (written, refused)


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
    c = export.hf_config(config)
    c.rope_theta, c.rope_fraction, scaling, _ = export.hf_rope(config, c.head_dim, c.seq_len)
    c.set_scaling(**scaling)
    c.check()
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
        try:
            with contextlib.redirect_stderr(io.StringIO()):  # warnings
                c = read_config(config)
        except export.ExportError as e:
            outcomes["refused"] += 1
            assert "\n" not in " ".join(str(e).split()), (case, config, e)
            continue
        except Exception as e:  # anything else is a bug: the reader met a value it did not check
            pytest.fail(f"case {case}: {type(e).__name__}: {e}\nconfig: {json.dumps(config)}")
        outcomes["accepted"] += 1
        # what was accepted has the types the header stores
        assert all(isinstance(getattr(c, k), int) and not isinstance(getattr(c, k), bool)
                   for k in ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len"))
        assert isinstance(c.shared_classifier, bool)
        assert math.isfinite(export.f32(c.rope_theta)) and export.f32(c.norm_eps) > 0
    assert outcomes["accepted"] > N_FUZZ // 20 and outcomes["refused"] > N_FUZZ // 20, outcomes
