"""Chat mode: the Llama 2 template, KV-cache reuse, end of input, the context limit and its
shifts, a terminal."""
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

import family_fixtures
import hf_fixture
import reference
from conftest import LLAMA_TOKENIZER, MODELS, ROOT, RUN_BIN, STORIES, TOK512, export, run

STORY_CHAT = [STORIES, "-z", TOK512, "-m", "chat", "-t", 0]


def turn_ids(stderr, kind):
    """The ids run.c prints with -v: {turn: [ids]} for kind 'prompt' or 'reply'."""
    found = re.findall(rb"^chat: turn (\d+) " + kind.encode() + rb":(.*)$", stderr, re.M)
    return {int(t): [int(i) for i in ids.split()] for t, ids in found}


def test_two_turn_template_equals_llama2_chat_format(llama_vocab_model):
    sentencepiece = pytest.importorskip("sentencepiece")
    sp = sentencepiece.SentencePieceProcessor(model_file=str(MODELS / "tokenizer.model"))
    r = run(llama_vocab_model, "-z", LLAMA_TOKENIZER, "-m", "chat", "-t", 0, "-n", 5, "-v",
            "-y", "You are a helpful assistant.", "-p", "Hello there!", input="How are you?\n")
    assert r.returncode == 0, r.stderr
    prompts, replies = turn_ids(r.stderr, "prompt"), turn_ids(r.stderr, "reply")
    # spelled out by hand: <s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] ... </s><s>[INST] {user} [/INST]
    turn1 = [1] + sp.encode("[INST] <<SYS>>\nYou are a helpful assistant.\n<</SYS>>\n\nHello there! [/INST]")
    turn2 = [2, 1] + sp.encode("[INST] How are you? [/INST]")
    assert prompts[1] == turn1
    assert prompts[2] == turn2
    assert len(replies[1]) == 5  # -n limits each reply


def test_second_turn_with_cache_equals_fresh_run_over_transcript():
    args = STORY_CHAT + ["-v", "-n", 60, "-y", "You tell stories.", "-p", "Tell me about a cat."]
    cached = run(*args, input="What happened next?\n")
    fresh = run(*args, "--no-cache", input="What happened next?\n")
    assert cached.returncode == 0 and fresh.returncode == 0
    assert turn_ids(cached.stderr, "reply")[2] == turn_ids(fresh.stderr, "reply")[2]
    assert len(turn_ids(cached.stderr, "reply")[2]) > 10
    assert cached.stdout == fresh.stdout


def test_piped_replies_are_one_line_each():
    r = run(*STORY_CHAT, "-n", 80, input="Tell me a story\nAnd then?\n")
    assert r.returncode == 0
    lines = r.stdout.decode().split("\n")
    assert lines[-1] == "" and len(lines) == 3  # two replies, each one line
    assert "User:" not in r.stdout.decode()


def test_piped_input_without_final_newline_is_a_turn():
    r = run(*STORY_CHAT, "-n", 10, "-v", input="first\nsecond without newline")
    assert r.returncode == 0
    assert sorted(turn_ids(r.stderr, "reply")) == [1, 2]


def test_input_that_ends_at_once_exits_cleanly():
    r = run(*STORY_CHAT, input="")
    assert r.returncode == 0 and r.stdout == b""


def test_empty_lines_are_skipped():
    r = run(*STORY_CHAT, "-n", 10, "-v", input="\n\nhello\n\n")
    assert r.returncode == 0 and sorted(turn_ids(r.stderr, "reply")) == [1]


def test_turn_longer_than_context_is_refused_with_message():
    long_turn = "the cat sat on the mat " * 200  # far more than 512 tokens
    r = run(*STORY_CHAT, "-n", 10, input="hello\n" + long_turn + "\n")
    assert r.returncode == 1
    assert re.search(rb"run: error: turn 2 needs \d+ tokens but only \d+ of the context's 512 remain", r.stderr)
    assert len(r.stdout.decode().splitlines()) == 1  # the first reply was given


