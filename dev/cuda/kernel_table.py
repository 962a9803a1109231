"""Groups an ncu CSV (--csv --page raw --metrics gpu__time_duration.sum) by kernel name and prints
calls, total and mean time and share of the total, slowest first. Given two CSVs (two modes of
one step, e.g. BF16 and FP8), prints each kernel's total in both and the difference, the largest
differences first, so that the table says where one mode's time goes against the other's.
usage: python3 dev/cuda/kernel_table.py kernels.csv
       python3 dev/cuda/kernel_table.py a.csv b.csv [--labels A,B]
"""
import csv
import re
import sys
from collections import defaultdict



def short_name(name):
    """Drops template arguments and the parameter list: the family name is what the table is for."""
    name = re.sub(r"^(void|\s)+", "", name)
    # Library kernels wrapped as Kernel<real_kernel>: the wrapped name is the informative one.
    wrapped = re.match(r"^(?:cutlass::)?Kernel2?<([^<>(]+)", name)
    if wrapped:
        return wrapped.group(1)
    depth, out = 0, []
    for ch in name:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out).strip() or name


def read_kernels(path):
    """{kernel family: total ms} and {kernel family: calls} of one ncu CSV."""
    with open(path) as f:
        lines = [line for line in f if not line.startswith("==")]
    rows = list(csv.reader(lines))
    if not rows:
        sys.exit(f"{path}: no kernels recorded: did the NVTX range 'step' run?")
    header = rows[0]
    try:
        name_col, time_col = header.index("Kernel Name"), header.index("gpu__time_duration.sum")
    except ValueError:
        sys.exit(f"{path}: no 'Kernel Name' / 'gpu__time_duration.sum' columns: run ncu with --csv --page raw")
    totals, calls = defaultdict(float), defaultdict(int)
    unit_scale = {"nsecond": 1e-6, "usecond": 1e-3, "msecond": 1.0}
    scale = 1e-6
    for row in rows[1:]:
        if len(row) <= max(name_col, time_col):
            continue
        value = row[time_col].replace(",", "")
        if value in unit_scale:  # the units row under the header
            scale = unit_scale[value]
            continue
        try:
            ms = float(value) * scale
        except ValueError:
            continue
        key = short_name(row[name_col])
        totals[key] += ms
        calls[key] += 1
    return totals, calls


def print_table(totals, calls):
    total = sum(totals.values())
    print(f"{'kernel':60s} {'calls':>6} {'total ms':>10} {'mean us':>9} {'share':>7}")
    for key in sorted(totals, key=totals.get, reverse=True):
        print(f"{key[:60]:60s} {calls[key]:6d} {totals[key]:10.3f} {1000 * totals[key] / calls[key]:9.1f} "
              f"{100 * totals[key] / total:6.1f}%")
    print(f"{'all kernels':60s} {sum(calls.values()):6d} {total:10.3f}")


def print_comparison(a, b, labels):
    """Each kernel's calls and ms in a and in b, and b - a; the largest |b - a| first."""
    (ta, ca), (tb, cb) = a, b
    keys = sorted(set(ta) | set(tb), key=lambda k: (-abs(tb.get(k, 0.0) - ta.get(k, 0.0)), k))
    la, lb = labels
    print(f"{'kernel':60s} {la + ' calls':>10} {la + ' ms':>10} {lb + ' calls':>10} {lb + ' ms':>10} {'diff ms':>9}")
    for key in keys:
        print(f"{key[:60]:60s} {ca.get(key, 0):10d} {ta.get(key, 0.0):10.3f} {cb.get(key, 0):10d} "
              f"{tb.get(key, 0.0):10.3f} {tb.get(key, 0.0) - ta.get(key, 0.0):+9.3f}")
    sa, sb = sum(ta.values()), sum(tb.values())
    print(f"{'all kernels':60s} {sum(ca.values()):10d} {sa:10.3f} {sum(cb.values()):10d} {sb:10.3f} {sb - sa:+9.3f}")


def main():
    args = sys.argv[1:]
    if args in (["-h"], ["--help"]):
        print(__doc__.strip())
        return
    labels = ["a", "b"]
    if "--labels" in args:
        i = args.index("--labels")
        if i + 1 >= len(args) or len(args[i + 1].split(",")) != 2:
            sys.exit("--labels needs two names, e.g. --labels bf16,fp8")
        labels = args[i + 1].split(",")
        del args[i:i + 2]
    if len(args) == 1:
        print_table(*read_kernels(args[0]))
    elif len(args) == 2:
        print_comparison(read_kernels(args[0]), read_kernels(args[1]), labels)
    else:
        sys.exit("usage: python3 dev/cuda/kernel_table.py kernels.csv | a.csv b.csv [--labels A,B]")


if __name__ == "__main__":
    main()
