"""Chat mode: the Llama 2 template, KV-cache reuse, end of input, the context limit, a terminal."""
import os
import re
import shutil
import subprocess
import time

import pytest

from conftest import LLAMA_TOKENIZER, MODELS, RUN_BIN, STORIES, TOK512, run

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


def test_context_full_cuts_the_reply_with_message():
    # no reply limit: stories260K rarely emits EOS, so the reply runs into the context end
    r = run(*STORY_CHAT, "-p", "hello", input="")
    assert r.returncode == 0
    assert b"context of 512 tokens is full" in r.stderr


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_terminal_session_shows_prompts_streams_and_ctrl_d_exits_0(tmp_path):
    session = f"runchat{os.getpid()}"
    status = tmp_path / "status"
    cmd = (f"{RUN_BIN} {STORIES} -z {TOK512} -m chat -t 0 -n 20; echo $? > {status}; sleep 30")
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
        assert wait_for(r"Assistant:.+\S"), screen()
        assert wait_for(r"(?m)^Assistant:.+\n+User:\s*$"), screen()
        subprocess.run(["tmux", "send-keys", "-t", session, "C-d"], check=True)
        deadline = time.time() + 20
        while not status.exists() and time.time() < deadline:
            time.sleep(0.1)
        assert status.read_text().strip() == "0"
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