def test_context_full_cuts_the_reply_with_message(tmp_path):
    # no reply limit, and a random model that seldom samples BOS or EOS: the reply
    # runs into the end of its 64-token context
    from ropefile import write_random_checkpoint
    model = write_random_checkpoint(tmp_path / "random64.bin", seq_len=64, seed=5)
    r = run(model, "-z", TOK512, "-m", "chat", "-t", 0, "-v", "-p", "hello", input="")
    assert r.returncode == 0
    assert b"context of 64 tokens is full; the reply is cut here" in r.stderr
    assert len(turn_ids(r.stderr, "prompt")[1]) + len(turn_ids(r.stderr, "reply")[1]) == 64


def test_reply_ends_at_bos_and_neither_bos_nor_eos_is_printed():
    # the TinyStories models end a story with BOS: the reply stops there, before
    # the context is full, and the next turn goes on
    r = run(*STORY_CHAT, "-v", "-p", "hello", input="And then?\n")
    assert r.returncode == 0, r.stderr
    replies = turn_ids(r.stderr, "reply")
    assert b"is full" not in r.stderr
    assert 0 < len(replies[1]) < 400 and sorted(replies) == [1, 2]
    assert not {1, 2} & set(replies[1] + replies[2])
    assert b"<s>" not in r.stdout and b"</s>" not in r.stdout


FORTY_TURNS = "".join(f"Tell me about thing number {i}.\n" for i in range(1, 41))


@pytest.mark.parametrize("shift", ["recompute", "rotate"])
def test_forty_turn_session_survives_its_context(shift):
    # replies of at most 60 tokens (-n): forty turns still fill the 512-token context many times
    # over (some 35 shifts), in a third of the tokens that unlimited replies take
    r = run(STORIES, "-z", TOK512, "-m", "chat", "-s", 7, "-n", 60, "-y", "You tell short stories.",
            "--shift", shift, input=FORTY_TURNS, timeout=300)
    assert r.returncode == 0, r.stderr[-500:]
    assert len(r.stdout.decode().split("\n")) == 41  # forty replies, one line each
    assert b"<s>" not in r.stdout and b"</s>" not in r.stdout
    shifts = re.findall(rb"dropped the oldest \d+ turns?, kept \d+ tokens \(--shift " + shift.encode(), r.stderr)
    assert len(shifts) >= 10, len(shifts)
    assert b"error" not in r.stderr


# --- shifts checked against the NumPy reference (tests/reference.py) ---------------------

SYSTEM = "Be brief."
USERS = [f"question {w}" for w in ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]]
REPLY_LIMIT = 8


