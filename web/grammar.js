// Constrained output in the page: XGrammar compiled to WebAssembly (@mlc-ai/web-xgrammar, the
// engine WebLLM uses), over the vocabulary cera.constrain.token_bytes gives llguidance natively,
// with JSON set up to accept llguidance's language (below). cera_web/grammar.py drives it, one
// call per decoded token; it runs in the worker and, for the parity test, in node.
//
// Two facts about the npm build shape this file:
// - its wrappers are async (each awaits the wasm instance), but a mask is wanted synchronously
//   (the sampler's hook is a plain call), so the host calls the embind objects underneath, which
//   are synchronous once the instance runs, and copies masks out of the instance's memory;
// - a grammar it cannot read aborts the whole instance (a "[FATAL] file:line: message" on
//   stderr, then abort()), so every new grammar is first read by a spare instance, which dies
//   in its place and is replaced; the instance holding the vocabulary only reads grammars a
//   spare has read.

import { CeraError } from "./errors.js";

export const XGRAMMAR = new URL("./xgrammar/index.js", import.meta.url).href;   // where the site has it
const SPARES = 2;                                    // spare instances kept ready

export class GrammarHost {
  // tokens: each token's bytes as the grammar reads them (token_bytes: control tokens behind a
  // 0xFF, which no text matches), concatenated (a Uint8Array); ends: where each token's bytes end
  // in `tokens`; vocabSize: the model's (ids past the tokens are never allowed); stopIds: the
  // end-of-generation tokens, allowed where the grammar is complete; separators: JSON's between
  // items and between key and value (cera.constrain.JSON_SEPARATORS); url: XGrammar's bundle
  // (lib/index.js of the npm package).
  static async create(tokens, ends, vocabSize, stopIds, [item, key], url = XGRAMMAR) {
    const engine = await start(url);
    // bytes, not strings ("raw": as given): embind passes a Uint8Array to std::string unchanged,
    // and a token's bytes need not be UTF-8 (part of a character, the 0xFF mark)
    const vocab = Array.from(ends, (end, i) => tokens.subarray(i ? ends[i - 1] : 0, end));
    const info = await engine.xgrammar.TokenizerInfo.createTokenizerInfo(vocab, "raw", false, vocabSize,
      Array.from(stopIds));
    const compiler = await engine.xgrammar.GrammarCompiler.createGrammarCompiler(info, false);
    const spares = [];
    for (let i = 0; i < SPARES; i++) spares.push(await start(url, []));
    return new GrammarHost(url, engine, compiler.handle, vocabSize, spares, { first: item, second: key });
  }

  constructor(url, engine, compiler, vocabSize, spares, separators) {
    this.url = url;
    this.separators = separators;     // XGrammar's JSON separators (first: between items)
    this.engine = engine;             // the instance holding the vocabulary
    this.compiler = compiler;         // its embind GrammarCompiler
    this.vocabSize = vocabSize;
    this.spares = spares;             // instances that read each new grammar first
    this.words = new Uint32Array(Math.ceil(vocabSize / 32));   // the last mask
    this.tail = vocabSize % 32 ? 2 ** (vocabSize % 32) - 1 : 2 ** 32 - 1;   // the last word's bits of tokens
    this.objects = [null];            // id -> embind CompiledGrammar | GrammarMatcher
    this.unused = [];                 // ids free for reuse
  }

  // A compiled grammar's id. kind: "json_schema" (JSON text), "regex" or "grammar" (GBNF, root
  // rule `root`). Throws a CeraError InvalidArgument with the reason if it cannot be read.
  compile(kind, source) {
    const read = this.read(kind, source);
    if (kind === "regex") return this.put(this.compiler.CompileStructuralTag(read));
    const grammar = this.engine.Grammar.FromEBNF(read, "root");
    try {
      return this.put(this.compiler.CompileGrammar(grammar));
    } finally {
      grammar.delete();
    }
  }

  // A new walk through compiled grammar `id`, from its start: a matcher's id.
  matcher(id) {
    return this.put(new this.engine.GrammarMatcher(this.objects[id], undefined, false, -1));
  }

  // The tokens matcher `id` allows next: bit i % 32 of word i / 32 (a view, valid until the next
  // call). None once it has taken a stop token (XGrammar would abort if asked).
  mask(id) {
    const matcher = this.objects[id];
    if (matcher.IsTerminated()) return this.words.fill(0);
    const vector = matcher.GetNextTokenBitmask(this.vocabSize);   // a std::vector<int32_t>
    const heap = this.engine.memory.buffer;
    // $$.ptr: embind's address of the C++ object; libc++'s vector starts with its data pointer
    const [begin] = new Uint32Array(heap, vector.$$.ptr, 1);
    this.words.set(new Uint32Array(heap, begin, this.words.length));
    this.words[this.words.length - 1] &= this.tail;   // XGrammar may set the bits past the vocabulary
    vector.delete();
    return this.words;
  }

