"""export.py and RoPE scaling rules: what it writes in the ROPE header's rule fields (bytes
52..83, /work/notes/scaling_spec.md's byte table) for Hugging Face configs of rope_type
linear, yarn and llama3 (and proportional), what it refuses, --legacy, carrying the fields
through ROPE / llama2.c files, and the progress line of a big export.

Run with: /usr/bin/python3 -m pytest tests/test_export_scaling.py

Most exports run in-process (export.main) to keep this quick; the exit codes and the
one-line messages of a real process are checked with subprocesses for a few of them.
Nothing here runs ./run: whether run.c reads the fields as it should is tested elsewhere.
"""
import json
import math
import re
import struct
import subprocess
import sys

import numpy as np
import pytest

import hf_fixture
from conftest import ROOT, STORIES, load_export

EXPORT = ROOT / "export.py"
export = load_export()

# head_dim 16 (8 pairs); max_position_embeddings (the header's seq_len) 128
SIZES = dict(dim=32, hidden_dim=48, n_layers=1, n_heads=2, n_kv_heads=1, vocab_size=64, seq_len=128)
MAX_LEN = SIZES["seq_len"]

# The rule fields, straight from the spec's byte table: (name, offset, struct code)
RULE_FIELDS = [("rope_factor", 52, "f"), ("rope_scaling", 56, "i"), ("rope_original_len", 60, "i"),
               ("yarn_beta_fast", 64, "f"), ("yarn_beta_slow", 68, "f"), ("rope_attention_factor", 72, "f"),
               ("llama3_low_freq_factor", 76, "f"), ("llama3_high_freq_factor", 80, "f")]
NONE, LINEAR, NTK, YARN, LLAMA3 = range(5)
NO_RULE = dict(rope_factor=1.0, rope_scaling=NONE, rope_original_len=0, yarn_beta_fast=0.0, yarn_beta_slow=0.0,
               rope_attention_factor=0.0, llama3_low_freq_factor=0.0, llama3_high_freq_factor=0.0)


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def read_header(path):
    """{field: value} of a ROPE file's header: theta, p, seq_len and the rule fields."""
    data = open(path, "rb").read(256)
    assert struct.unpack_from("<I", data)[0] == 0x45504F52
    assert not any(data[84:256]), "reserved bytes 84..255 must stay zero"
    fields = {name: struct.unpack_from("<" + code, data, offset)[0] for name, offset, code in RULE_FIELDS}
    fields.update(seq_len=struct.unpack_from("<i", data, 32)[0], rope_theta=struct.unpack_from("<f", data, 44)[0],
                  rope_fraction=struct.unpack_from("<f", data, 48)[0])
    return fields


def rule_fields(header):
    return {name: header[name] for name, _, _ in RULE_FIELDS}


def expect(**changes):
    """NO_RULE with these fields changed, rounded to float32 as the header stores them."""
    fields = dict(NO_RULE, **changes)
    return {k: v if isinstance(v, int) else f32(v) for k, v in fields.items()}


def make_model(directory, rope, layout="v4", top_level=None):
    """A tiny HF checkpoint (tests/hf_fixture.py); top_level: config.json keys to add or change."""
    hf_fixture.make_hf_checkpoint(directory, **SIZES, rope=rope, layout=layout)
    if top_level:
        path = directory / "config.json"
        config = json.loads(path.read_text())
        config.update(top_level)
        path.write_text(json.dumps(config))
    return directory


def run_in_process(capsys, *args):
    """(exit code, stdout, stderr) of export.main(args)."""
    try:
        code = export.main([str(a) for a in args])
    except SystemExit as e:  # a bad command line
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def export_ok(capsys, model, out, *flags):
    code, stdout, stderr = run_in_process(capsys, model, out, *flags)
    assert code == 0, stderr
    return stdout, stderr


def assert_refused(capsys, model, out, *words, flags=()):
    """Exit code 1 and exactly one 'export.py: error:' line containing the words; no output file."""
    code, _, stderr = run_in_process(capsys, model, out, *flags)
    assert code == 1, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("export.py: error: "), stderr
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert not out.exists()
    return lines[0]


