#!/usr/bin/env python3
"""Mixture-of-experts speed: does a token read only its experts? (`make bench-moe`,
and the last part of `make bench`)

    python3 bench/moe.py [--quick] [--threads 1,2] [--runs N]

Two random-weight bf16 models of the same bytes a token reads, written into bench/ on
first use through export.py from Hugging Face checkpoints (bench/moe-*/, gitignored):
  moe    Qwen3-30B-A3B's layer (dim 2048, 32 query heads and 4 key/value heads of 128,
         q/k norms, 128 experts of width 768, 8 a token, renormalized), 4 layers, a
         32000-token vocabulary (the llama2.c tokenizer's): 4.9 GB of matrices, of
         which a token reads 0.58 GB;
  dense  the same attention with a dense SwiGLU feed-forward of width 8 x 768 = 6144
         (Qwen3-30B-A3B's own intermediate_size): the same 0.58 GB a token, all of it.
Each round decodes 128 tokens with each, in a balanced order (moe, dense, dense, moe,
or the reverse, alternating by round); the ratio is of decode tok/s, each model's two
runs together, and the figure printed the median over rounds of each round's ratio.

With LLAMA_BENCH (llama.cpp's llama-bench, whose convert_hf_to_gguf.py is two folders
up, as in its source tree; it needs python3-torch and python3-sentencepiece) a third
model runs side by side with llama.cpp on the same weights: a Mixtral (dim 2048, 16
query heads and 4 key/value heads of 128, 8 experts of width 5632, 2 a token), 4
layers, Llama 2's 32000-token SentencePiece vocabulary (models/tokenizer.model), in
bf16 for both (llama.cpp's BF16 GGUF from convert_hf_to_gguf.py --outtype bf16). Each
round runs our decode and prefill and llama-bench's tg and pp next to each other.

Only numpy and the standard library (and bench.py's runner).
"""
import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import time

import numpy as np

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, BENCH)
sys.path.insert(0, os.path.join(ROOT, "tests"))
import bench  # noqa: E402  (the runner, the machine line)
import hf_fixture  # noqa: E402  (bf16 rounding)

QWEN3_MOE = dict(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], hidden_size=2048,
                 intermediate_size=6144, moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
                 norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], num_hidden_layers=4,
                 num_attention_heads=32, num_key_value_heads=4, head_dim=128, vocab_size=32000,
                 max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False,
                 hidden_act="silu", torch_dtype="bfloat16")
QWEN3_DENSE = dict(QWEN3_MOE, model_type="qwen3", architectures=["Qwen3ForCausalLM"])
for key in ("moe_intermediate_size", "num_experts", "num_experts_per_tok", "norm_topk_prob", "decoder_sparse_step",
            "mlp_only_layers"):
    del QWEN3_DENSE[key]
MIXTRAL = dict(model_type="mixtral", architectures=["MixtralForCausalLM"], hidden_size=2048, intermediate_size=5632,
               num_local_experts=8, num_experts_per_tok=2, num_hidden_layers=4, num_attention_heads=16,
               num_key_value_heads=4, vocab_size=32000, max_position_embeddings=4096, rms_norm_eps=1e-5,
               rope_theta=1000000.0, sliding_window=None, tie_word_embeddings=False, hidden_act="silu",
               torch_dtype="bfloat16", bos_token_id=1, eos_token_id=2)
DECODE_TOKENS = 128
PROMPT_TOKENS = 128


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def random_bf16(rng, shape, scale):
    """Normal weights times scale, as bf16 bits (uint16), rounded to nearest even."""
    return hf_fixture.float32_to_bf16_bits((rng.standard_normal(shape, dtype=np.float32) * scale))


def write_bf16_safetensors(path, tensors):
    """{name: uint16 bf16 bits} as a safetensors file of BF16 tensors."""
    header, offset = {}, 0
    for name, bits in tensors.items():
        header[name] = {"dtype": "BF16", "shape": list(bits.shape), "data_offsets": [offset, offset + bits.nbytes]}
        offset += bits.nbytes
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        for bits in tensors.values():
            f.write(bits.astype("<u2").tobytes())


