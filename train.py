#!/usr/bin/env python3
"""Trains a tiny Llama with RoPE or p-RoPE on the King James Bible and writes it for ./run.

    python3 train.py --out out/p0.25 --rope-fraction 0.25
    ./run out/p0.25/model.bin -z out/p0.25/tokenizer.bin -m ppl -f out/p0.25/val.txt

The model is run.c's architecture exactly (docs/format.md): RMSNorm,
attention with grouped key/value heads, a SwiGLU feed-forward, the classifier tied
to the embedding. Queries and keys are rotated in run.c's adjacent layout: pair i
is dims (2i, 2i+1), turned by pos * omega_i with omega_i = theta^(-2i/head_dim),
and p-RoPE rotates only the first rope_angles = floor(p * head_dim / 2) pairs (the
fastest), leaving the others unrotated (Barbero et al., ICLR 2025). Because the
layout is run.c's, the weights are written as they are, with no permutation.

The corpus is Debian's bible-kjv (`bible -l0 'gen1:1-rev22:21'`): verse numbers and
chapter headings stripped, one verse a line. Every VAL_EVERY-th chapter is held out
for validation, so the split is by chapter, never by line. The tokenizer is a
SentencePiece BPE vocabulary trained on the training chapters, written in
llama2.c's tokenizer.bin form by export.py. Both are cached (--cache).

Training sees windows of --seq-len positions, each BOS followed by seq_len - 1
tokens of the text, which is how `run -m ppl` scores a text; the header's seq_len
(--max-seq-len, 4x by default) lets run score at longer windows too, and its
rope_original_len (--seq-len) is the trained length that run's --rope-scaling rules
are relative to (the header has no rule: rope_scaling 0, factor 1). The last line
of stdout is `val_nll: X`, val.txt scored as `run -m ppl -f val.txt` scores it with
the header's seq_len.

PyTorch (Debian's python3-torch), numpy and sentencepiece; CPU only. Install
libopenblas0-pthread with it: Debian's torch runs ten times slower on the
reference BLAS.
"""
import argparse
import csv
import math
import os
import re
import struct
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
EXIT_BAD_USAGE = 2
VAL_EVERY = 25  # every 25th chapter is validation text (48 of 1189)
TOKEN_BOS = 1


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------

