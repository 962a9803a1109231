"""Groups an ncu CSV (--csv --page raw --metrics gpu__time_duration.sum) by kernel name and prints
calls, total and mean time and share of the total, slowest first.
    python3 dev/cuda/kernel_table.py kernels.csv
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


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: python3 dev/cuda/kernel_table.py kernels.csv")
    with open(sys.argv[1]) as f:
        lines = [line for line in f if not line.startswith("==")]
    rows = list(csv.reader(lines))
    if not rows:
        sys.exit(f"{sys.argv[1]}: no kernels recorded: did the NVTX range 'step' run?")
    header = rows[0]
    try:
        name_col, time_col = header.index("Kernel Name"), header.index("gpu__time_duration.sum")
    except ValueError:
        sys.exit(f"{sys.argv[1]}: no 'Kernel Name' / 'gpu__time_duration.sum' columns: run ncu with --csv --page raw")
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
    total = sum(totals.values())
    print(f"{'kernel':60s} {'calls':>6} {'total ms':>10} {'mean us':>9} {'share':>7}")
    for key in sorted(totals, key=totals.get, reverse=True):
        print(f"{key[:60]:60s} {calls[key]:6d} {totals[key]:10.3f} {1000 * totals[key] / calls[key]:9.1f} "
              f"{100 * totals[key] / total:6.1f}%")
    print(f"{'all kernels':60s} {sum(calls.values()):6d} {total:10.3f}")


if __name__ == "__main__":
    main()
