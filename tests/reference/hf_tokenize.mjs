// Reference encodings for the hf_tokenizer tests: runs @huggingface/tokenizers (JavaScript, an
// implementation independent of fp8rl's) on a tokenizer folder, one JSON object per line:
//   {"text": "...", "add_special_tokens": false}  ->  {"ids": [...]}
//   {"ids": [...]}                                 ->  {"text": "..."}   (special tokens kept)
// usage: node hf_tokenize.mjs NODE_MODULES_DIR TOKENIZER_DIR < in.jsonl > out.jsonl
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [modulesDir, tokenizerDir] = process.argv.slice(2);
if (!modulesDir || !tokenizerDir) {
  process.stderr.write("usage: node hf_tokenize.mjs NODE_MODULES_DIR TOKENIZER_DIR\n");
  process.exit(2);
}
const entry = join(modulesDir, "@huggingface", "tokenizers", "dist", "tokenizers.mjs");
const { Tokenizer } = await import(pathToFileURL(entry).href);
const readJson = (name) => JSON.parse(readFileSync(join(tokenizerDir, name), "utf8"));
const tokenizer = new Tokenizer(readJson("tokenizer.json"), readJson("tokenizer_config.json"));

const input = readFileSync(0, "utf8");
const out = [];
for (const line of input.split("\n")) {
  if (line.trim() === "") continue;
  const req = JSON.parse(line);
  if (Array.isArray(req.ids)) {
    const text = tokenizer.decode(req.ids, {
      skip_special_tokens: false,
      clean_up_tokenization_spaces: false,
    });
    out.push(JSON.stringify({ text }));
  } else {
    const enc = tokenizer.encode(req.text, { add_special_tokens: req.add_special_tokens === true });
    out.push(JSON.stringify({ ids: enc.ids }));
  }
}
process.stdout.write(out.join("\n") + (out.length ? "\n" : ""));