  // Matcher `id` takes `token`; false if its grammar does not allow it (the matcher is unchanged).
  accept(id, token) {
    return this.objects[id].AcceptToken(token, false);
  }

  free(id) {
    this.objects[id].delete();
    this.objects[id] = null;
    this.unused.push(id);
  }

  put(object) {
    const id = this.unused.length ? this.unused.pop() : this.objects.length;
    this.objects[id] = object;
    return id;
  }

  // `source` as the main instance will read it (EBNF; a structural tag for a regex), read by a
  // spare first. A spare that fails is dead: a new one is started in its place.
  read(kind, source) {
    const request = kind === "json_schema" ? jsonNumbers(source) : source;
    const spare = this.spares.shift();
    if (!spare) {
      throw new CeraError("InvalidArgument", `XGrammar is still restarting after the last ${label(kind)} it could ` +
        "not read: try again in a moment");
    }
    try {
      const read = translate(spare.Grammar, kind, request, this.separators);
      this.spares.unshift(spare);
      return read;
    } catch (err) {
      start(this.url, []).then((fresh) => this.spares.push(fresh));
      throw new CeraError("InvalidArgument", `the ${label(kind)} does not compile: ${fatal(spare.stderr, err)}`);
    }
  }
}

const label = (kind) => kind.replace("_", " ");

// The request of `kind` in the form the main instance compiles, read (and so checked) with the
// embind Grammar class of a spare.
function translate(Grammar, kind, request, separators) {
  let grammar, read;
  if (kind === "json_schema") {
    const xgrammar = Grammar.FromJSONSchema(request.schema, false, undefined, separators, false, undefined, false);
    read = llguidanceJson(xgrammar.ToString(), request.numbers);
    xgrammar.delete();
    grammar = Grammar.FromEBNF(read, "root");
  } else if (kind === "regex") {
    read = JSON.stringify({ type: "structural_tag", format: { type: "regex", pattern: request } });
    grammar = Grammar.FromStructuralTag(read);
  } else if (kind === "grammar") {
    read = request;
    grammar = Grammar.FromEBNF(request, "root");
  } else {
    throw new Error(`unknown constraint kind ${kind}`);
  }
  grammar.delete();
  return read;
}

// The message of XGrammar's fatal error, from the instance's stderr ("[FATAL] file:line: message"
// and any lines after it), else the exception's.
function fatal(stderr, err) {
  const at = stderr.findLastIndex((line) => line.startsWith("[FATAL] "));
  if (at < 0) return String(err?.message ?? err);
  const lines = stderr.slice(at).filter((line) => line !== "Aborted()");
  return lines.join("\n").replace(/^\[FATAL\] \S+:\d+: /, "");
}

// --- JSON as llguidance reads it ----------------------------------------------------------------
// XGrammar's JSON schema grammar (compact: no whitespace but the separators; properties beyond the
// schema's allowed, its strict mode off) is printed as EBNF, a rule a line, and edited where its
// language differs from llguidance's (cera.constrain.LLGuidance):
// - strings: any character but " \ U+0000-U+001F U+007F, the escapes \" \\ \b \f \n \r \t, and \u
//   only for U+0000-U+001F and U+007F (XGrammar allows \/, any \uXXXX and a raw U+007F; in strings
//   of bounded length, no escape at all but raw control characters);
// - integers and numbers: XGrammar's ranges are approximate (maximum 120 admits 129, at most six
//   digits after the point), so each numeric schema is handed to it as a placeholder constant and
//   spliced back as llguidance's own range (rx_int_range, rx_float_range in its
//   parser/src/json/numeric.rs), digit for digit, quirks included (-0 where minimum < 0 <= maximum;
//   no negative fraction ending in 0 between -1 and 0); a multipleOf of 10^-k allows at most k
//   digits after the point. Other multipleOf values, and numbers beside anyOf, enum and the like,
//   stay XGrammar's.
const STRING_RULES = {
  basic_escape: String.raw`["\\bfnrt] | "u" "00" ([01] [0-9A-Fa-f] | "7" [Ff])`,
};
const STRING_CLASSES = [
  [String.raw`[^\0-\x1f\"\\\r\n]`, String.raw`[^\0-\x1f\x7f\"\\]`],                  // any string
  [String.raw`[^\"\\\r\n]`, String.raw`([^\0-\x1f\x7f\"\\] | "\\" basic_escape)`],    // minLength, maxLength
];
const NUMERIC = new Set(["type", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
  "title", "description", "default", "examples", "$comment"]);
