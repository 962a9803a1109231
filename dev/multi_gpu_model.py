"""The step of N data-parallel processes predicted from train_gpt2cu's step phases (-pt 1) on one GPU
and on two.

    python3 dev/multi_gpu_model.py --one LOG --two LOG --muon_params P [--gpus 8] [--copy_bandwidth 386]
                                   [--check_one LOG --check_muon_params P [--check_two LOG]]
                                   [--check_divided LOG] [--late_params P]
                                   [--sparse_params P --rows_from SHARD --step_tokens K]

LOG is the output of a train_gpt2cu run with -pt 1: --one of one process, --two of two (mpirun -np 2,
a phases line for each rank), the same recipe and tokens a step. P is the count of the parameters Muon
updates (the blocks' matrices: 12 x 12 x 768^2 = 84,934,656 for d12; the speedrun's, without layer 7's
attention, 82,576,152 with its heads' gates). The model, for N processes each
running its 1/N of the step's micro steps:

  compute    u / N            u: the one-process log's micro steps
  reduction  2 (N-1)/N S / W  an all-reduce of the S bytes of BF16 gradients; W, its bus bandwidth, is
                              S over the two-process log's shortest reduction (the rank that did not
                              wait for the other)
  loss, norm l                replicated
  Muon       D/N + R + (N-1)/N S_m / W
                              D: the orthogonalisation, divided among the processes; R: the momentum
                              and the update's application, replicated; then the broadcast of the
                              others' shares (S_m: the Muon parameters' BF16 bytes). D + R is the one-process
                              Muon, D/2 + R + S_m / 2W the two-process one (the mean of the ranks)
  AdamW      a                replicated

and schemes with every optimizer's work divided among the processes (Muon (D + R)/N, AdamW a/N):
"divided after the all-reduce", each process's new parameters broadcast to the others after the
whole gradient's all-reduce ((N-1)/N S / W more); "divided", a reduce-scatter
and an all-gather of the parameters (the all-reduce's bytes); "divided, gather hidden", the same
with the all-gather overlapped by the next step's forward pass; "divided, gather by the copy
engines", the reduce-scatter by NCCL and the parameters' (N-1)/N S bytes pulled by each process at
--copy_bandwidth (GB/s each way: 386 between two H200s, build/bench_kernels overlap), on the step's
path (train_gpt2cu -od 1 -oc 1). Scaling is the one-process step
(the log's average) over the prediction.

--check_one applies the fitted W and R (as a cost per Muon parameter) to another recipe's one-process
log, predicts its two-process step, and with --check_two prints the measured one beside it.
--check_divided sets the "divided" scheme's two-process time after the micro steps beside that of a
two-process -od 1 log of the same recipe (its rank that waited least in the reduction, the one
whose micro steps set the step): train_gpt2cu -od 1 runs that scheme.

Where --two is a run with -od 1 -oc 2 (the optimizers divided, Muon's matrices copied behind the next
forward pass), the model is that of the code as it runs, fitted on it:

  compute    f u / N          f: the two-process log's micro steps (the rank that waited least) over u/2
  reduction  (N-1)/N S / W    each process's runs reduced to their owners; W: S/2 over that rank's
  loss, norm l
  AdamW      a / N
  Muon       max(M/N + e, (N-1)/N S_a / C)
                              M: the one-process Muon; e: the two-process Muon beyond M/2 (the barrier,
                              the division's imbalance); beside it the copy engines bring AdamW's new
                              parameters (S_a: their BF16 bytes) at C (--copy_bandwidth)

and two ways on: the reduction by the copy engines, (N-1)/N S / C, and that reduction run during the
backward pass, each layer's as soon as it is made, leaving on the step's path the (N-1)/N S_l / C of
the gradients the backward pass makes last (--late_params: the embeddings' parameters).

With --sparse_params P_t --rows_from SHARD --step_tokens K, the embedding tables sent as rows
(train_gpt2cu -os 1): of the P_t parameters of tables that token lookups alone fill (rows of the
50,304-token vocabulary), each process sends the rows its K/N tokens read, the fraction r_N that K/N
tokens of SHARD mark (the mean over its first windows of K/N tokens):

  reduction  (N-1)/N (S - S_t + r_N S_t) / W
"""
import argparse
import array
import os
import re
import sys