class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2."""

    def error(self, message):
        sys.stderr.write(f"train.py: error: {message}\n")
        sys.exit(EXIT_BAD_USAGE)


def parse_args(argv):
    p = ArgumentParser(description="Train a tiny RoPE / p-RoPE Llama on the KJV Bible for ./run.")
    p.add_argument("--out", required=True, help="output directory: model.bin, tokenizer.bin, val.txt, log.csv")
    p.add_argument("--rope-fraction", type=float, default=1.0, help="p: the fraction of pairs that rotate, in [0, 1]")
    p.add_argument("--rope-theta", type=float, default=10000.0, help="the base wavelength theta, > 0")
    p.add_argument("--steps", type=int, default=350, help="optimizer steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seq-len", type=int, default=64, help="training window in positions (BOS + seq_len-1 tokens)")
    p.add_argument("--max-seq-len", type=int, default=0, help="seq_len in the header (default 4x --seq-len)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--hidden-dim", type=int, default=0, help="SwiGLU hidden size (default 3 x dim)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=0, help="key/value heads (default: --heads)")
    p.add_argument("--vocab", type=int, default=512, help="SentencePiece vocabulary size, >= 384")
    p.add_argument("--lr", type=float, default=2e-3, help="peak learning rate (AdamW, cosine decay)")
    p.add_argument("--eval-every", type=int, default=25, help="steps between validation losses")
    p.add_argument("--eval-tokens", type=int, default=8192, help="validation tokens scored at each evaluation")
    p.add_argument("--val-chars", type=int, default=40000, help="at most this much validation text in val.txt")
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: all cores)")
    p.add_argument("--cache", default=str(ROOT / ".cache"), help="where the corpus and tokenizers are kept")
    a = p.parse_args(argv)
    a.kv_heads = a.kv_heads or a.heads
    a.hidden_dim = a.hidden_dim or 3 * a.dim
    a.max_seq_len = a.max_seq_len or 4 * a.seq_len
    if not 0.0 <= a.rope_fraction <= 1.0:
        p.error(f"--rope-fraction must be in [0, 1], got {a.rope_fraction}")
    if not (a.rope_theta > 0 and math.isfinite(a.rope_theta)):
        p.error(f"--rope-theta must be a finite number > 0, got {a.rope_theta}")
    for name in ["steps", "seq_len", "batch", "dim", "layers", "heads", "eval_every", "eval_tokens", "val_chars"]:
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    if a.seq_len < 2:
        p.error("--seq-len must be >= 2 (BOS and one token to predict)")
    if a.max_seq_len < a.seq_len:
        p.error(f"--max-seq-len {a.max_seq_len} is shorter than --seq-len {a.seq_len}")
    if a.dim % a.heads or (a.dim // a.heads) % 2:
        p.error(f"--dim {a.dim} must split into {a.heads} heads of an even size")
    if a.heads % a.kv_heads:
        p.error(f"--heads {a.heads} must be a multiple of --kv-heads {a.kv_heads}")
    if not 384 <= a.vocab <= 32000:
        p.error(f"--vocab must be in [384, 32000] (the 256 byte tokens, 3 specials and the corpus's 62 characters come first), got {a.vocab}")
    return a


def rope_angles(head_dim, p):
    """floor(p * head_dim / 2), as run.c counts it for a float32 p (rope_angles_of)."""
    p32 = struct.unpack("<f", struct.pack("<f", p))[0]
    return min(int(math.floor(p32 * (head_dim // 2) + 1e-4)), head_dim // 2)


# ---------------------------------------------------------------------------
# The corpus and the tokenizer
# ---------------------------------------------------------------------------

def read_kjv():
    """The KJV as a list of chapters, each a list of verse texts (numbers stripped)."""
    try:
        text = subprocess.run(["bible", "-l0", "gen1:1-rev22:21"], capture_output=True, text=True,
                              check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        sys.exit(f"train.py: error: cannot run `bible` ({e}); apt-get install bible-kjv")
    chapters = []
    for line in text.splitlines():
        verse = re.match(r"^\s+\d+ (.*\S)\s*$", line)
        if verse:
            chapters[-1].append(verse.group(1))
        elif line.strip():  # a heading such as "1 Samuel 3" starts a chapter
            chapters.append([])
    chapters = [c for c in chapters if c]
    if len(chapters) < 1000:
        sys.exit(f"train.py: error: `bible` printed {len(chapters)} chapters, expected 1189")
    return chapters


def corpus_files(cache):
    """train.txt and val.txt in the cache: one verse a line, split by chapter."""
    cache.mkdir(parents=True, exist_ok=True)
    train, val = cache / "kjv_train.txt", cache / "kjv_val.txt"
    if not (train.exists() and val.exists()):
        chapters = read_kjv()
        parts = {True: [], False: []}
        for i, chapter in enumerate(chapters):
            parts[i % VAL_EVERY == VAL_EVERY - 1].extend(chapter)
        for path, lines in [(train, parts[False]), (val, parts[True])]:
            tmp = path.with_suffix(".tmp")
            tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
            os.replace(tmp, path)
    return train, val


def tokenizer_model(cache, train_txt, vocab):
    """A SentencePiece BPE model trained on the training text (llama2.c's train_vocab settings)."""
    import sentencepiece as spm
    prefix = cache / f"kjv_bpe{vocab}"
    model = prefix.with_suffix(".model")
    if not model.exists():
        tmp = cache / f"kjv_bpe{vocab}_tmp{os.getpid()}"
        spm.SentencePieceTrainer.train(
            input=str(train_txt), model_prefix=str(tmp), model_type="bpe", vocab_size=vocab,
            self_test_sample_size=0, input_format="text", character_coverage=1.0, num_threads=2,
            split_digits=True, allow_whitespace_only_pieces=True, byte_fallback=True,
            unk_surface=r" \342\201\207 ", normalization_rule_name="identity", remove_extra_whitespaces=False,
            max_sentence_length=8192, minloglevel=2)
        os.replace(tmp.with_suffix(".model"), model)
        os.remove(tmp.with_suffix(".vocab"))
    return spm.SentencePieceProcessor(model_file=str(model)), model


def write_val_text(out, val_txt, limit):
    """val.txt: the held-out chapters' verses, whole lines, at most `limit` characters."""
    text, used = val_txt.read_text(encoding="utf-8"), []
    total = 0
    for line in text.splitlines():
        if total + len(line) + 1 > limit and used:
            break
        used.append(line)
        total += len(line) + 1
    (out / "val.txt").write_text("\n".join(used) + "\n", encoding="utf-8")
    return "\n".join(used) + "\n"


# ---------------------------------------------------------------------------
# The model: run.c's forward pass in PyTorch
# ---------------------------------------------------------------------------

def build_model(cfg):
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            hd = cfg.dim // cfg.heads
            self.rms_att = nn.Parameter(torch.ones(cfg.dim))
            self.wq = nn.Linear(cfg.dim, cfg.dim, bias=False)
            self.wk = nn.Linear(cfg.dim, cfg.kv_heads * hd, bias=False)
            self.wv = nn.Linear(cfg.dim, cfg.kv_heads * hd, bias=False)
            self.wo = nn.Linear(cfg.dim, cfg.dim, bias=False)
            self.rms_ffn = nn.Parameter(torch.ones(cfg.dim))
            self.w1 = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)  # gate
            self.w2 = nn.Linear(cfg.hidden_dim, cfg.dim, bias=False)  # down
            self.w3 = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)  # up

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.cfg = cfg
            self.embedding = nn.Embedding(cfg.vocab, cfg.dim)
            self.layers = nn.ModuleList([Block() for _ in range(cfg.layers)])
            self.rms_final = nn.Parameter(torch.ones(cfg.dim))
            hd = cfg.dim // cfg.heads
            self.n_rotated = rope_angles(hd, cfg.rope_fraction)
            # omega_i = theta^(-2i/head_dim) for the rotated pairs only; float32 as run.c
            i = torch.arange(self.n_rotated, dtype=torch.float64)
            omega = (1.0 / cfg.rope_theta ** (2 * i / hd)).float()
            angles = torch.arange(cfg.max_seq_len, dtype=torch.float32)[:, None] * omega[None, :]
            self.register_buffer("cos", torch.cos(angles), persistent=False)
            self.register_buffer("sin", torch.sin(angles), persistent=False)

        def forward(self, tokens):
            """Logits (B, T, vocab) for tokens (B, T) at positions 0 .. T-1."""
            B, T = tokens.shape
            H, KV, hd = cfg.heads, cfg.kv_heads, cfg.dim // cfg.heads
            x = self.embedding(tokens)
            mask = torch.full((T, T), float("-inf")).triu(1)
            for layer in self.layers:
                h = rmsnorm(x, layer.rms_att)
                q = self.rotate(layer.wq(h).view(B, T, H, hd))
                k = self.rotate(layer.wk(h).view(B, T, KV, hd))
                v = layer.wv(h).view(B, T, KV, hd)
                k = k.repeat_interleave(H // KV, dim=2)  # query head j reads key head j // (H / KV)
                v = v.repeat_interleave(H // KV, dim=2)
                q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, hd)
                att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd) + mask, dim=-1)
                x = x + layer.wo((att @ v).transpose(1, 2).reshape(B, T, cfg.dim))
                h = rmsnorm(x, layer.rms_ffn)
                x = x + layer.w2(torch.nn.functional.silu(layer.w1(h)) * layer.w3(h))
            return rmsnorm(x, self.rms_final) @ self.embedding.weight.T  # the classifier is the embedding

        def rotate(self, x):
            """Rotates pairs (2i, 2i+1), i < n_rotated, of every head by pos * omega_i."""
            r = self.n_rotated
            if r == 0:
                return x
            T = x.shape[1]
            pairs = x[..., :2 * r].unflatten(-1, (r, 2))
            x0, x1 = pairs[..., 0], pairs[..., 1]
            cos, sin = self.cos[:T, None, :], self.sin[:T, None, :]  # (T, 1, r): the same for every head
            rotated = torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).flatten(-2)
            return torch.cat([rotated, x[..., 2 * r:]], dim=-1)

    def rmsnorm(x, weight):
        # run.c's rmsnorm: x / sqrt(mean(x^2) + eps) * weight, eps = 1e-5
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * weight

    model = Llama()
    # GPT-2 / llama2.c initialization: N(0, 0.02), the residual outputs scaled down by depth
    for name, param in model.named_parameters():
        if param.dim() == 2:
            std = 0.02 / math.sqrt(2 * cfg.layers) if name.endswith(("wo.weight", "w2.weight")) else 0.02
            torch.nn.init.normal_(param, mean=0.0, std=std)
    return model


