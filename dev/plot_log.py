#!/usr/bin/env python3
"""Plots training runs from their logs and prints their val losses side by side.

    python3 dev/plot_log.py DIR_OR_LOG [DIR_OR_LOG ...] -o plot.png [--labels a,b]

A directory stands for DIR/main.log. Two log formats are read, line by line:
  ours (llmc/logger.h):  step=12 kind=train loss=3.45 norm=1.2 lr=6e-04 ms=123.4 tok_per_s=532100
                         step=12 kind=val loss=3.51
                         step=12 kind=eval hellaswag=0.295
  llm.c's (its trainers, and train_gpt2.py's logs before it took ours):
                         s:12 trl:3.45 lr:0.0006 norm:1.2   (train; lr and norm optional)
                         s:12 tel:3.51                      (val loss)
                         s:12 eval:0.295                    (HellaSwag)
Both number steps alike: a train line's step counts the optimizer steps done (1 after the
first), a val line's the steps done before it (0 is the initial model). Keys and kinds not
listed are skipped, so newer logs still plot; a line that breaks the format is an error naming
the file and line. A last line without its newline is left out, as llmc/logger.h does: the run
was writing it when it stopped.

The figure overlays every run, one colour each, on panels against step: loss (train as a line, val
dashed with markers), learning rate, grad norm, tokens/s and HellaSwag; a panel that no run has data
for is left out, and the line saying where the figure went names the panels drawn. The table on stdout gives the val loss of each run at the
steps where every run has one, and each run's relative difference to the first run,
(run - first) / first, as a markdown table.
"""
import argparse
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from pydeps import require  # noqa: E402

# The panels in order: (title, the series drawn in it, each with its name in the legend where the
# panel has several).
PANELS = [
    ("loss", [("train_loss", "train"), ("val_loss", "val")]),
    ("learning rate", [("lr", "")]),
    ("grad norm", [("norm", "")]),
    ("tokens/s", [("tok_per_s", "")]),
    ("HellaSwag acc_norm", [("hellaswag", "")]),
]
SERIES = [key for _, series in PANELS for key, _ in series]
# Our format: kind -> {log key: series}.
OURS = {
    "train": {"loss": "train_loss", "norm": "norm", "lr": "lr", "tok_per_s": "tok_per_s"},
    "val": {"loss": "val_loss"},
    "eval": {"hellaswag": "hellaswag"},
}
REQUIRED = {"train": "loss", "val": "loss"}
# llm.c's format: key -> series.
LLMC = {"trl": "train_loss", "tel": "val_loss", "lr": "lr", "norm": "norm", "eval": "hellaswag"}
FORMATS = "lines read 'step=N kind=K key=value ...' (llmc/logger.h) or 's:N trl:X' (llm.c)"


class LogError(Exception):
    pass


class Run:
    def __init__(self, label, path):
        self.label = label
        self.path = path
        self.series = {key: {} for key in SERIES}  # key -> {step: value}


def parse_number(text, where, key):
    try:
        return float(text)  # also "nan" and "inf", which the logger writes for a diverged run
    except ValueError:
        raise LogError(f"{where}: {key}={text!r} is not a number; {FORMATS}") from None


def parse_step(text, where):
    try:
        return int(text)
    except ValueError:
        raise LogError(f"{where}: step {text!r} is not an integer; {FORMATS}") from None


def parse_ours(line, where, series):
    pairs = []
    for token in line.split():
        key, eq, value = token.partition("=")
        if not eq or not key or not value or "=" in value:
            raise LogError(f"{where}: {token!r} is not key=value; {FORMATS}")
        pairs.append((key, value))
    if len(pairs) < 2 or pairs[0][0] != "step" or pairs[1][0] != "kind":
        raise LogError(f"{where}: a line must start with step=N kind=K; {FORMATS}")
    step = parse_step(pairs[0][1], where)
    kind = pairs[1][1]
    fields = dict(pairs[2:])
    if kind in REQUIRED and REQUIRED[kind] not in fields:
        raise LogError(f"{where}: a kind={kind} line needs {REQUIRED[kind]}=...; {FORMATS}")
    for key, target in OURS.get(kind, {}).items():
        if key in fields:
            series[target][step] = parse_number(fields[key], where, key)


def parse_llmc(line, where, series):
    pairs = []
    for token in line.split():
        key, colon, value = token.partition(":")
        if not colon or not key or not value:
            raise LogError(f"{where}: {token!r} is not key:value; {FORMATS}")
        pairs.append((key, value))
    step = parse_step(pairs[0][1], where)
    for key, value in pairs[1:]:
        if key in LLMC:
            series[LLMC[key]][step] = parse_number(value, where, key)