PHASES = ("micro steps", "gradient reduction", "loss and norm", "AdamW", "Muon", "parameter gather", "rest")
BYTES_PER_PARAMETER = 2  # BF16 gradients and parameters


def fail(message):
    print(f"{os.path.basename(sys.argv[0])}: {message}", file=sys.stderr)
    sys.exit(1)


def read_log(path, processes):
    """{'parameters', 'average', 'ranks': [{phase: ms}]} of a train_gpt2cu -pt 1 log of `processes`."""
    try:
        text = open(path).read()
    except OSError as e:
        fail(f"{path}: {e.strerror}: give the output of a train_gpt2cu run")
    found = re.search(r"^\| parameters\s+\| (\d+)", text, re.M)
    average = re.search(r"^average ([\d.]+) ms per step", text, re.M)
    ranks = {}
    for m in re.finditer(r"^step phases \(rank (\d+) of (\d+), ms, mean of \d+ timed steps\): (.*)$", text, re.M):
        if int(m.group(2)) != processes:
            fail(f"{path}: a run of {m.group(2)} processes, expected {processes}")
        ranks[int(m.group(1))] = {name.strip(): float(ms) for name, ms in
                                  re.findall(r"([a-zA-Z ,]+?) ([\d.]+)(?: \||$)", m.group(3))}
    flags = {flag: re.search(rf"^\| {flag}\s[^|]*\|\s*(\d+)", text, re.M) for flag in ("-od", "-oc")}
    if not found or not average or len(ranks) != processes:
        fail(f"{path}: no parameter count, average step or phases line of each of {processes} ranks: give "
             "the whole output of a train_gpt2cu run with -pt 1 and timed steps")
    for r, phases in ranks.items():
        missing = [p for p in PHASES if p not in phases]
        if missing:
            fail(f"{path}: rank {r}'s phases line lacks {', '.join(missing)}")
    return {"parameters": int(found.group(1)), "average": float(average.group(1)),
            "ranks": [ranks[r] for r in sorted(ranks)],
            "divided": bool(flags["-od"] and int(flags["-od"].group(1))),
            "copies": int(flags["-oc"].group(1)) if flags["-oc"] else 0}


def fit(one, two, muon_params):
    """The model's constants from a one-process and a two-process log of one recipe."""
    if one["parameters"] != two["parameters"]:
        fail(f"the logs are of models of {one['parameters']} and {two['parameters']} parameters: give one recipe's")
    p = one["ranks"][0]
    grad_bytes = one["parameters"] * BYTES_PER_PARAMETER
    waited_least = min(two["ranks"], key=lambda r: r["gradient reduction"])
    reduction = waited_least["gradient reduction"]
    compute = waited_least["micro steps"] / (p["micro steps"] / 2)
    if two["divided"]:
        if two["copies"] != 2:
            fail(f"a -od 1 log with -oc {two['copies']} as --two: give a run with -od 1 -oc 2, or -od 0")
        muon_two = sum(r["Muon"] for r in two["ranks"]) / len(two["ranks"])
        # bytes/s: each process sends the other half of the gradients' bytes
        return {"as_run": True, "bandwidth": grad_bytes / 2 / (reduction / 1e3), "compute": compute,
                "muon_beyond": muon_two - p["Muon"] / 2}
    bandwidth = grad_bytes / (reduction / 1e3)  # bytes/s, all-reduce bus bandwidth (2 (N-1)/N = 1)
    muon_bytes = muon_params * BYTES_PER_PARAMETER
    broadcast = muon_bytes / 2 / bandwidth * 1e3
    muon_two = sum(r["Muon"] for r in two["ranks"]) / len(two["ranks"])
    divided = 2 * (p["Muon"] - muon_two + broadcast)
    return {"as_run": False, "bandwidth": bandwidth, "compute": compute, "divided": divided,
            "replicated": p["Muon"] - divided, "replicated_per_param": (p["Muon"] - divided) / muon_params}