# ---------------------------------------------------------------------------
# Writing the ROPE format (docs/format.md)
# ---------------------------------------------------------------------------

ROPE_MAGIC = 0x45504F52
HEADER_BYTES = 256


def write_rope(model, path):
    """The 256-byte header, then the tensors in file order, float32 little-endian."""
    import numpy as np
    cfg = model.cfg
    # rope_factor 1 and rope_scaling 0 (no rule); rope_original_len is the training window --seq-len, the
    # length a run-time scaling rule (run --rope-scaling) is relative to; seq_len is --max-seq-len
    header = struct.pack("<Ii7ii4f2i", ROPE_MAGIC, 1, cfg.dim, cfg.hidden_dim, cfg.layers, cfg.heads, cfg.kv_heads,
                         cfg.vocab, cfg.max_seq_len, 1, 1e-5, cfg.rope_theta, cfg.rope_fraction, 1.0,
                         0, cfg.seq_len)
    layers = model.layers

    def stack(name):
        return np.stack([getattr(layer, name).weight.detach().numpy() if hasattr(getattr(layer, name), "weight")
                         else getattr(layer, name).detach().numpy() for layer in layers])

    tensors = [model.embedding.weight.detach().numpy(), stack("rms_att"), stack("wq"), stack("wk"), stack("wv"),
               stack("wo"), stack("rms_ffn"), stack("w1"), stack("w2"), stack("w3"), model.rms_final.detach().numpy()]
    tmp = Path(str(path) + ".tmp")
    with open(tmp, "wb") as f:
        f.write(header + b"\0" * (HEADER_BYTES - len(header)))
        for t in tensors:
            f.write(np.ascontiguousarray(t, dtype="<f4").tobytes())
    os.replace(tmp, path)