# ----------------------------------------------------------------------------
# The supported rules: the header fields, for both config layouts, with and without
# partial_rotary_factor, with and without original_max_position_embeddings

LAYOUTS = {  # (hf_fixture layout, extra rope keys)
    "v4 rope_scaling, rope_type": ("v4", {}),
    "v4 rope_scaling, legacy type": ("v4", {"type_key": "type"}),
    "v5 rope_parameters": ("v5", {}),
}
RULES = {  # rope keys, the fields they give (original: the original length given, or None)
    "linear": ({"type": "linear", "factor": 2.0},
               lambda original: expect(rope_factor=2.0, rope_scaling=LINEAR, rope_original_len=original or 0)),
    "yarn": ({"type": "yarn", "factor": 4.0, "beta_fast": 16.0, "beta_slow": 2.0},
             lambda original: expect(rope_factor=4.0, rope_scaling=YARN, rope_original_len=original or MAX_LEN,
                                     yarn_beta_fast=16.0, yarn_beta_slow=2.0)),
    "llama3": ({"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
               lambda original: expect(rope_factor=8.0, rope_scaling=LLAMA3, rope_original_len=original or MAX_LEN,
                                       llama3_low_freq_factor=1.0, llama3_high_freq_factor=4.0)),
}


@pytest.mark.parametrize("original", [None, 32], ids=["no original", "original 32"])
@pytest.mark.parametrize("partial", [None, 0.5], ids=["full rotary", "partial 0.5"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("rule", RULES)
def test_rule_fields_in_header(tmp_path, capsys, rule, layout, partial, original):
    rope, fields = RULES[rule]
    fixture_layout, extra = LAYOUTS[layout]
    rope = dict(rope, **extra, partial_rotary_factor=partial,
                original_max_position_embeddings=hf_fixture.OMIT if original is None else original)
    model = make_model(tmp_path / "m", rope, fixture_layout)
    config = json.loads((model / "config.json").read_text())
    assert ("original_max_position_embeddings" in json.dumps(config)) == (original is not None)
    stdout, stderr = export_ok(capsys, model, tmp_path / "out.bin")
    header = read_header(tmp_path / "out.bin")
    assert rule_fields(header) == fields(original)
    assert header["seq_len"] == MAX_LEN
    if partial is None:  # theta and p as before: the rule does not change them
        assert (header["rope_theta"], header["rope_fraction"]) == (10000.0, 1.0)
        assert stderr == ""
    else:  # GPT-NeoX partial rotary: theta = base^(1/f), p = f, as without a rule
        assert (header["rope_theta"], header["rope_fraction"]) == (1e8, 0.5)
        assert stderr == ("export.py: partial_rotary_factor 0.5 (GPT-NeoX semantics) stored exactly as p-RoPE "
                          "with theta = 1e+08, p = 0.5\n")
    assert re.search(rf", rope {rule} x\d+( \(.*\))?$", stdout.strip()), stdout  # the summary names the rule


@pytest.mark.parametrize("rope, summary", [
    ({"type": "linear", "factor": 2.0}, "rope linear x2"),
    ({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
     "rope yarn x4 (original 32)"),
    ({"type": "yarn", "factor": 4.0, "beta_fast": 16.0, "attention_factor": 1.5,
      "original_max_position_embeddings": 32},
     "rope yarn x4 (original 32, beta_fast 16, attention factor 1.5)"),
    ({"type": "llama3", "factor": 8.0, "low_freq_factor": 2.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 64},
     "rope llama3 x8 (original 64, low_freq_factor 2, high_freq_factor 4)"),
    ({"type": "default"}, "rope none"),
])
def test_summary_line_names_the_rule(tmp_path, capsys, rope, summary):
    stdout, _ = export_ok(capsys, make_model(tmp_path / "m", rope), tmp_path / "out.bin")
    assert stdout.strip().endswith(f"p 1, {summary}"), stdout


def yarn_mscale(s, m=1.0):
    """YaRN's get_mscale, written out here: 0.1 m ln s + 1, or 1 for s <= 1."""
    return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0


@pytest.mark.parametrize("layout", ["v4", "v5"])
@pytest.mark.parametrize("keys, fields", [
    # no attention factor: 0, the default 0.1 ln s + 1 (run.c computes it from the factor in force)
    ({}, {}),
    ({"attention_factor": 1.25}, {"rope_attention_factor": 1.25}),
    # DeepSeek-V3's mscale = mscale_all_dim = 1: the ratio is 1, which is not the default: stored
    ({"mscale": 1.0, "mscale_all_dim": 1.0}, {"rope_attention_factor": 1.0}),
    ({"mscale": 1.0, "mscale_all_dim": 0.5}, {"rope_attention_factor": yarn_mscale(4, 1.0) / yarn_mscale(4, 0.5)}),
    ({"mscale": 0.707, "mscale_all_dim": 0}, {}),  # transformers: both must be non-zero, else get_mscale(s)
    ({"mscale": 0.707}, {}),
    ({"attention_factor": 1.5, "mscale": 1.0, "mscale_all_dim": 0.5}, {"rope_attention_factor": 1.5}),  # given wins
    ({"beta_fast": 0, "beta_slow": hf_fixture.NULL}, {}),  # 0 / null: the defaults 32 / 1 (transformers' `or`)
    ({"beta_fast": 32, "beta_slow": 1}, {"yarn_beta_fast": 32.0, "yarn_beta_slow": 1.0}),
    ({"truncate": True}, {}),
])
def test_yarn_parameters(tmp_path, capsys, layout, keys, fields):
    rope = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, **keys}
    model = make_model(tmp_path / "m", rope, layout)
    _, stderr = export_ok(capsys, model, tmp_path / "out.bin")
    assert stderr == ""
    assert rule_fields(read_header(tmp_path / "out.bin")) == expect(
        rope_factor=4.0, rope_scaling=YARN, rope_original_len=32, **fields)


@pytest.mark.parametrize("layout", ["v4", "v5"])
def test_yarn_null_factor_is_the_length_ratio(tmp_path, capsys, layout):
    """transformers 5: factor null -> max_position_embeddings / original_max_position_embeddings."""
    rope = {"type": "yarn", "factor": hf_fixture.NULL, "original_max_position_embeddings": 16}
    model = make_model(tmp_path / "m", rope, layout)
    assert json.loads((model / "config.json").read_text())["rope_scaling" if layout == "v4" else
                                                           "rope_parameters"]["factor"] is None
    export_ok(capsys, model, tmp_path / "out.bin")
    assert rule_fields(read_header(tmp_path / "out.bin")) == expect(
        rope_factor=MAX_LEN / 16, rope_scaling=YARN, rope_original_len=16)


def test_yarn_explicit_factor_wins_over_the_length_ratio(tmp_path, capsys):
    """The factor is used even when max_position_embeddings / original differs (transformers warns)."""
    rope = {"type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32}  # the ratio is 4
    _, stderr = export_ok(capsys, make_model(tmp_path / "m", rope), tmp_path / "out.bin")
    assert stderr.count("\n") == 1 and stderr.startswith("export.py: warning: yarn factor 2 differs"), stderr
    assert "128 / 32 = 4" in stderr
    assert rule_fields(read_header(tmp_path / "out.bin")) == expect(
        rope_factor=2.0, rope_scaling=YARN, rope_original_len=32)


@pytest.mark.parametrize("rule", ["yarn", "llama3", "linear"])
def test_top_level_original_length(tmp_path, capsys, rule):
    """Phi-3 style: original_max_position_embeddings at the top level of config.json, which
    transformers 5's standardize_rope_params moves into the rope dict."""
    rope = dict(RULES[rule][0], original_max_position_embeddings=hf_fixture.OMIT)
    model = make_model(tmp_path / "m", rope, top_level={"original_max_position_embeddings": 64})
    export_ok(capsys, model, tmp_path / "out.bin")
    assert read_header(tmp_path / "out.bin")["rope_original_len"] == 64


def test_top_level_and_rope_dict_original_length_must_agree(tmp_path, capsys):
    rope = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}
    model = make_model(tmp_path / "m", rope, top_level={"original_max_position_embeddings": 64})
    assert_refused(capsys, model, tmp_path / "out.bin", "original_max_position_embeddings", "64", "32")


@pytest.mark.parametrize("layout", ["v4", "v5"])
def test_proportional_factor_is_the_linear_rule(tmp_path, capsys, layout):
    """Proportional's factor was "rope_scale"; it is rope_factor with rope_scaling 1 (linear),
    which means what rope_scaling 0 with the same factor meant before. Factor 1: no rule."""
    rope = {"type": "proportional", "partial_rotary_factor": 0.5, "factor": 8.0, "theta": 1e6}
    export_ok(capsys, make_model(tmp_path / "a", rope, layout), tmp_path / "a.bin")
    header = read_header(tmp_path / "a.bin")
    assert rule_fields(header) == expect(rope_factor=8.0, rope_scaling=LINEAR)
    assert (header["rope_theta"], header["rope_fraction"]) == (1e6, 0.5)
    export_ok(capsys, make_model(tmp_path / "b", dict(rope, factor=1.0), layout), tmp_path / "b.bin")
    assert rule_fields(read_header(tmp_path / "b.bin")) == NO_RULE


def test_default_rope_has_no_rule(tmp_path, capsys):
    export_ok(capsys, make_model(tmp_path / "m", {"type": "default"}), tmp_path / "out.bin")
    assert rule_fields(read_header(tmp_path / "out.bin")) == NO_RULE


# ----------------------------------------------------------------------------
# Refusals: exit code 1, one line


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("rope, words", [
    ({"type": "dynamic", "factor": 2.0}, ["rope_type 'dynamic' is not supported", "sequence length",
                                          "--rope-scaling ntk", "yarn"]),
    ({"type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 7},
     ["longrope short_factor has 8 entries, long_factor 7"]),
    ({"type": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0] * 4},
     ["longrope has 4 factors per set for 8 rotated pairs"]),
    ({"type": "su", "factor": 2.0}, ["rope_type 'su' is not supported"]),
    ({"type": "yarn", "factor": 4.0, "truncate": False}, ["yarn", '"truncate": false', "not supported"]),
])
def test_refused_rope_types(tmp_path, capsys, layout, rope, words):
    fixture_layout, extra = LAYOUTS[layout]
    assert_refused(capsys, make_model(tmp_path / "m", dict(rope, **extra), fixture_layout), tmp_path / "out.bin",
                   *words)


@pytest.mark.parametrize("rope, words", [
    ({"type": "yarn", "factor": 4.0, "truncate": hf_fixture.NULL}, ['"truncate": null']),  # falsy, as in Python
    ({"type": "yarn", "factor": hf_fixture.OMIT}, ["yarn", "factor"]),  # transformers requires the key
    ({"type": "yarn", "factor": 0.5}, ["yarn factor 0.5", ">= 1"]),
    ({"type": "yarn", "factor": 4.0, "attention_factor": 0}, ["attention_factor", "> 0"]),
    ({"type": "yarn", "factor": 4.0, "attention_factor": -1.0}, ["attention_factor"]),
    ({"type": "yarn", "factor": 4.0, "beta_fast": -32.0}, ["beta_fast"]),
    ({"type": "yarn", "factor": 4.0, "beta_slow": "1"}, ["beta_slow", "not a number"]),
    ({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 0}, ["original_max_position_embeddings"]),
    ({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32.5}, ["original_max_position_embeddings"]),
    ({"type": "yarn", "factor": 4.0, "mscale": 1.0, "mscale_all_dim": -20.0}, ["mscale", "attention factor"]),
    ({"type": "linear", "factor": hf_fixture.OMIT}, ["linear", "factor"]),
    ({"type": "linear", "factor": hf_fixture.NULL}, ["linear", "factor", "null"]),
    ({"type": "linear", "factor": 0}, ["linear factor 0"]),
    ({"type": "linear", "factor": 1e39}, ["linear factor"]),  # not finite in float32
    ({"type": "llama3", "low_freq_factor": hf_fixture.OMIT}, ["llama3", "low_freq_factor"]),
    ({"type": "llama3", "low_freq_factor": 4.0, "high_freq_factor": 4.0}, ["high_freq_factor", "> low_freq_factor"]),
    ({"type": "llama3", "factor": 0.5}, ["llama3 factor 0.5", ">= 1"]),
    ({"type": "proportional", "factor": hf_fixture.NULL}, ["proportional", "factor"]),
])
def test_refused_rule_parameters(tmp_path, capsys, rope, words):
    assert_refused(capsys, make_model(tmp_path / "m", rope), tmp_path / "out.bin", *words)


@pytest.mark.parametrize("rope, code, words", [
    ({"type": "dynamic", "factor": 2.0}, 1, ["rope_type 'dynamic' is not supported", "--rope-scaling ntk"]),
    ({"type": "longrope", "short_factor": [1.0] * 8, "long_factor": [0.0] * 8}, 1,
     ["longrope long_factor must be a list of finite numbers > 0"]),
    ({"type": "yarn", "factor": 4.0, "truncate": False}, 1, ["truncate"]),
])
def test_refusals_as_a_process(tmp_path, rope, code, words):
    """The same refusals from a real process: its exit code and its one stderr line."""
    model = make_model(tmp_path / "m", rope)
    r = subprocess.run([sys.executable, str(EXPORT), str(model), str(tmp_path / "out.bin")],
                       capture_output=True, text=True)
    assert r.returncode == code and r.stdout == ""
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("export.py: error: "), r.stderr
    assert all(word in r.stderr for word in words), r.stderr
    assert not (tmp_path / "out.bin").exists()


@pytest.mark.parametrize("rope", [
    {"type": "linear", "factor": 2.0, "attention_factor": 2.0},
    {"type": "llama3", "beta_fast": 8.0},
])
def test_keys_a_rule_does_not_use_are_ignored_with_a_warning(tmp_path, capsys, rope):
    _, stderr = export_ok(capsys, make_model(tmp_path / "m", rope), tmp_path / "out.bin")
    assert stderr.startswith("export.py: warning: rope_type") and "transformers ignores" in stderr, stderr
    header = read_header(tmp_path / "out.bin")
    assert header["rope_attention_factor"] == 0 and header["yarn_beta_fast"] == 0


# ----------------------------------------------------------------------------
# --legacy, and the fields carried through ROPE and llama2.c files


@pytest.mark.parametrize("rope, rule", [
    ({"type": "linear", "factor": 2.0}, "linear x2"),
    ({"type": "yarn", "factor": 4.0}, "yarn x4"),
    ({"type": "llama3"}, "llama3 x8"),
    ({"type": "proportional", "factor": 2.0}, "linear x2"),
])
def test_legacy_refuses_a_rule(tmp_path, capsys, rope, rule):
    model = make_model(tmp_path / "m", rope)
    assert_refused(capsys, model, tmp_path / "out.bin", "--legacy", "no scaling rule", rule, flags=["--legacy"])
    # and from a ROPE file that has the rule
    export_ok(capsys, model, tmp_path / "a.bin")
    assert_refused(capsys, tmp_path / "a.bin", tmp_path / "out.bin", "--legacy", rule, flags=["--legacy"])


def stories_rope(tmp_path, capsys):
    """stories260K.bin (llama2.c legacy) upgraded to ROPE."""
    if not STORIES.is_file():
        pytest.skip(f"{STORIES} not found")
    out = tmp_path / "stories.rope.bin"
    export_ok(capsys, STORIES, out)
    return out


def test_legacy_refuses_an_attention_factor(tmp_path, capsys):
    data = bytearray(stories_rope(tmp_path, capsys).read_bytes())
    struct.pack_into("<f", data, 72, 1.5)
    (tmp_path / "b.bin").write_bytes(data)
    assert_refused(capsys, tmp_path / "b.bin", tmp_path / "out.bin", "--legacy", "attention factor 1.5",
                   flags=["--legacy"])


def test_rope_legacy_rope_is_byte_identical(tmp_path, capsys):
    a = stories_rope(tmp_path, capsys)
    assert rule_fields(read_header(a)) == NO_RULE
    _, stderr = export_ok(capsys, a, tmp_path / "legacy.bin", "--legacy")
    assert stderr == ""
    export_ok(capsys, tmp_path / "legacy.bin", tmp_path / "c.bin")
    assert a.read_bytes() == (tmp_path / "c.bin").read_bytes()


def test_legacy_warns_that_the_original_length_is_dropped(tmp_path, capsys):
    """A ROPE file with no rule but an original length (train.py writes --seq-len there): the legacy
    format cannot keep it; coming back it is 0, which means the header's seq_len."""
    data = bytearray(stories_rope(tmp_path, capsys).read_bytes())
    struct.pack_into("<i", data, 60, 128)  # stories260K: seq_len 512
    (tmp_path / "b.bin").write_bytes(data)
    _, stderr = export_ok(capsys, tmp_path / "b.bin", tmp_path / "legacy.bin", "--legacy")
    assert stderr.startswith("export.py: warning: rope_original_len 128") and stderr.count("\n") == 1, stderr
    export_ok(capsys, tmp_path / "legacy.bin", tmp_path / "c.bin")
    assert read_header(tmp_path / "c.bin")["rope_original_len"] == 0
    # an original length equal to seq_len is the same as 0: nothing to warn about
    struct.pack_into("<i", data, 60, 512)
    (tmp_path / "d.bin").write_bytes(data)
    assert export_ok(capsys, tmp_path / "d.bin", tmp_path / "legacy2.bin", "--legacy")[1] == ""


@pytest.mark.parametrize("rope", [
    {"type": "yarn", "factor": 4.0, "beta_fast": 16.0, "beta_slow": 2.0, "attention_factor": 1.25,
     "original_max_position_embeddings": 32},
    {"type": "llama3", "factor": 8.0, "low_freq_factor": 2.0, "high_freq_factor": 8.0,
     "original_max_position_embeddings": 64},
    {"type": "linear", "factor": 1.5, "original_max_position_embeddings": 64},
])
def test_rope_file_carries_the_rule_through(tmp_path, capsys, rope):
    export_ok(capsys, make_model(tmp_path / "m", rope), tmp_path / "a.bin")
    a = (tmp_path / "a.bin").read_bytes()
    export_ok(capsys, tmp_path / "a.bin", tmp_path / "b.bin")
    assert (tmp_path / "b.bin").read_bytes() == a
    export_ok(capsys, tmp_path / "a.bin", tmp_path / "c.bin", "--rope-theta", 500000, "--rope-fraction", 0.5)
    c = (tmp_path / "c.bin").read_bytes()
    assert c[52:] == a[52:] and c[:44] == a[:44]  # only theta and p change


@pytest.mark.parametrize("offset, code, value, words", [
    (56, "i", 7, ["rope_scaling 7"]),
    (56, "i", -1, ["rope_scaling -1"]),
    (52, "f", float("nan"), ["rope_factor nan"]),
    (52, "f", 0.5, ["rope_factor 0.5", ">= 1"]),
    (52, "f", -2.0, ["rope_factor -2"]),
    (60, "i", -1, ["rope_original_len -1"]),
    (64, "f", float("inf"), ["yarn_beta_fast inf"]),
    (72, "f", -1.0, ["rope_attention_factor -1"]),
    (76, "f", 1.0, ["llama3_low_freq_factor", "belongs to llama3", "the rule is yarn"]),
    (84, "i", 1, ["bytes 84..255"]),
    (252, "i", 1, ["bytes 84..255"]),
])
def test_bad_rule_fields_in_a_rope_file(tmp_path, capsys, offset, code, value, words):
    export_ok(capsys, make_model(tmp_path / "m", {"type": "yarn", "factor": 4.0}), tmp_path / "a.bin")
    data = bytearray((tmp_path / "a.bin").read_bytes())
    struct.pack_into("<" + code, data, offset, value)
    (tmp_path / "bad.bin").write_bytes(data)
    assert_refused(capsys, tmp_path / "bad.bin", tmp_path / "out.bin", "bad.bin", *words)


def test_bad_llama3_factors_in_a_rope_file(tmp_path, capsys):
    export_ok(capsys, make_model(tmp_path / "m", {"type": "llama3"}), tmp_path / "a.bin")
    data = bytearray((tmp_path / "a.bin").read_bytes())
    struct.pack_into("<2f", data, 76, 4.0, 0.0)  # high 0: the default 4, not > low 4
    (tmp_path / "bad.bin").write_bytes(data)
    assert_refused(capsys, tmp_path / "bad.bin", tmp_path / "out.bin", "llama3_high_freq_factor 4",
                   "> llama3_low_freq_factor 4")
    struct.pack_into("<2f", data, 76, 0.0, 0.0)  # both defaults: 1 and 4
    (tmp_path / "ok.bin").write_bytes(data)
    export_ok(capsys, tmp_path / "ok.bin", tmp_path / "out.bin")


def test_older_linear_file_is_read_and_kept(tmp_path, capsys):
    """rope_scaling 0 with rope_factor != 1 (a file from before the rule field) means linear: it is
    carried through unchanged, the summary says linear, and --legacy refuses it."""
    data = bytearray(stories_rope(tmp_path, capsys).read_bytes())
    struct.pack_into("<f", data, 52, 4.0)
    (tmp_path / "old.bin").write_bytes(data)
    stdout, _ = export_ok(capsys, tmp_path / "old.bin", tmp_path / "b.bin")
    assert stdout.strip().endswith("rope linear x4") and (tmp_path / "b.bin").read_bytes() == data
    assert_refused(capsys, tmp_path / "old.bin", tmp_path / "c.bin", "linear x4", flags=["--legacy"])


# ----------------------------------------------------------------------------
# The progress line of a big export

def test_progress_line_for_a_big_export(tmp_path):
    """An output over 100 MB gets a progress line on stderr, rewritten in place with \\r and ended
    with a newline: tensors done, MB written. The input is a sparse ROPE file (all zeros) with a
    large vocabulary: 2 x 250000 x 64 floats = 128 MB, cheap to make and read."""
    dim, hidden, layers, heads, kv, vocab, seq_len = 64, 64, 1, 2, 1, 250000, 64
    kv_dim = kv * (dim // heads)
    per_layer = 2 * dim + 2 * dim * dim + 2 * kv_dim * dim + 3 * hidden * dim  # norms, wq wo, wk wv, w1 w2 w3
    floats = 2 * vocab * dim + layers * per_layer + dim  # embedding and wcls, the layers, rms_final
    header = struct.pack("<Ii7ii4f", 0x45504F52, 1, dim, hidden, layers, heads, kv, vocab, seq_len, 0,
                         1e-5, 10000.0, 1.0, 1.0)
    big = tmp_path / "big.bin"
    with open(big, "wb") as f:
        f.write(header + bytes(256 - len(header)))
        f.truncate(256 + 4 * floats)
    out = tmp_path / "out.bin"
    r = subprocess.run([sys.executable, str(EXPORT), str(big), str(out)], capture_output=True, timeout=120)
    stderr = r.stderr.decode()  # not text=True, which would turn each \r into \n
    assert r.returncode == 0, stderr
    assert out.stat().st_size == big.stat().st_size == 256 + 4 * floats
    total_mb = round((256 + 4 * floats) / 1e6)
    assert stderr.startswith("\r") and stderr.endswith("\n") and stderr.count("\n") == 1, repr(stderr)
    updates = stderr[1:-1].split("\r")
    pattern = re.compile(rf"export\.py: writing {re.escape(str(out))}: (\d+)/12 tensors, (\d+)/{total_mb} MB")
    done = [tuple(map(int, pattern.fullmatch(u).groups())) for u in updates]
    assert done[-1] == (12, total_mb)  # 12 tensors: the classifier is not shared
    assert done == sorted(done)
    # a small export stays quiet (the other tests check stderr == "")


def test_progress_line_is_ended_when_the_write_stops(capsys):
    """A failure half-way through a big write ends the progress line first, so that the error
    message starts a line of its own."""
    import io
    c = export.Config(64, 64, 1, 2, 1, 250000, 64, False, 1e-5)

    def fail():
        raise export.ExportError("disk on fire")

    tensors = {name: [lambda: np.zeros(1, np.float32)] for name, _ in export.tensor_shapes(c)}
    tensors["wv"] = [fail]
    with pytest.raises(export.ExportError):
        export.write_rope(io.BytesIO(), c, tensors, "big.bin")
    stderr = capsys.readouterr().err
    assert stderr.startswith("\rexport.py: writing big.bin: 0/12 tensors") and stderr.endswith("\n"), repr(stderr)
    assert stderr.count("\n") == 1