# The copy engines' bandwidth each way between two H200s of one host (GB/s): all 551 MB of the
# speedrun's parameters exchanged in 0.714 ms (dev/notes/multi-gpu-scaling.md, build/bench_kernels overlap).
COPY_BANDWIDTH_GBS = 386.0


def predict(one, k, n, muon_params, scheme, copy_bandwidth=COPY_BANDWIDTH_GBS * 1e9):
    """The step (ms) of n processes under `scheme` ("today", "after_all_reduce", "divided", "hidden" or
    "copies", whose gather the copy engines make at copy_bandwidth bytes/s), and its parts."""
    p = one["ranks"][0]
    grad_bytes = one["parameters"] * BYTES_PER_PARAMETER
    all_reduce = 2 * (n - 1) / n * grad_bytes / k["bandwidth"] * 1e3
    broadcast = (n - 1) / n * muon_params * BYTES_PER_PARAMETER / k["bandwidth"] * 1e3
    replicated = k["replicated_per_param"] * muon_params
    divided = p["Muon"] - replicated
    parts = {"compute": k["compute"] * p["micro steps"] / n, "loss and norm": p["loss and norm"]}
    if scheme == "today":
        parts.update({"reduction": all_reduce, "Muon": divided / n + replicated + broadcast, "AdamW": p["AdamW"]})
    else:
        copies = (n - 1) / n * grad_bytes / copy_bandwidth * 1e3
        exposed = {"after_all_reduce": 1.5 * all_reduce, "divided": all_reduce, "hidden": all_reduce / 2,
                   "copies": all_reduce / 2 + copies}[scheme]
        parts.update({"reduction": exposed, "Muon": p["Muon"] / n, "AdamW": p["AdamW"] / n})
    return sum(parts.values()), parts


def predict_as_run(one, k, n, muon_params, scheme, copy_bandwidth=COPY_BANDWIDTH_GBS * 1e9, late_params=0):
    """The step (ms) of n processes of -od 1 -oc 2 with the gradients reduced by NCCL ("as_run"), by the
    copy engines after the backward pass ("copies") or during it, all but late_params' ("backward")."""
    p = one["ranks"][0]
    share = (n - 1) / n
    reduced_bytes = {"as_run": one["parameters"], "copies": one["parameters"], "backward": late_params}[scheme]
    bandwidth = k["bandwidth"] if scheme == "as_run" else copy_bandwidth
    adamw_copies = share * (one["parameters"] - muon_params) * BYTES_PER_PARAMETER / copy_bandwidth * 1e3
    parts = {"compute": k["compute"] * p["micro steps"] / n, "loss and norm": p["loss and norm"],
             "reduction": share * reduced_bytes * BYTES_PER_PARAMETER / bandwidth * 1e3, "AdamW": p["AdamW"] / n,
             "Muon": max(p["Muon"] / n + k["muon_beyond"], adamw_copies)}
    return sum(parts.values()), parts


VOCAB_ROWS = 50304  # the padded GPT-2 vocabulary: the rows of a token table
SHARD_HEADER_TOKENS = 512  # a token shard's 1,024-byte header, in uint16 tokens
ROW_WINDOWS = 40