# ---------------------------------------------------------------------------
# Training and scoring
# ---------------------------------------------------------------------------

def batch_of(stream, rng, batch, seq_len):
    """(inputs, targets): BOS + seq_len-1 tokens from random offsets, and the next tokens."""
    import numpy as np
    import torch
    starts = rng.integers(0, len(stream) - seq_len, size=batch)
    text = np.stack([stream[s:s + seq_len] for s in starts])  # seq_len tokens to predict
    inputs = np.concatenate([np.full((batch, 1), TOKEN_BOS), text[:, :-1]], axis=1)
    return torch.from_numpy(inputs.astype(np.int64)), torch.from_numpy(text.astype(np.int64))


def windows_nll(model, ids, window):
    """Sum of -log p(token) over ids, scored as run -m ppl does: consecutive windows of
    window - 1 tokens, each after a fresh BOS. Returns (sum, count)."""
    import numpy as np
    import torch
    per = window - 1
    total = 0.0
    with torch.no_grad():
        for start in range(0, len(ids), per * 16):
            chunk = [ids[s:s + per] for s in range(start, min(len(ids), start + per * 16), per)]
            for length in sorted(set(len(c) for c in chunk)):  # the last window may be shorter
                rows = [c for c in chunk if len(c) == length]
                text = torch.tensor(np.array(rows, dtype=np.int64))
                inputs = torch.cat([torch.full((len(rows), 1), TOKEN_BOS), text[:, :-1]], dim=1)
                logp = torch.log_softmax(model(inputs).double(), dim=-1)
                total -= logp.gather(-1, text[..., None]).sum().item()
    return total, len(ids)


