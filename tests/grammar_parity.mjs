// web/grammar.js's GrammarHost in node, for tests/test_grammar_parity.py: a JSON request a line
// on stdin, a JSON answer a line on stdout.
//
//   node tests/grammar_parity.mjs XGRAMMAR_INDEX_JS VOCAB_FILE VOCAB_SIZE STOP_IDS(comma-separated) SEPARATORS(JSON)
//   VOCAB_FILE: u32 token count n, n u32 ends, then the tokens' bytes (cera.constrain.token_bytes)
//   {"op": "compile", "kind", "source"} -> {"id"} | {"name", "error": message}
//   {"op": "matcher", "grammar"} -> {"id"}
//   {"op": "walk", "matcher", "tokens"} -> {"masks": [base64 words: one before each token taken,
//        then one after the last; a refused token ends the walk]}
//   {"op": "free", "id"} -> {}

import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { createInterface } from "node:readline";
import { pathToFileURL } from "node:url";
import { GrammarHost } from "../web/grammar.js";

const [index, vocabFile, vocabSize, stops, separators] = process.argv.slice(2);
// the bundle's node branch reads CommonJS globals, which an ES module scope lacks
globalThis.require = createRequire(index);
globalThis.__filename = index;
// stdout carries the answers: XGrammar's own output (warnings) goes to stderr
const answer = (value) => process.stdout.write(JSON.stringify(value) + "\n");
console.log = console.error;

const file = readFileSync(vocabFile);
const n = file.readUInt32LE(0);
const ends = new Uint32Array(file.buffer.slice(file.byteOffset + 4, file.byteOffset + 4 + 4 * n));
const tokens = new Uint8Array(file.buffer, file.byteOffset + 4 + 4 * n);
const host = await GrammarHost.create(tokens, ends, Number(vocabSize), stops.split(",").map(Number),
  JSON.parse(separators), pathToFileURL(index).href);

function walk(id, path) {
  const masks = [];
  for (let i = 0; ; i++) {
    const words = host.mask(id);
    masks.push(Buffer.from(words.buffer, words.byteOffset, words.byteLength).toString("base64"));
    if (i === path.length || !host.accept(id, path[i])) return { masks };
  }
}

const ops = {
  compile: ({ kind, source }) => {
    try {
      return { id: host.compile(kind, source) };
    } catch (err) {
      return { name: err.name, error: err.message };
    }
  },
  matcher: ({ grammar }) => ({ id: host.matcher(grammar) }),
  walk: ({ matcher, tokens }) => walk(matcher, tokens),
  free: ({ id }) => (host.free(id), {}),
};

answer({ ready: true });
for await (const line of createInterface({ input: process.stdin })) {
  const request = JSON.parse(line);
  answer(ops[request.op](request));
}
