// Compares the output of build/encode_text with implementations nobody here wrote, from the npm
// registry (both carry the GPT-2 ranks in the package, so no network is needed once installed):
//   token ids:  js-tiktoken (JavaScript) and tiktoken (tiktoken's Rust core compiled to
//               WebAssembly, the same code as Python's tiktoken);
//   pieces:     the GPT-2 pattern shipped in js-tiktoken, run by this JavaScript engine's regex.
// Pieces matter on their own: a wrong split often still gives the right ids, because no token
// spans a boundary that the pattern always makes, but it may not on other text.
//
//   node dev/test/tokenizer_reference.js NPM_DIR TEXT_FILE OUTPUT_FILE [--lines] [--pieces]
//
// OUTPUT_FILE is what encode_text printed with the same flags. Prints one result line per
// reference and exits 1 on a mismatch, showing the first one in context.
"use strict";
const fs = require("fs");
const path = require("path");

function usage(message) {
  console.error(`error: ${message}\n` +
                "usage: node dev/test/tokenizer_reference.js NPM_DIR TEXT_FILE OUTPUT_FILE " +
                "[--lines] [--pieces]");
  process.exit(2);
}

const args = process.argv.slice(2);
const byLine = args.includes("--lines");
const byPiece = args.includes("--pieces");
const [npmDir, textFile, outputFile] = args.filter((a) => !a.startsWith("--"));
if (!outputFile) usage("missing arguments");

function loadPackage(name, entry = "") {
  const dir = path.resolve(npmDir, "node_modules", name);
  if (!fs.existsSync(dir)) usage(`${dir} is missing: run dev/test/tokenizer_reference.sh`);
  const version = JSON.parse(fs.readFileSync(path.join(dir, "package.json"), "utf8")).version;
  const loaded = require(entry ? path.join(dir, entry) : dir);
  return { module: loaded.default || loaded, label: `${name} ${version}` };
}

const jsTiktoken = loadPackage("js-tiktoken");
const jsEncoding = jsTiktoken.module.getEncoding("gpt2");
const utf8Length = (s) => Buffer.byteLength(s, "utf8");

// Each kind of output: its references, and how to show an item and find its byte offset.
function idKind() {
  const wasmTiktoken = loadPackage("tiktoken");
  const wasmEncoding = wasmTiktoken.module.get_encoding("gpt2");
  return {
    noun: "tokens",
    references: [
      // No special tokens allowed or disallowed: "<|endoftext|>" in the text stays plain text,
      // as in tiktoken's encode_ordinary.
      { label: jsTiktoken.label, run: (text) => jsEncoding.encode(text, [], []) },
      { label: wasmTiktoken.label, run: (text) => Array.from(wasmEncoding.encode_ordinary(text)) },
    ],
    offset: (items, count) => utf8Length(jsEncoding.decode(items.slice(0, count))),
    show: (items) => items.map((id) => `${id}:${JSON.stringify(jsEncoding.decode([id]))}`)
      .join(" "),
  };
}

function pieceKind() {
  const gpt2 = loadPackage("js-tiktoken", "dist/ranks/gpt2.cjs");
  const pattern = new RegExp(gpt2.module.pat_str, "gu");
  return {
    noun: "pieces",
    references: [{
      label: `the GPT-2 pattern of ${gpt2.label} (JavaScript regex)`,
      run: (text) => (text.match(pattern) || []).map(utf8Length),
    }],
    offset: (items, count) => items.slice(0, count).reduce((a, b) => a + b, 0),
    show: (items) => items.map((length) => `${length} bytes`).join(", "),
  };
}

const kind = byPiece ? pieceKind() : idKind();
const text = fs.readFileSync(textFile, "utf8");
const texts = byLine ? text.split("\n") : [text];
if (byLine && text.endsWith("\n")) texts.pop();  // as encode_text: no line after the last newline
const outputLines = fs.readFileSync(outputFile, "utf8").split("\n");
if (outputLines[outputLines.length - 1] === "") outputLines.pop();
if (outputLines.length !== texts.length) {
  console.log(`FAIL ${outputFile} has ${outputLines.length} lines for ${texts.length} texts`);
  process.exit(1);
}
const ours = outputLines.map((line) => (line === "" ? [] : line.split(" ").map(Number)));

// The first difference between ours and theirs, with a few items either side.
function describeMismatch(where, source, mine, theirs) {
  let i = 0;
  while (i < mine.length && i < theirs.length && mine[i] === theirs[i]) i++;
  const byteOffset = kind.offset(theirs, i);
  const context = 5;
  const bytes = Buffer.from(source, "utf8");
  const around = bytes.subarray(Math.max(0, byteOffset - 40), byteOffset + 40).toString("utf8");
  return [
    `  ${where}: first difference at item ${i} (byte ${byteOffset}); ` +
      `${mine.length} ${kind.noun} here, ${theirs.length} in the reference`,
    `  text around it:   ${JSON.stringify(around)}`,
    `  common before:    ${kind.show(theirs.slice(Math.max(0, i - context), i))}`,
    `  encode_text:      ${kind.show(mine.slice(i, i + context))}`,
    `  reference:        ${kind.show(theirs.slice(i, i + context))}`,
  ].join("\n");
}

let failed = false;
const unit = byLine ? `${texts.length} lines, each on its own` : "whole file";
const what = `${path.basename(textFile)} (${unit})`;
for (const reference of kind.references) {
  let total = 0;
  let mismatch = null;
  for (let k = 0; k < texts.length && !mismatch; k++) {
    const theirs = reference.run(texts[k]);
    const mine = ours[k];
    total += theirs.length;
    if (mine.length !== theirs.length || mine.some((item, j) => item !== theirs[j])) {
      mismatch = describeMismatch(byLine ? `line ${k + 1}` : "text", texts[k], mine, theirs);
    }
  }
  if (mismatch) {
    failed = true;
    console.log(`FAIL ${reference.label} on ${what}: ${kind.noun} differ\n${mismatch}`);
  } else {
    console.log(`ok   ${reference.label} on ${what}: ${total} ${kind.noun} identical`);
  }
}
process.exit(failed ? 1 : 0);