const COMBINED = ["anyOf", "allOf", "oneOf", "not", "$ref", "enum", "const", "if"];
const DATA = new Set(["const", "enum", "default", "examples"]);   // values that are JSON data, not schemas
const placeholder = (i) => `cera:number:${i}`;

// The schema (JSON text) with each numeric schema it can replace by a placeholder, and the EBNF of
// each placeholder: {schema, numbers}.
function jsonNumbers(source) {
  const numbers = [];
  const walk = (schema) => {
    if (Array.isArray(schema)) return schema.map(walk);
    if (schema === null || typeof schema !== "object") return schema;
    const out = Object.fromEntries(Object.entries(schema).map(([k, v]) => [k, DATA.has(k) ? v : walk(v)]));
    const types = [out.type].flat();
    const numeric = types.filter((t) => t === "integer" || t === "number");
    const rule = numeric.length && !COMBINED.some((k) => k in out) ? numberRule(out, numeric) : null;
    if (rule === null) return out;
    numbers.push(rule);
    const constant = { const: placeholder(numbers.length - 1) };
    const others = types.filter((t) => !numeric.includes(t));
    if (!others.length) return constant;
    const rest = Object.fromEntries(Object.entries(out).filter(([k]) => !NUMERIC.has(k) || k === "type"));
    return { anyOf: [constant, { ...rest, type: others }] };
  };
  return { schema: JSON.stringify(walk(JSON.parse(source))), numbers };
}

function llguidanceJson(ebnf, numbers) {
  const lines = ebnf.split("\n").map((line) => {
    const name = line.slice(0, line.indexOf(" ::= "));
    if (name in STRING_RULES) return `${name} ::= ${STRING_RULES[name]}`;
    for (const [from, to] of STRING_CLASSES) line = line.replaceAll(from, to);
    return numbers.reduce((l, _, i) => l.replaceAll(`"\\"${placeholder(i)}\\""`, `cera_number_${i}`), line);
  });
  return [...lines, ...numbers.map((rule, i) => `cera_number_${i} ::= ${rule}`)].join("\n");
}

// llguidance's language of one numeric schema in EBNF, or null where it is not reproduced here.
function numberRule(schema, types) {
  const [low, lowOpen] = bound(schema.minimum, schema.exclusiveMinimum, (x, v) => x >= v);
  const [high, highOpen] = bound(schema.maximum, schema.exclusiveMaximum, (x, v) => x <= v);
  const room = schema.multipleOf === undefined ? Infinity : decimals(Math.abs(schema.multipleOf));
  if (room === null) return null;
  const empty = () => new CeraError("InvalidArgument", `the json schema does not compile: no ${types.join(" or ")} ` +
    `lies between ${low} and ${high}`);
  if (low !== null && high !== null && (low > high || (low === high && (lowOpen || highOpen)))) throw empty();
  if (types.includes("number")) return floatRange(low, high, !lowOpen, !highOpen, room);
  const first = low === null ? null : BigInt(lowOpen && Number.isInteger(low) ? low + 1 : Math.ceil(low));
  const last = high === null ? null : BigInt(highOpen && Number.isInteger(high) ? high - 1 : Math.floor(high));
  if (first !== null && last !== null && first > last) throw empty();
  return intRange(first, last);
}

// [value, exclusive] of a bound from its inclusive and exclusive keywords (a boolean exclusive
// keyword is draft 4's), as llguidance's get_minimum/get_maximum: the exclusive one where it is
// at least as tight.
function bound(inclusive, exclusive, tighter) {
  const x = exclusive === true ? inclusive : typeof exclusive === "number" ? exclusive : undefined;
  if (x === undefined) return [inclusive ?? null, false];
  return inclusive === undefined || tighter(x, inclusive) ? [x, true] : [inclusive, false];
}

// k where step is 10^-k (a multipleOf that only limits the digits after the point), else null.
function decimals(step) {
  for (let k = 0; k <= 20; k++) if (step === Number(`1e-${k}`)) return k;
  return null;
}

const or = (parts) => {
  const live = parts.filter((p) => p !== null);
  return live.length === 0 ? null : live.length === 1 ? live[0] : `(${live.join(" | ")})`;
};
const seq = (...parts) => (parts.includes(null) ? null : parts.filter((p) => p !== "").join(" "));
const lit = (text) => `"${text}"`;
const digits = (room) => (room === Infinity ? "[0-9]*" : room > 0 ? `[0-9]{0,${room}}` : "");
const point = (fraction) => (fraction === null ? "" : `("." ${fraction})?`);   // an optional fraction
const some = (cls, room) => (room === Infinity ? `${cls}+` : room > 0 ? `${cls}{1,${room}}` : null);