def learning_rate(step, cfg):
    """Linear warm-up over the first 5% of steps, then cosine decay to a tenth."""
    warm = max(1, cfg.steps // 20)
    if step < warm:
        return cfg.lr * (step + 1) / warm
    progress = (step - warm) / max(1, cfg.steps - warm)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def format_seconds(s):
    return f"{int(s) // 60}m{int(s) % 60:02d}s"


def train(cfg):
    import numpy as np
    import torch
    torch.set_num_threads(cfg.threads or os.cpu_count() or 1)
    torch.manual_seed(cfg.seed)
    out, cache = Path(cfg.out), Path(cfg.cache)
    out.mkdir(parents=True, exist_ok=True)

    train_txt, val_txt = corpus_files(cache)
    sp, sp_model = tokenizer_model(cache, train_txt, cfg.vocab)
    r = subprocess.run([sys.executable, str(ROOT / "export.py"), "--tokenizer", str(sp_model), "-o",
                        str(out / "tokenizer.bin")], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"train.py: error: export.py --tokenizer failed: {r.stderr.strip()}")
    stream_path = cache / f"kjv_bpe{cfg.vocab}_train.npy"
    if not stream_path.exists():
        np.save(stream_path, np.array(sp.encode(train_txt.read_text(encoding="utf-8")), dtype=np.int16))
    stream = np.load(stream_path).astype(np.int64)
    val_text = write_val_text(out, val_txt, cfg.val_chars)
    val_ids = sp.encode(val_text)

    model = build_model(cfg)
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=cfg.lr, betas=(0.9, 0.95))
    rng = np.random.default_rng(cfg.seed)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.2f}M parameters, dim {cfg.dim}, {cfg.layers} layers, {cfg.heads}/{cfg.kv_heads} "
          f"heads, vocab {cfg.vocab}, p {cfg.rope_fraction} ({model.n_rotated} of {cfg.dim // cfg.heads // 2} pairs "
          f"rotate), theta {cfg.rope_theta:g}; corpus {len(stream)} tokens, val.txt {len(val_ids)} tokens")

    log = open(out / "log.csv", "w", newline="")
    writer = csv.writer(log)
    writer.writerow(["step", "train_loss", "val_loss", "elapsed_s"])
    t0, recent = time.time(), []
    for step in range(cfg.steps + 1):
        if step % cfg.eval_every == 0 or step == cfg.steps:
            model.eval()
            total, count = windows_nll(model, val_ids[:cfg.eval_tokens], cfg.seq_len)  # at the training length
            model.train()
            train_loss = sum(recent) / len(recent) if recent else float("nan")
            writer.writerow([step, f"{train_loss:.5f}", f"{total / count:.5f}", f"{time.time() - t0:.1f}"])
            log.flush()
            recent = []
        if step == cfg.steps:
            break
        for group in opt.param_groups:
            group["lr"] = learning_rate(step, cfg)
        inputs, targets = batch_of(stream, rng, cfg.batch, cfg.seq_len)
        logits = model(inputs)
        loss = torch.nn.functional.cross_entropy(logits.view(-1, cfg.vocab), targets.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        recent.append(loss.item())
        if (step + 1) % 10 == 0 or step + 1 == cfg.steps:
            elapsed = time.time() - t0
            rate = (step + 1) * cfg.batch * cfg.seq_len / elapsed
            left = elapsed / (step + 1) * (cfg.steps - step - 1)
            print(f"step {step + 1}/{cfg.steps} | loss {loss.item():.4f} | {rate:,.0f} tok/s | "
                  f"{format_seconds(left)} left", file=sys.stderr, flush=True)
    log.close()

    write_rope(model, out / "model.bin")
    model.eval()
    total, count = windows_nll(model, val_ids, cfg.max_seq_len)  # as run -m ppl with the header's seq_len
    print(f"wrote {out / 'model.bin'}, {out / 'tokenizer.bin'}, {out / 'val.txt'}, {out / 'log.csv'} "
          f"in {format_seconds(time.time() - t0)}")
    print(f"val_nll: {total / count:.6f}")


def main(argv):
    cfg = parse_args(argv)
    try:
        import torch  # noqa: F401
    except ImportError:
        sys.exit("train.py: error: PyTorch is missing; apt-get install python3-torch libopenblas0-pthread")
    train(cfg)


if __name__ == "__main__":
    main(sys.argv[1:])
