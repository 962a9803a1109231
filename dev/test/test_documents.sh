#!/usr/bin/env bash
# Tests the document-aligned order (dev/SPEC.md "Document-aligned order") on shards written here,
# two ways: llmc/dataloader.h's DocumentLoader (build/test_dataloader --dump-documents) against
# train_gpt2.py's, sequence for sequence over every rank, plain and shuffled, over two epochs; and
# train_gpt2.py's against a transcription of modded-nanogpt's find_batch_starts and
# distributed_data_generator(align_to_bos=True) (dev/test/documents_reference.py): the same
# sequences for as long as the reference yields, and the reference stopping where it is expected
# to (its files ending; its assert on documents longer than its window and on a 663,000-token
# document at its own T = 48K over 8 processes; its IndexError on a shard without a document
# start); and the bench's copy of it (dev/bench_quality.py: each micro step searching 16 x a step's
# tokens) reading train_gpt2.py's sequences past those stops, where a window of 16 x would have
# moved the switch to the next shard. Then the stage plan: each step's plan of llmc/stages.h
# (build/test_stages --dump) against train_gpt2.py's --stages; each step's learning rate and
# Muon's momentum over a plan (--dump-rates: llmc/schedulers.h's, the cooldown to an absolute
# floor and the momentum's cooldown among them) against train_gpt2.py's, bit for bit, and record
# #89's against the expressions of its reference (transcribed in documents_reference.py); and the
# sequences of loaders following a plan (build/test_dataloader --dump-stages: a document cap,
# reshaped between steps) against train_gpt2.py's. Last, record #89's packing (a cap): C++ against
# train_gpt2.py over layouts of 8 forwards a step, both against a transcription of the reference's
# Shard.next_batch on its 8 processes (documents longer than the cap, shorter, of exactly T+1,
# steps a shard cannot finish), its boundaries against the document starts of the inputs, and a
# stage boundary where the length and the cap change. Scratch files go to build/scratch/test_documents.
#
#   bash dev/test/test_documents.sh     (PYTHON=... to pick the python with torch)
set -uo pipefail
cd "$(dirname "$0")/../.."

source dev/test/lib.sh
# MAKEFLAGS cleared: under `make test` the caller's jobserver is not open to this make.
for program in build/test_dataloader build/test_stages; do
  MAKEFLAGS= ${MAKE:-make} -s "$program" || check "$program builds" "no" "yes"
done
require_python torch test_documents PYTHON
SCRATCH=build/scratch/test_documents
rm -rf "$SCRATCH"
mkdir -p "$SCRATCH"

out=$("$PY" dev/test/documents_reference.py "$SCRATCH" 2>&1)
check_verdicts documents_reference.py $? "$out"
grep -v $'\t' <<< "$out" | sed 's/^/note /'
finish test_documents