def read_run(path, label):
    """Reads one log; a later line for the same step and series replaces an earlier one."""
    log_path = os.path.join(path, "main.log") if os.path.isdir(path) else path
    try:
        with open(log_path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        hint = "the directory has no main.log" if os.path.isdir(path) else "no such file"
        raise LogError(f"{log_path}: {hint}: give a run directory (-o of a trainer) or its "
                       "main.log") from None
    except (OSError, UnicodeDecodeError) as e:
        raise LogError(f"{log_path}: cannot read the log: {e}") from None
    run = Run(label, log_path)
    lines = text.split("\n")[:-1]  # the last piece has no newline: cut off by the run stopping
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{log_path}:{number}"
        if line.startswith("step="):
            parse_ours(line, where, run.series)
        elif line.startswith("s:"):
            parse_llmc(line, where, run.series)
        else:
            raise LogError(f"{where}: {line[:60]!r} is not a log line; {FORMATS}")
    if not any(run.series.values()):
        raise LogError(f"{log_path}: no log lines: is this a run's main.log?")
    return run


def default_labels(paths):
    """The run directory's name for each log; the paths as given where names repeat."""
    names = []
    for path in paths:
        path = os.path.normpath(path)
        if not os.path.isdir(path) and os.path.basename(path) == "main.log":
            path = os.path.dirname(path) or "."
        names.append(os.path.basename(os.path.abspath(path)))
    return names if len(set(names)) == len(names) else list(paths)


def val_loss_table(runs):
    """The markdown table of val losses at the steps every run has one, as a list of lines."""
    common = set(runs[0].series["val_loss"])
    for run in runs[1:]:
        common &= set(run.series["val_loss"])
    if not common:
        return ["no step has a val loss in every run: nothing to compare"]
    first = runs[0]
    header = ["step"] + [run.label for run in runs] + [f"{run.label} vs {first.label}"
                                                        for run in runs[1:]]
    title = f"val loss at the {len(common)} steps common to all runs"
    if len(runs) > 1:
        title += f"; relative difference = (run - {first.label}) / {first.label}"
    lines = [title,
             "| " + " | ".join(header) + " |",
             "|" + "|".join(["---:"] * len(header)) + "|"]
    worst = [0.0] * (len(runs) - 1)
    for step in sorted(common):
        base = first.series["val_loss"][step]
        losses = [run.series["val_loss"][step] for run in runs]
        cells = [str(step)] + [f"{loss:.6f}" for loss in losses]
        for i, loss in enumerate(losses[1:]):
            if base == 0 or not math.isfinite(base) or not math.isfinite(loss):
                cells.append("n/a")
                worst[i] = math.nan
            else:
                relative = (loss - base) / base
                cells.append(f"{relative:+.3e}")
                worst[i] = max(worst[i], abs(relative))
        lines.append("| " + " | ".join(cells) + " |")
    for run, value in zip(runs[1:], worst):
        lines.append(f"max |relative difference| {run.label} vs {first.label}: {value:.3e}")
    return lines


def drawn_panels(runs):
    """The panels of PANELS that some run has data for."""
    return [(title, series) for title, series in PANELS
            if any(run.series[key] for run in runs for key, _ in series)]


def draw_panel(ax, title, series, runs):
    """One panel: each run in its own colour, its val loss dashed beside its train loss."""
    for color, run in enumerate(runs):
        for key, name in series:
            points = sorted(run.series[key].items())
            if not points:
                continue
            steps, values = zip(*points)
            # Sparse series (val, HellaSwag) get markers so single points still show.
            marker = "o" if len(points) < 50 else None
            ax.plot(steps, values, label=f"{run.label} {name}".rstrip(), color=f"C{color}",
                    linestyle="--" if key == "val_loss" else "-", marker=marker, markersize=3, linewidth=1)
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def figure(runs):
    """The figure of the runs: a panel each of drawn_panels, three to a row."""
    from matplotlib.figure import Figure  # not pyplot: no display, and nothing to close

    panels = drawn_panels(runs)
    columns = min(len(panels), 3)
    rows = -(-len(panels) // columns)
    fig = Figure(figsize=(5.3 * columns, 4.5 * rows))
    axes = fig.subplots(rows, columns, squeeze=False).flat
    for ax in axes[len(panels):]:
        fig.delaxes(ax)
    for ax, (title, series) in zip(axes, panels):
        draw_panel(ax, title, series, runs)
    fig.tight_layout()
    return fig


def plot(runs, output):
    """Writes the figure to output; returns its panels' titles."""
    fig = figure(runs)
    try:
        fig.savefig(output, dpi=100)
    except (OSError, ValueError) as e:
        raise LogError(f"-o {output}: cannot write the figure: {e}") from None
    return [ax.get_title() for ax in fig.axes]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("logs", nargs="+", metavar="DIR_OR_LOG",
                        help="a run directory (its main.log) or a log file")
    parser.add_argument("-o", "--output", required=True, help="the figure to write (e.g. plot.png)")
    parser.add_argument("--labels", help="comma-separated legend labels, one per log")
    args = parser.parse_args(argv)
    require("matplotlib")  # checked first: the figure is the point of the run
    try:
        if args.labels is None:
            labels = default_labels(args.logs)
        else:
            labels = args.labels.split(",")
            if len(labels) != len(args.logs) or not all(labels):
                raise LogError(f"--labels {args.labels!r} gives {len(labels)} labels for "
                               f"{len(args.logs)} logs: give one non-empty label per log, "
                               "comma-separated")
        runs = [read_run(path, label) for path, label in zip(args.logs, labels)]
        print("\n".join(val_loss_table(runs)))
        titles = plot(runs, args.output)
    except LogError as e:
        sys.stdout.flush()
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {args.output}: {', '.join(titles)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