@pytest.fixture(scope="module")
def small_chat_model(tmp_path_factory):
    """A random HF checkpoint with a 128-token context, exported to the ROPE format."""
    d = tmp_path_factory.mktemp("hf_chat")
    config, tensors = hf_fixture.make_hf_checkpoint(d, vocab_size=512, seq_len=128, seed=11)
    out = d / "model.bin"
    r = subprocess.run([sys.executable, str(ROOT / "export.py"), str(d), str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return config, tensors, out


def tokenize(model, text):
    r = run(model, "-z", TOK512, "-m", "tokenize", "-p", text)
    assert r.returncode == 0, r.stderr
    return [int(line.split(b"\t")[0]) for line in r.stdout.splitlines()]  # BOS first


def chat_events(stderr):
    """The -v lines in order: ('prompt', ids), ('reply', ids), ('dropped', n_turns, n_kept)."""
    events = []
    for line in stderr.splitlines():
        m = re.match(rb"chat: turn \d+ (prompt|reply):(.*)$", line)
        if m:
            events.append((m.group(1).decode(), [int(i) for i in m.group(2).split()]))
        m = re.search(rb"dropped the oldest (\d+) turns?, kept (\d+) tokens", line)
        if m:
            events.append(("dropped", int(m.group(1)), int(m.group(2))))
    return events


def run_session(model, *flags):
    r = run(model, "-z", TOK512, "-m", "chat", "-t", 0, "-n", REPLY_LIMIT, "-v", "-y", SYSTEM, *flags,
            input="".join(u + "\n" for u in USERS))
    assert r.returncode == 0, r.stderr
    return r, chat_events(r.stderr)


def assert_greedy_reply(config, tensors, context, reply):
    """reply is what argmax decoding gives after context, by the reference: each
    token the reference's argmax (or within 1e-4 of it), and a reply shorter than
    the limit ends where the reference's argmax is BOS or EOS."""
    logits = reference.forward(config, tensors, context + reply, {"kind": "paper", "theta": 10000.0, "p": 1.0})
    for j, token in enumerate(reply + ([None] if len(reply) < REPLY_LIMIT else [])):
        row = logits[len(context) - 1 + j]
        if token is None:
            assert int(np.argmax(row)) in (1, 2), "the reply ended early"
        else:
            assert row[token] >= row.max() - 1e-4, f"reply token {j}: {token}, reference argmax {np.argmax(row)}"


def test_recompute_shift_replies_equal_fresh_reference_over_kept_transcript(small_chat_model):
    config, tensors, model = small_chat_model
    r, events = run_session(model, "--shift", "recompute")
    # replay the conversation: [user, prompt ids, reply ids] of the turns in the context
    turns, user_index, shifts = [], 0, 0
    for event in events:
        if event[0] == "dropped":
            _, dropped, kept = event
            shifts += 1
            del turns[:dropped]
            if turns:  # the first kept turn carries the system prompt again, as in a fresh session
                turns[0][1] = tokenize(model, f"[INST] <<SYS>>\n{SYSTEM}\n<</SYS>>\n\n{turns[0][0]} [/INST]")
            assert kept == sum(len(p) + len(rep) for _, p, rep in turns)
        elif event[0] == "prompt":
            turns.append([USERS[user_index], event[1], None])
            user_index += 1
        else:
            turns[-1][2] = event[1]
            context = [t for _, p, rep in turns[:-1] for t in p + rep] + turns[-1][1]
            assert len(context) + len(event[1]) <= 128
            assert_greedy_reply(config, tensors, context, event[1])
    assert user_index == len(USERS) and shifts >= 2
    # a fresh --no-cache session (it shifts the same way) gives the same replies
    fresh = run(model, "-z", TOK512, "-m", "chat", "-t", 0, "-n", REPLY_LIMIT, "-y", SYSTEM, "--no-cache",
                input="".join(u + "\n" for u in USERS))
    assert fresh.stdout == r.stdout


def test_rotate_shift_keeps_the_system_block_and_the_later_turns(small_chat_model):
    _, _, model = small_chat_model
    recompute, _ = run_session(model, "--shift", "recompute")
    r, events = run_session(model, "--shift", "rotate")
    system_block = len(tokenize(model, f"[INST] <<SYS>>\n{SYSTEM}\n<</SYS>>\n\n"))  # with BOS
    inst_head = 2 + len(tokenize(model, "[INST]")) - 1  # EOS, BOS, [INST] before a later turn's text
    turns = []
    for event in events:
        if event[0] == "dropped":
            _, dropped, kept = event
            del turns[:dropped]
            # kept: the system block, then from the first kept turn's user text on
            expected = system_block + sum(len(p) + len(rep) for p, rep in turns) - inst_head
            assert kept == expected
        elif event[0] == "prompt":
            turns.append([event[1], None])
        else:
            turns[-1][1] = event[1]
    assert sum(e[0] == "dropped" for e in events) >= 2
    # the turns before the first shift are the same in both modes; the rest need not be
    first_shift = [e[0] for e in events].index("dropped")
    replies_before = sum(e[0] == "reply" for e in events[:first_shift])
    lines_rotate, lines_recompute = r.stdout.splitlines(), recompute.stdout.splitlines()
    assert lines_rotate[:replies_before] == lines_recompute[:replies_before]
    assert len(lines_rotate) == len(USERS)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_terminal_session_shows_prompts_streams_and_ctrl_d_exits_0(tmp_path):
    session = f"runchat{os.getpid()}"
    status = tmp_path / "status"
    # the exit status goes to a file by a rename, so that the file appears with its
    # contents (a plain `echo $? > status` creates it empty first: a race)
    cmd = (f"{RUN_BIN} {STORIES} -z {TOK512} -m chat -t 0 -n 20; echo $? > {status}.part; "
           f"mv {status}.part {status}; sleep 30")
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "200", "-y", "50", cmd], check=True)

    def screen():  # tmux trims trailing spaces from each line
        return subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True,
                              text=True).stdout.rstrip()

    def wait_for(pattern, seconds=20):
        deadline = time.time() + seconds
        while time.time() < deadline:
            if re.search(pattern, screen()):
                return True
            time.sleep(0.1)
        return False

    try:
        assert wait_for(r"System prompt \(optional\):"), screen()
        subprocess.run(["tmux", "send-keys", "-t", session, "You tell stories.", "Enter"], check=True)
        assert wait_for(r"(?m)^User:\s*$"), screen()
        subprocess.run(["tmux", "send-keys", "-t", session, "Tell me a story", "Enter"], check=True)
        assert wait_for(r"Assistant: \S"), screen()  # the reply starts after a space
        assert wait_for(r"(?m)^Assistant:.+\n+User:\s*$"), screen()
        subprocess.run(["tmux", "send-keys", "-t", session, "C-d"], check=True)
        deadline = time.time() + 20
        while not status.exists() and time.time() < deadline:
            time.sleep(0.1)
        assert status.read_text().strip() == "0"
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)


