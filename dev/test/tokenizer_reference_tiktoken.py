#!/usr/bin/env python3
"""Compares our GPT-2 encoder (build/encode_text) with Python's tiktoken, offline.

tiktoken's "gpt2" encoding is rebuilt from the repository's dev/data/gpt2/encoder.json and
vocab.bpe (ranks from the merges, checked against encoder.json, as tiktoken's own loader does) and
GPT-2's pattern, so no download is needed. The inputs are dev/test/tokenizer_corpus.txt, the tiny
shakespeare text named by TINYSHAKESPEARE (when set) and any FILE given, each encoded whole and
line by line, plus a few strings with U+0085 and U+FEFF, which the corpus avoids because
JavaScript's \\s disagrees with Rust's there (tiktoken follows Rust).

    make build/encode_text && python3 dev/test/tokenizer_reference_tiktoken.py [FILE ...]

(from the repository root, or from anywhere with the script's path).

Exits 1 on any mismatch, printing the first one in context.
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from pydeps import require  # noqa: E402

require("tiktoken")
import tiktoken  # noqa: E402

PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENCODER_DIR = os.path.join(ROOT, "dev", "data", "gpt2")
ENCODE_TEXT = os.path.join(ROOT, "build", "encode_text")
CORPUS = os.path.join(ROOT, "dev", "test", "tokenizer_corpus.txt")
END_OF_TEXT = "<|endoftext|>"
WHITE_SPACE_EDGE_CASES = "x \u0085y a\u0085\u0085b \u0085\nx \ufeffy a\ufeff\ufeffb \ufeff\n"


def byte_alphabet():
    """GPT-2 spells each byte as a printable character: the printable bytes as themselves, the
    rest as U+0100 onwards in byte order. Returns the character -> byte map and the byte order of
    the first 256 ranks (printable bytes first)."""
    printable = [b for b in range(256) if 33 <= b <= 126 or 161 <= b <= 172 or b >= 174]
    others = [b for b in range(256) if b not in printable]
    char_to_byte = {chr(b): b for b in printable}
    char_to_byte.update({chr(256 + i): b for i, b in enumerate(others)})
    return char_to_byte, printable + others


def load_encoding(encoder_dir):
    char_to_byte, byte_order = byte_alphabet()

    def spell(symbol):
        return bytes(char_to_byte[c] for c in symbol)

    ranks = {bytes([b]): rank for rank, b in enumerate(byte_order)}
    with open(os.path.join(encoder_dir, "vocab.bpe"), encoding="utf-8") as f:
        merges = [line for line in f.read().split("\n")[1:] if line]
    for first, second in (merge.split(" ") for merge in merges):
        ranks[spell(first) + spell(second)] = len(ranks)
    assert len(ranks) == 256 + len(merges), "vocab.bpe makes a token twice"
    with open(os.path.join(encoder_dir, "encoder.json"), encoding="utf-8") as f:
        encoder = json.load(f)
    from_json = {spell(symbol): rank for symbol, rank in encoder.items() if symbol != END_OF_TEXT}
    if from_json != ranks:
        sys.exit(f"error: {encoder_dir}: encoder.json and vocab.bpe disagree: "
                 "use the two files of one release")
    return tiktoken.Encoding(name="gpt2_from_files", pat_str=PATTERN, mergeable_ranks=ranks,
                             special_tokens={END_OF_TEXT: encoder[END_OF_TEXT]})


def read_text(path):
    with open(path, encoding="utf-8", newline="") as f:  # keep "\r" as it is
        return f.read()


def split_lines(text):
    """Lines as encode_text --lines takes them: no line after a final newline."""
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    return lines


def encode_text(path, by_line):
    command = [ENCODE_TEXT, "--encoder_dir", ENCODER_DIR]
    command += (["--lines"] if by_line else []) + [path]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"error: {' '.join(command)} failed: {result.stderr.strip()}")
    return [[int(x) for x in line.split()] for line in result.stdout.split("\n")[:-1]]


def first_mismatch(encoding, source, mine, theirs):
    i = 0
    while i < min(len(mine), len(theirs)) and mine[i] == theirs[i]:
        i += 1
    offset = len(encoding.decode_bytes(theirs[:i]))
    around = source.encode("utf-8")[max(0, offset - 40):offset + 40].decode("utf-8", "replace")

    def show(ids):
        return " ".join(f"{t}:{encoding.decode_bytes([t])!r}" for t in ids)

    return (f"  first difference at token {i} (byte {offset}); {len(mine)} tokens here, "
            f"{len(theirs)} in tiktoken\n  text around it:  {around!r}\n"
            f"  encode_text:     {show(mine[i:i + 5])}\n  tiktoken:        {show(theirs[i:i + 5])}")


def compare(encoding, path, by_line):
    text = read_text(path)
    texts = split_lines(text) if by_line else [text]
    ours = encode_text(path, by_line)
    what = f"{os.path.basename(path)} ({f'{len(texts)} lines' if by_line else 'whole file'})"
    if len(ours) != len(texts):
        print(f"FAIL {what}: encode_text printed {len(ours)} lines for {len(texts)} texts")
        return False
    total = 0
    for number, (part, mine) in enumerate(zip(texts, ours), start=1):
        theirs = encoding.encode_ordinary(part)
        total += len(theirs)
        if mine != theirs:
            where = f"line {number}" if by_line else "text"
            print(f"FAIL tiktoken {tiktoken.__version__} on {what}, {where}:\n"
                  f"{first_mismatch(encoding, part, mine, theirs)}")
            return False
    print(f"ok   tiktoken {tiktoken.__version__} on {what}: {total} tokens identical")
    return True


def main():
    if not os.path.exists(ENCODE_TEXT):
        sys.exit(f"error: {ENCODE_TEXT} is missing: build it with 'make build/encode_text' "
                 "in the repository root")
    encoding = load_encoding(ENCODER_DIR)
    inputs = [CORPUS] + sys.argv[1:]
    if os.environ.get("TINYSHAKESPEARE"):
        inputs.append(os.environ["TINYSHAKESPEARE"])
    else:
        print("skipped tiny shakespeare: TINYSHAKESPEARE is not set (the path of its input.txt)")
    with tempfile.TemporaryDirectory() as scratch:
        edge_cases = os.path.join(scratch, "white_space_edge_cases.txt")
        with open(edge_cases, "w", encoding="utf-8", newline="") as f:
            f.write(WHITE_SPACE_EDGE_CASES)
        results = [compare(encoding, path, by_line)
                   for path in inputs + [edge_cases] for by_line in (False, True)]
    passed = sum(results)
    print(f"tokenizer_reference_tiktoken: {passed} passed, {len(results) - passed} failed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