// rx_int_range: the integers in [low, high] (BigInt or null: unbounded).
function intRange(low, high) {
  if (low === null && high === null) return `"-"? ("0" | [1-9] [0-9]*)`;
  if (high === null) {
    if (low < 0n) return or([intRange(low, -1n), intRange(0n, null)]);
    const n = String(low).length;
    return or([intRange(low, 10n ** BigInt(n) - 1n), `[1-9] [0-9]{${n},}`]);
  }
  if (low === null) return high >= 0n ? or([intRange(0n, high), intRange(null, -1n)]) : seq(`"-"`, intRange(-high, null));
  if (low < 0n) {
    return high < 0n ? seq(`"-"`, intRange(-high, -low)) : or([seq(`"-"`, intRange(0n, -low)), intRange(0n, high)]);
  }
  const l = String(low), r = String(high);
  if (l.length !== r.length) {
    const split = 10n ** BigInt(l.length) - 1n;
    return or([intRange(low, split), intRange(split + 1n, high)]);
  }
  if (low === high) return lit(l);
  const [lpref, lx, rpref, rx] = [l.slice(0, -1), l.at(-1), r.slice(0, -1), r.at(-1)];
  if (lpref === rpref) return seq(lpref ? lit(lpref) : "", `[${lx}-${rx}]`);
  let [left, right] = [BigInt(lpref || "0"), BigInt(rpref || "0")];
  const parts = [];
  if (lx !== "0") {
    parts.push(seq(lit(lpref), `[${lx}-9]`));
    left++;
  }
  if (rx !== "9") {
    parts.push(seq(lit(rpref), `[0-${rx}]`));
    right--;
  }
  if (left <= right) parts.push(seq(intRange(left, right), "[0-9]"));
  return or(parts);
}

// rx_float_range: the decimals between low and high (numbers or null), each end included or not,
// with at most `room` digits after the point.
function floatRange(low, high, lowIn, highIn, room) {
  const fraction = point(some("[0-9]", room));
  if (low === null && high === null) {
    return seq(`"-"? ("0" | [1-9] [0-9]*)`, fraction, room === Infinity ? `([eE] [+-]? [0-9]+)?` : "");
  }
  if (high === null) {
    if (low < 0) return or([floatRange(low, 0, lowIn, false, room), floatRange(0, null, true, false, room)]);
    const n = String(Math.trunc(low)).length;
    return or([floatRange(low, 10 ** n, lowIn, false, room), seq(`[1-9] [0-9]{${n},}`, fraction)]);
  }
  if (low === null) {
    const negative = seq(`"-"`, floatRange(0, null, false, false, room));
    if (high === 0) return highIn ? or([negative, lit("0")]) : negative;
    if (high > 0) return or([negative, floatRange(0, high, true, highIn, room)]);
    return seq(`"-"`, floatRange(-high, null, highIn, false, room));
  }
  if (low === high) return lit(decimal(low));
  if (low < 0) {
    if (high < 0) return seq(`"-"`, floatRange(-high, -low, highIn, lowIn, room));
    return or([seq(`"-"`, floatRange(0, -low, false, lowIn, room)),
      high > 0 || highIn ? floatRange(0, high, true, highIn, room) : null]);
  }
  const [lint, lfrac = ""] = decimal(low).split(".");
  const [rint, rfrac = ""] = decimal(high).split(".");
  let left = BigInt(lint);
  const right = BigInt(rint);
  if (left === right) {
    const width = Math.max(lfrac.length, rfrac.length);
    const frac = lexiRange(lfrac.padEnd(width, "0"), rfrac.padEnd(width, "0"), lowIn, highIn, room);
    return /^0*$/.test(lfrac) ? seq(lit(lint), point(frac)) : seq(lit(lint), `"."`, frac);
  }
  const parts = [];
  if (lfrac || !lowIn) {
    parts.push(seq(lit(lint), `"."`, fromXTo9(lfrac, lowIn, room)));
    left++;
  }
  if (right > left) parts.push(seq(intRange(left, right - 1n), fraction));
  if (rfrac) parts.push(seq(lit(rint), point(from0ToX(rfrac, highIn, room))));
  else if (highIn) parts.push(seq(lit(rint), point(some("[0]", room))));
  return or(parts);
}