# --- a model whose sliding layers keep a ring -------------------------------------------


@pytest.fixture(scope="module")
def ring_chat_model(tmp_path_factory):
    """Mistral's shape with a window of 13: at -c 160 every layer's cache is a ring of
    13 + 127 = 140 positions, which a session wraps turn after turn."""
    d = tmp_path_factory.mktemp("ring_chat") / "mistral"
    family_fixtures.write_checkpoint(d, "Mistral-7B-v0.1", "F32", seed=7, window=13)
    out = d.parent / "mistral.bin"
    export(d, out)
    return out


def test_sliding_layer_rings_carry_a_chat_across_turns_and_shifts(ring_chat_model):
    # recompute: the cache carried from turn to turn (each turn's prefill writes on into the
    # rings) gives the replies of --no-cache, which runs each turn's whole context afresh
    flags = ("-c", 160, "--shift", "recompute")
    r, events = run_session(ring_chat_model, *flags)
    assert b"ring of 140 positions" in r.stderr
    assert sum(e[0] == "dropped" for e in events) >= 2
    fresh = run(ring_chat_model, "-z", TOK512, "-m", "chat", "-t", 0, "-n", REPLY_LIMIT, "-y", SYSTEM, "--no-cache",
                *flags, input="".join(u + "\n" for u in USERS))
    assert fresh.returncode == 0, fresh.stderr
    assert fresh.stdout == r.stdout
    # rotate: the rings' visible positions moved and turned; the replies before the first
    # shift are recompute's, and every turn gets one
    rotated, rotate_events = run_session(ring_chat_model, "-c", 160, "--shift", "rotate")
    assert sum(e[0] == "dropped" for e in rotate_events) >= 2
    assert b"error" not in rotated.stderr
    first_shift = [e[0] for e in rotate_events].index("dropped")
    replies_before = sum(e[0] == "reply" for e in rotate_events[:first_shift])
    assert rotated.stdout.splitlines()[:replies_before] == r.stdout.splitlines()[:replies_before]
    assert len(rotated.stdout.splitlines()) == len(USERS)