def write_hf(path, config):
    """A Hugging Face checkpoint of config with random bf16 weights (one shard a layer, as
    published checkpoints shard), unless already there."""
    done = os.path.join(path, "done")
    if os.path.exists(done):
        return
    log(f"bench: writing the random {config['model_type']} checkpoint {os.path.relpath(path, ROOT)} ...")
    t0 = time.time()
    os.makedirs(path, exist_ok=True)
    rng = np.random.default_rng(1)
    dim, L = config["hidden_size"], config["num_hidden_layers"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    hd = config.get("head_dim", dim // heads)
    s = dim ** -0.5
    shards = []

    def shard(name, tensors):
        write_bf16_safetensors(os.path.join(path, name), tensors)
        shards.append((name, list(tensors)))

    ones = lambda n: hf_fixture.float32_to_bf16_bits(np.ones(n, np.float32))  # noqa: E731
    shard("model-embed.safetensors", {"model.embed_tokens.weight": random_bf16(rng, (config["vocab_size"], dim), 1.0),
                                      "lm_head.weight": random_bf16(rng, (config["vocab_size"], dim), s),
                                      "model.norm.weight": ones(dim)})
    for l in range(L):
        p = f"model.layers.{l}."
        t = {p + "input_layernorm.weight": ones(dim), p + "post_attention_layernorm.weight": ones(dim),
             p + "self_attn.q_proj.weight": random_bf16(rng, (heads * hd, dim), s),
             p + "self_attn.k_proj.weight": random_bf16(rng, (kv * hd, dim), s),
             p + "self_attn.v_proj.weight": random_bf16(rng, (kv * hd, dim), s),
             p + "self_attn.o_proj.weight": random_bf16(rng, (dim, heads * hd), s)}
        if config["model_type"].startswith("qwen3"):
            t[p + "self_attn.q_norm.weight"] = ones(hd)
            t[p + "self_attn.k_norm.weight"] = ones(hd)
        if config["model_type"] == "qwen3":
            H = config["intermediate_size"]
            t.update({p + "mlp.gate_proj.weight": random_bf16(rng, (H, dim), s),
                      p + "mlp.up_proj.weight": random_bf16(rng, (H, dim), s),
                      p + "mlp.down_proj.weight": random_bf16(rng, (dim, H), H ** -0.5)})
        else:
            moe = config["model_type"] == "qwen3_moe"
            E = config["num_experts"] if moe else config["num_local_experts"]
            H = config["moe_intermediate_size"] if moe else config["intermediate_size"]
            base = p + ("mlp." if moe else "block_sparse_moe.")
            names = ("gate_proj", "up_proj", "down_proj") if moe else ("w1", "w3", "w2")
            t[base + "gate.weight"] = random_bf16(rng, (E, dim), s)
            for e in range(E):
                q = f"{base}experts.{e}."
                t[q + names[0] + ".weight"] = random_bf16(rng, (H, dim), s)
                t[q + names[1] + ".weight"] = random_bf16(rng, (H, dim), s)
                t[q + names[2] + ".weight"] = random_bf16(rng, (dim, H), H ** -0.5)
        shard(f"model-layer{l}.safetensors", t)
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": {n: name for name, ns in shards for n in ns}}, f)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    open(done, "w").close()
    log(f"bench: ... written in {time.time() - t0:.0f} s")


def export(hf_dir, out):
    if not os.path.exists(out) or os.path.getmtime(out) < os.path.getmtime(os.path.join(hf_dir, "done")):
        log(f"bench: exporting {os.path.relpath(out, ROOT)} (export.py, bf16) ...")
        subprocess.run([sys.executable, os.path.join(ROOT, "export.py"), hf_dir, out], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return out


def read_per_token(runner, model):
    """What run's start-up line says a token reads (GB), or None for a dense model."""
    out = subprocess.run(runner.cmd(model, "-n", "1", "-t", "0", "-p", "a"), capture_output=True, text=True,
                         check=True).stderr
    for line in out.splitlines():
        if "a token reads" in line:
            return float(line.split("a token reads ")[1].split()[0])
    return None


# llama.cpp's converter on Debian's packages: their torch (1.13) predates the float8 types
# the converter names in a table (for checkpoints that hold them; these hold bf16), and
# there is no safetensors or tqdm package. Stand-ins: the float8 names, a reader of the
# BF16 tensors these checkpoints hold (safe_open's keys and get_tensor, which the
# converter calls with --no-lazy), and a progress bar that shows nothing.
CONVERTER_SHIM = """
import json, runpy, struct, sys, types
import numpy as np, torch
for name in ("float8_e4m3fn", "float8_e5m2"):
    if not hasattr(torch, name):
        setattr(torch, name, torch.float16)
class safe_open:
    def __init__(self, path, framework="pt", device="cpu"):
        self.data = open(path, "rb").read()
        n = struct.unpack_from("<Q", self.data)[0]
        self.header = {k: v for k, v in json.loads(self.data[8:8 + n]).items() if k != "__metadata__"}
        self.start = 8 + n
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        return False
    def keys(self):
        return list(self.header)
    def get_tensor(self, name):
        entry = self.header[name]
        assert entry["dtype"] == "BF16", entry["dtype"]
        a, b = entry["data_offsets"]
        bits = np.frombuffer(self.data[self.start + a:self.start + b], dtype="<i2").reshape(entry["shape"])
        return torch.from_numpy(bits.copy()).view(torch.bfloat16)
class tqdm:  # the writer's progress bar: none
    def __init__(self, *args, **kwargs):
        pass
    def update(self, n):
        pass
    def set_description(self, text):
        pass
    def reset(self, total=None):
        pass
sys.modules["safetensors"] = types.SimpleNamespace(safe_open=safe_open)
sys.modules["tqdm"] = types.SimpleNamespace(tqdm=tqdm)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def gguf_of(hf_dir, llama_bench):
    """llama.cpp's BF16 GGUF of hf_dir, by its convert_hf_to_gguf.py (with models/tokenizer.model)."""
    out = hf_dir.rstrip("/") + "-bf16.gguf"
    if os.path.exists(out):
        return out
    convert = os.path.join(os.path.dirname(llama_bench), "..", "..", "convert_hf_to_gguf.py")
    tok = os.path.join(ROOT, "models", "tokenizer.model")
    if not os.path.exists(os.path.join(hf_dir, "tokenizer.model")):  # the converter reads the vocabulary there
        with open(tok, "rb") as src, open(os.path.join(hf_dir, "tokenizer.model"), "wb") as dst:
            dst.write(src.read())
    log(f"bench: writing {os.path.relpath(out, ROOT)} (llama.cpp's convert_hf_to_gguf.py --outtype bf16) ...")
    tmp = out + ".tmp"  # renamed once whole, so that a failed conversion leaves no file to be taken for one
    r = subprocess.run([sys.executable, "-c", CONVERTER_SHIM, convert, hf_dir, "--outtype", "bf16", "--no-lazy",
                        "--outfile", tmp],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise SystemExit(f"bench: llama.cpp's convert_hf_to_gguf.py failed:\n{r.stderr[-2000:]}")
    os.replace(tmp, out)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="one round, one thread count")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--runs", type=int, default=5, help="rounds per figure (default 5)")
    args = ap.parse_args()
    threads = [int(t) for t in args.threads.split(",")][:1 if args.quick else None]
    rounds = 1 if args.quick else args.runs
    run_bin = os.environ.get("RUN_BIN", os.path.join(ROOT, "run"))
    tokenizer = os.path.join(ROOT, "models", "tokenizer.bin")
    runner = bench.Runner(run_bin, tokenizer, 20.0 if args.quick else bench.WAIT_BUDGET)
    lbench = os.environ.get("LLAMA_BENCH") or None

    moe_dir, dense_dir = os.path.join(BENCH, "moe-qwen3moe"), os.path.join(BENCH, "moe-qwen3dense")
    write_hf(moe_dir, QWEN3_MOE)
    write_hf(dense_dir, QWEN3_DENSE)
    moe = export(moe_dir, os.path.join(BENCH, "moe_qwen3moe.bin"))
    dense = export(dense_dir, os.path.join(BENCH, "moe_qwen3dense.bin"))
    reads = read_per_token(runner, moe)
    prompt, n_prompt = bench.make_prompt(runner, moe, PROMPT_TOKENS)
    out = ["## Mixture of experts: decode reads only the chosen experts", "", bench.machine_line(), "",
           f"Qwen3-30B-A3B's layer x 4 (128 experts of 768, 8 a token), bf16: run's start-up line says a token "
           f"reads {reads} GB of matrices; the dense model of the same attention and a 6144-wide feed-forward "
           "reads the same.", "",
           "| threads | MoE decode tok/s | dense decode tok/s | MoE / dense (median of rounds) | MoE prefill tok/s | "
           "dense prefill tok/s |", "|---:|---:|---:|---:|---:|---:|"]
    for t in threads:
        ratios, rates, pre = [], {"moe": [], "dense": []}, {"moe": [], "dense": []}
        for r in range(rounds):
            order = ["moe", "dense", "dense", "moe"] if r % 2 == 0 else ["dense", "moe", "moe", "dense"]
            got = {"moe": [], "dense": []}
            for which in order:
                model = moe if which == "moe" else dense
                res, _ = runner.timed_quiet(model, t, "Once upon a time", DECODE_TOKENS, [3])
                got[which].append(res[3])
            for which in got:
                rates[which].append(statistics.mean(got[which]))
            ratios.append(rates["moe"][-1] / rates["dense"][-1])
            for which, model in (("moe", moe), ("dense", dense)):
                res, _ = runner.timed_quiet(model, t, prompt, n_prompt, [3])
                pre[which].append(res[1])
            log(f"bench: moe, {t} thread(s), round {r + 1}: MoE {rates['moe'][-1]:.2f}, dense "
                f"{rates['dense'][-1]:.2f} tok/s")
        med = statistics.median
        out.append(f"| {t} | {med(rates['moe']):.2f} | {med(rates['dense']):.2f} | {med(ratios):.3f} | "
                   f"{med(pre['moe']):.1f} | {med(pre['dense']):.1f} |")
    if lbench:
        mix_dir = os.path.join(BENCH, "moe-mixtral")
        write_hf(mix_dir, MIXTRAL)
        mix = export(mix_dir, os.path.join(BENCH, "moe_mixtral.bin"))
        gguf = gguf_of(mix_dir, lbench)
        reads = read_per_token(runner, mix)
        out += ["", f"A Mixtral (dim 2048, 8 experts of 5632, 2 a token) x 4 layers, bf16, on the same weights as "
                f"llama.cpp's BF16 GGUF (a token reads {reads} GB of matrices):", "",
                "| threads | run decode tok/s | llama.cpp tg tok/s | run / llama.cpp decode | run prefill tok/s | "
                "llama.cpp pp tok/s | run / llama.cpp prefill |", "|---:|---:|---:|---:|---:|---:|---:|"]
        prompt, n_prompt = bench.make_prompt(runner, mix, PROMPT_TOKENS)
        for t in threads:
            dec, pre, tg, pp, rd, rp = [], [], [], [], [], []
            for r in range(rounds):
                res, _ = runner.timed_quiet(mix, t, "Once upon a time", DECODE_TOKENS, [3])
                dec.append(res[3])
                lb, _ = runner.timed_quiet(None, t, None, None, [3], run=lambda stoppable: bench.llama_bench(
                    runner, lbench, gguf, t, n_prompt, DECODE_TOKENS, stoppable))
                pp.append(lb[0])
                tg.append(lb[1])
                res, _ = runner.timed_quiet(mix, t, prompt, n_prompt, [3])
                pre.append(res[1])
                rd.append(dec[-1] / tg[-1])
                rp.append(pre[-1] / pp[-1])
                log(f"bench: mixtral, {t} thread(s), round {r + 1}: run {dec[-1]:.2f} / llama.cpp {tg[-1]:.2f} "
                    f"tok/s decode")
            med = statistics.median
            out.append(f"| {t} | {med(dec):.2f} | {med(tg):.2f} | {med(rd):.3f} | {med(pre):.1f} | {med(pp):.1f} | "
                       f"{med(rp):.3f} |")
    print("\n".join(out))


if __name__ == "__main__":
    main()
