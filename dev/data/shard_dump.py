"""Shards a local text dump (jsonl or parquet files) the way FineWeb is distributed for llm.c:
every document preceded by the EOT token, shards of --shard_size tokens (default 100M), shard 0
the val split and the rest train, documents split across shard boundaries:

    DIR/fineweb_val_000000.bin, DIR/fineweb_train_000001.bin, DIR/fineweb_train_000002.bin, ...

plus DIR/gpt2_tokenizer.bin for decoding samples. The trainer reads them with
-i 'DIR/fineweb_train_*.bin' -j 'DIR/fineweb_val_*.bin' (scripts/run_gpt2_*.sh --data DIR).

Tokenization is the project's own GPT-2 encoder, build/shard_documents (built with make when
missing), on every core; this script only reads the documents and streams them to it in order.
A .jsonl file holds one JSON object per line with the text in --field (default "text"); a .parquet
file needs pyarrow and holds the text in column --field. Input files are read in the order given.

    python3 dev/data/shard_dump.py --input DUMP.jsonl [--input ...] --output_dir DIR
"""
import argparse
import json
import os
import struct
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
END_MARK = 0xFFFFFFFF


class InputError(Exception):
    """A problem with the input files, reported as one line naming the file (and line)."""


def jsonl_documents(path, field):
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise InputError(f"{path}:{number}: not a JSON object ({e}); each line must be one JSON object")
            if not isinstance(record, dict) or not isinstance(record.get(field), str):
                raise InputError(f"{path}:{number}: no string field '{field}'; name the text field with --field")
            yield record[field], f"{path}:{number}"


def parquet_module(path):
    try:
        import pyarrow.parquet
    except ImportError:
        raise InputError(f"{path}: reading parquet needs pyarrow: pip install pyarrow (or convert the file to jsonl)")
    return pyarrow.parquet


def parquet_documents(path, field):
    pq = parquet_module(path)
    try:
        parquet = pq.ParquetFile(path)
    except Exception as e:
        raise InputError(f"{path}: not a readable parquet file ({e})")
    if field not in parquet.schema_arrow.names:
        raise InputError(f"{path}: no column '{field}' (columns: {', '.join(parquet.schema_arrow.names)}); name it with --field")
    row = 0
    for batch in parquet.iter_batches(columns=[field]):
        for text in batch.column(0).to_pylist():
            row += 1
            if not isinstance(text, str):
                raise InputError(f"{path}: row {row} of column '{field}' is not text")
            yield text, f"{path} row {row}"


def documents(paths, field):
    for path in paths:
        if path.endswith(".jsonl"):
            yield from jsonl_documents(path, field)
        else:
            yield from parquet_documents(path, field)


def check_inputs(paths):
    for path in paths:
        if not (path.endswith(".jsonl") or path.endswith(".parquet")):
            raise InputError(f"--input {path}: not a .jsonl or .parquet file")
        if not os.path.isfile(path) or not os.access(path, os.R_OK):
            raise InputError(f"--input {path}: no such readable file")
        if path.endswith(".parquet"):
            parquet_module(path)


def build_tools():
    tools = [os.path.join(REPO, "build", name) for name in ("shard_documents", "write_tokenizer")]
    if not all(os.access(tool, os.X_OK) for tool in tools):
        # MAKEFLAGS cleared: a calling make's jobserver is not open to this one.
        subprocess.run(["make", "-s", "-C", REPO, "build/shard_documents", "build/write_tokenizer"],
                       check=True, env={**os.environ, "MAKEFLAGS": ""})
    return tools


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", action="append", required=True, help="a .jsonl or .parquet file; repeat for several")
    parser.add_argument("--output_dir", required=True, help="where the shards go")
    parser.add_argument("--name", default="fineweb", help="shard file prefix (default fineweb)")
    parser.add_argument("--field", default="text", help="the JSON field or parquet column of the text (default text)")
    parser.add_argument("--shard_size", type=int, default=100_000_000, help="tokens per shard (default 100000000)")
    parser.add_argument("--threads", type=int, default=0, help="tokenizing threads (default: one per core)")
    parser.add_argument("--encoder_dir", default=os.path.join(REPO, "dev", "data", "gpt2"),
                        help="directory of encoder.json and vocab.bpe")
    parser.error = lambda message: sys.exit(f"error: {message} (--help lists the flags)")
    args = parser.parse_args()
    if args.shard_size < 1:
        parser.error(f"--shard_size {args.shard_size} must be at least 1")
    if args.threads < 0:
        parser.error(f"--threads {args.threads} must not be negative (0: one per core)")
    try:
        check_inputs(args.input)
    except InputError as e:
        sys.exit(f"error: {e}")
    shard_documents, write_tokenizer = build_tools()

    command = [shard_documents, "--output_dir", args.output_dir, "--name", args.name,
               "--shard_size", str(args.shard_size), "--encoder_dir", args.encoder_dir]
    if args.threads:
        command += ["--threads", str(args.threads)]
    # The tool's error is read after it exits, so that an input error here is the only line shown.
    tool = subprocess.Popen(command, stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    input_error = None
    try:
        for text, where in documents(args.input, args.field):
            try:
                data = text.encode("utf-8")
            except UnicodeEncodeError as e:
                raise InputError(f"{where}: the text is not valid Unicode ({e.reason})")
            tool.stdin.write(struct.pack("<I", len(data)) + data)
        tool.stdin.write(struct.pack("<I", END_MARK))
    except InputError as e:
        input_error = str(e)
    except BrokenPipeError:
        pass  # the tool stopped early; its own error says why
    try:
        tool.stdin.close()
    except BrokenPipeError:
        pass
    tool_errors = tool.stderr.read().decode("utf-8", "replace").strip()
    status = tool.wait()
    if input_error:
        sys.exit(f"error: {input_error} (no shards were kept)")
    if status != 0:
        sys.exit(tool_errors or f"error: {shard_documents} failed with exit status {status}")
    subprocess.run([write_tokenizer, "--output", os.path.join(args.output_dir, "gpt2_tokenizer.bin"),
                    "--encoder_dir", args.encoder_dir], check=True, stdout=subprocess.DEVNULL)


if __name__ == "__main__":
    main()