// lexi_x_to_9: digit strings from x up (past x unless `incl`), at most `room` long.
function fromXTo9(x, incl, room) {
  if (!x) return incl ? digits(room) : room >= 1 ? seq(digits(room - 1), "[1-9]") : null;
  if (room < 1) return null;
  const x0 = Number(x[0]);
  return or([seq(lit(x[0]), fromXTo9(x.slice(1), incl, room - 1)),
    x0 < 9 ? seq(`[${x0 + 1}-9]`, digits(room - 1)) : null]);
}

// lexi_0_to_x: digit strings up to x (below x unless `incl`), at most `room` long.
function from0ToX(x, incl, room) {
  if (!x) return "";
  if (room < 1) return null;
  const x0 = Number(x[0]);
  if (!incl && x.length === 1) return seq(`[0-${x0 - 1}]`, digits(room - 1));
  return or([seq(lit(x[0]), from0ToX(x.slice(1), incl, room - 1)),
    x0 > 0 ? seq(`[0-${x0 - 1}]`, digits(room - 1)) : null]);
}

// lexi_range: digit strings between ld and rd (of one length), at most `room` long.
function lexiRange(ld, rd, ldIn, rdIn, room) {
  if (ld === rd) return ld.length <= room ? lit(ld) : null;
  if (room < 1) return null;
  if (ld[0] === rd[0]) return seq(lit(ld[0]), lexiRange(ld.slice(1), rd.slice(1), ldIn, rdIn, room - 1));
  const [l0, r0] = [Number(ld[0]), Number(rd[0])];
  const [lrest, rrest] = [ld.slice(1).replace(/0+$/, ""), rd.slice(1).replace(/0+$/, "")];
  return or([seq(lit(ld[0]), fromXTo9(lrest, ldIn, room - 1)),
    l0 + 1 < r0 ? seq(`[${l0 + 1}-${r0 - 1}]`, digits(room - 1)) : null,
    rrest || rdIn ? seq(lit(rd[0]), from0ToX(rrest, rdIn, room - 1)) : null]);
}

// A number as Rust's `{}` writes an f64: its shortest digits, never an exponent.
function decimal(x) {
  const [mantissa, exp] = String(x).split("e");
  if (exp === undefined) return mantissa;
  const [int, frac = ""] = mantissa.split(".");
  const all = int + frac, at = int.length + Number(exp);
  if (at <= 0) return `0.${"0".repeat(-at)}${all}`;
  return at >= all.length ? all + "0".repeat(at - all.length) : `${all.slice(0, at)}.${all.slice(at)}`;
}

// --- instances ----------------------------------------------------------------------------------
// One started instance of XGrammar's wasm module: {xgrammar (the module's exports), Grammar and
// GrammarMatcher (embind classes), memory, stderr}. The bundle is UMD, not an ES module: evaluated,
// it sets globalThis.xgrammar, whose instance starts on its first call. A new URL fragment makes
// each import a new evaluation, so a new instance; starts run one at a time, since each reads the
// global and patches two others while its instance starts (WebAssembly.instantiate, to keep its
// memory; console.error, which the instance binds as its stderr, when `stderr` is given).
let starts = 0;
let starting = Promise.resolve();

function start(url, stderr = null) {
  const started = starting.then(async () => {
    const { instantiate } = WebAssembly;
    const { error } = console;
    let memory = null;
    WebAssembly.instantiate = async (...args) => {
      const result = await instantiate.apply(WebAssembly, args);
      memory = Object.values(result.instance.exports).find((e) => e instanceof WebAssembly.Memory);
      return result;
    };
    if (stderr) console.error = (...parts) => stderr.push(parts.join(" "));
    try {
      await import(`${url}#${++starts}`);
      const xgrammar = globalThis.xgrammar;
      // the embind classes, reached through objects of the async wrappers (which start the instance)
      const info = await xgrammar.TokenizerInfo.createTokenizerInfo([]);
      const compiler = await xgrammar.GrammarCompiler.createGrammarCompiler(info, false);
      const compiled = await compiler.compileBuiltinJSONGrammar();
      const matcher = await xgrammar.GrammarMatcher.createGrammarMatcher(compiled);
      const grammar = compiled.grammar();
      const instance = { xgrammar, Grammar: grammar.handle.constructor, GrammarMatcher: matcher.handle.constructor,
        memory, stderr };
      for (const object of [grammar, matcher, compiled, compiler, info]) object.dispose();
      if (!memory) throw new Error("XGrammar's wasm memory was not found");
      return instance;
    } finally {
      WebAssembly.instantiate = instantiate;
      console.error = error;
    }
  });
  starting = started.catch(() => {});
  return started;
}