def row_fraction(path, tokens):
    """The mean fraction of the vocabulary's rows that windows of `tokens` tokens of the shard mark."""
    shard = array.array("H")
    try:
        with open(path, "rb") as f:
            shard.frombytes(f.read())
    except (OSError, ValueError) as e:
        fail(f"{path}: {getattr(e, 'strerror', None) or e}: give a token shard (NAME_train_000000.bin)")
    shard = shard[SHARD_HEADER_TOKENS:]
    windows = min(ROW_WINDOWS, len(shard) // tokens)
    if windows == 0:
        fail(f"{path}: {len(shard)} tokens, fewer than one process's {tokens}: give a longer shard")
    return sum(len(set(shard[w * tokens:(w + 1) * tokens])) for w in range(windows)) / windows / VOCAB_ROWS


def predict_sparse(one, k, n, muon_params, sparse_params, fraction, copy_bandwidth):
    """predict_as_run's step with the tables' P_t parameters sent as the marked fraction of their rows."""
    step, parts = predict_as_run(one, k, n, muon_params, "as_run", copy_bandwidth)
    sent = one["parameters"] - sparse_params * (1 - fraction)
    reduction = (n - 1) / n * sent * BYTES_PER_PARAMETER / k["bandwidth"] * 1e3
    step += reduction - parts["reduction"]
    parts["reduction"] = reduction
    return step, parts


def check_divided(one, k, muon_params, divided, path):
    """The divided scheme's two-process time after the micro steps against a -od 1 log's."""
    _, parts = predict(one, k, 2, muon_params, "divided")
    predicted = sum(ms for name, ms in parts.items() if name != "compute")
    rank = min(divided["ranks"], key=lambda r: r["gradient reduction"])
    measured = sum(ms for name, ms in rank.items() if name not in ("micro steps", "host between steps"))
    return (f"check, {path} (-od 1) on 2 processes: after the micro steps predicted {predicted:.2f} ms, "
            f"measured {measured:.2f} ms ({(predicted / measured - 1) * 100:+.1f}%)")


def check_line(a, step, parts):
    """The line of --check_one's predicted two-process step, with --check_two's measurement."""
    detail = ", ".join(f"{name} {ms:.3f}" for name, ms in parts.items())
    line = f"check, {a.check_one} on 2 processes: predicted {step:.2f} ms ({detail})"
    if a.check_two:
        measured = read_log(a.check_two, 2)["average"]
        line += f"; measured {measured:.2f} ms ({(step / measured - 1) * 100:+.1f}%)"
    return line


def print_as_run(a, one, two, k):
    """The predictions of a fit on a -od 1 -oc 2 log, and the check of another recipe's."""
    print(f"fitted on -od 1 -oc 2: reduction to the owners {k['bandwidth'] / 1e9:.1f} GB/s; compute beside "
          f"another process x{k['compute']:.4f}; Muon {k['muon_beyond']:.3f} ms beyond its half")
    print(f"measured: 1 process {one['average']:.2f} ms, 2 processes {two['average']:.2f} ms "
          f"(x{one['average'] / two['average']:.3f})")
    schemes = [("as_run", "as run (-od 1 -oc 2)"), ("copies", "the reduction by the copy engines")]
    if a.late_params:
        schemes.append(("backward", "the reduction by the copy engines during the backward pass"))
    for scheme, label in schemes:
        for n in sorted({2, a.gpus}):
            step, parts = predict_as_run(one, k, n, a.muon_params, scheme, a.copy_bandwidth * 1e9, a.late_params)
            detail = ", ".join(f"{name} {ms:.3f}" for name, ms in parts.items())
            print(f"{label}, {n} processes: {step:.2f} ms (x{one['average'] / step:.3f}): {detail}")
    for n in sorted({2, a.gpus}) if a.sparse_params else ():
        fraction = row_fraction(a.rows_from, a.step_tokens // n)
        step, parts = predict_sparse(one, k, n, a.muon_params, a.sparse_params, fraction, a.copy_bandwidth * 1e9)
        detail = ", ".join(f"{name} {ms:.3f}" for name, ms in parts.items())
        print(f"the tables as rows (-os 1; {fraction:.3f} of the rows), {n} processes: {step:.2f} ms "
              f"(x{one['average'] / step:.3f}): {detail}")
    if a.check_one:
        print(check_line(a, *predict_as_run(read_log(a.check_one, 1), k, 2, a.check_muon_params, "as_run",
                                            a.copy_bandwidth * 1e9)))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--one", required=True, help="train_gpt2cu -pt 1 output, one process")
    ap.add_argument("--two", required=True, help="the same recipe's, two processes")
    ap.add_argument("--muon_params", type=int, required=True, help="parameters Muon updates")
    ap.add_argument("--gpus", type=int, default=8, help="the process count to predict")
    ap.add_argument("--copy_bandwidth", type=float, default=COPY_BANDWIDTH_GBS,
                    help="the copy engines' bandwidth each way, GB/s (the copies scheme's gather)")
    ap.add_argument("--check_one", help="another recipe's one-process output, whose two-process step is predicted")
    ap.add_argument("--check_two", help="its two-process output, the measurement set beside the prediction")
    ap.add_argument("--check_muon_params", type=int, help="its Muon parameters")
    ap.add_argument("--check_divided", help="a two-process output of the --one recipe with -od 1")
    ap.add_argument("--late_params", type=int, default=0,
                    help="with a -od 1 -oc 2 --two: the parameters whose gradients the backward pass makes last")
    ap.add_argument("--sparse_params", type=int, default=0,
                    help="with a -od 1 -oc 2 --two: the parameters of the tables -os 1 sends as rows")
    ap.add_argument("--rows_from", help="a token shard whose windows give the fraction of rows a process marks")
    ap.add_argument("--step_tokens", type=int, default=0, help="the step's tokens (of all processes)")
    a = ap.parse_args(argv)
    if a.gpus < 2:
        fail(f"--gpus {a.gpus}: give 2 or more")
    if not a.copy_bandwidth > 0:
        fail(f"--copy_bandwidth {a.copy_bandwidth}: give the copy engines' GB/s, above 0")
    if a.muon_params <= 0 or (a.check_muon_params is not None and a.check_muon_params <= 0):
        fail("--muon_params and --check_muon_params: give the count of the parameters Muon updates, above 0")
    if a.check_one and a.check_muon_params is None:
        fail("--check_one needs --check_muon_params")
    if a.check_two and not a.check_one:
        fail("--check_two needs --check_one")
    if a.late_params < 0:
        fail(f"--late_params {a.late_params}: give a count of parameters, 0 or more")
    if a.sparse_params and (not a.rows_from or a.step_tokens < a.gpus):
        fail("--sparse_params needs --rows_from SHARD and --step_tokens, the step's tokens (at least --gpus)")
    one, two = read_log(a.one, 1), read_log(a.two, 2)
    k = fit(one, two, a.muon_params)
    if k["as_run"]:
        if a.check_divided:
            fail("--check_divided checks a fit on a -od 0 --two: give that, or leave --check_divided out")
        print_as_run(a, one, two, k)
        return
    print(f"fitted: all-reduce bus bandwidth {k['bandwidth'] / 1e9:.1f} GB/s; Muon {k['divided']:.3f} ms divided, "
          f"{k['replicated']:.3f} ms replicated on one process; compute beside another process x{k['compute']:.4f}")
    print(f"measured: 1 process {one['average']:.2f} ms, 2 processes {two['average']:.2f} ms "
          f"(x{one['average'] / two['average']:.3f})")
    for scheme, label in (("today", "today (all-reduce, optimizers replicated)"),
                          ("after_all_reduce", "divided optimizers after the all-reduce"),
                          ("divided", "divided optimizers (reduce-scatter, all-gather)"),
                          ("hidden", "divided, the all-gather hidden"),
                          ("copies", "divided, the all-gather by the copy engines")):
        for n in sorted({2, a.gpus}):
            step, parts = predict(one, k, n, a.muon_params, scheme, a.copy_bandwidth * 1e9)
            detail = ", ".join(f"{name} {ms:.3f}" for name, ms in parts.items())
            print(f"{label}, {n} processes: {step:.2f} ms (x{one['average'] / step:.3f}): {detail}")
    if a.check_one:
        print(check_line(a, *predict(read_log(a.check_one, 1), k, 2, a.check_muon_params, "today")))
    if a.check_divided:
        print(check_divided(one, k, a.muon_params, read_log(a.check_divided, 2), a.check_divided))


if __name__ == "__main__":
    main()
