"""Groups an ncu CSV (--csv --page raw --metrics gpu__time_duration.sum) by kernel name and prints
calls, total and mean time and share of the total, slowest first. Where the CSV also holds the
memory metrics (MEMORY_METRICS: scripts/profile_kernels.sh --memory), each family's DRAM bytes
(read and written), their rate, its L2 bytes and its tensor pipe's activity (time-weighted) follow:
what a kernel moves and computes, to set against its floor. Given two CSVs (two modes of one step,
e.g. BF16 and FP8), prints each kernel's total time in both and the difference, the largest
differences first, so that the table says where one mode's time goes against the other's.
usage: python3 dev/cuda/kernel_table.py kernels.csv
       python3 dev/cuda/kernel_table.py a.csv b.csv [--labels A,B]
       python3 dev/cuda/kernel_table.py --memory-metrics   (the metrics ncu collects for the columns)
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


TIME = "gpu__time_duration.sum"
DRAM_READ, DRAM_WRITE, L2 = "dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_bytes.sum"
TENSOR = "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed"  # wgmma's too
MEMORY_METRICS = [DRAM_READ, DRAM_WRITE, L2, TENSOR]
# ncu's units, as its raw page names them, in the table's: ms, GB, %.
UNITS = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0, "s": 1e3, "second": 1e3,
         "byte": 1e-9, "Kbyte": 1e-6, "Mbyte": 1e-3, "Gbyte": 1.0, "Tbyte": 1e3, "%": 1.0}


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def read_kernels(path):
    """{kernel family: {"calls", "ms", and with the memory metrics "dram", "l2" (GB), "tensor_ms"
    (tensor % times ms)}} of one ncu CSV, and whether it has the memory metrics."""
    with open(path) as f:
        lines = [line for line in f if not line.startswith("==")]
    rows = list(csv.reader(lines))
    if not rows:
        sys.exit(f"{path}: no kernels recorded: did the NVTX range 'step' run?")
    header = rows[0]
    if "Kernel Name" not in header or TIME not in header:
        sys.exit(f"{path}: no 'Kernel Name' / '{TIME}' columns: run ncu with --csv --page raw")
    name_col = header.index("Kernel Name")
    memory = all(m in header for m in MEMORY_METRICS)
    columns = {m: header.index(m) for m in [TIME] + (MEMORY_METRICS if memory else [])}
    # ncu's raw page in ns, bytes and % unless its units row says otherwise.
    scale = {m: UNITS["ns" if m == TIME else "%" if m == TENSOR else "byte"] for m in columns}
    families = defaultdict(lambda: defaultdict(float))
    for row in rows[1:]:
        if len(row) <= max([name_col] + list(columns.values())):
            continue
        if number(row[columns[TIME]]) is None:  # the units row under the header
            scale.update({m: UNITS[row[c]] for m, c in columns.items() if row[c] in UNITS})
            continue
        values = {m: number(row[c]) or 0.0 for m, c in columns.items()}  # a metric ncu could not read: 0
        family = families[short_name(row[name_col])]
        ms = values[TIME] * scale[TIME]
        family["calls"] += 1
        family["ms"] += ms
        if memory:
            family["dram"] += (values[DRAM_READ] * scale[DRAM_READ] + values[DRAM_WRITE] * scale[DRAM_WRITE])
            family["l2"] += values[L2] * scale[L2]
            family["tensor_ms"] += values[TENSOR] * ms
    return families, memory


def memory_columns(f):
    """DRAM GB, its rate (GB/ms = TB/s), L2 GB and the tensor pipe's time-weighted activity."""
    ms = f["ms"] or 1.0
    return f"{f['dram']:8.2f} {f['dram'] / ms:6.2f} {f['l2']:7.2f} {f['tensor_ms'] / ms:7.1f}"


def print_table(families, memory):
    total = sum(f["ms"] for f in families.values())
    extra = f" {'DRAM GB':>8} {'TB/s':>6} {'L2 GB':>7} {'tensor%':>7}" if memory else ""
    print(f"{'kernel':60s} {'calls':>6} {'total ms':>10} {'mean us':>9} {'share':>7}{extra}")
    for key in sorted(families, key=lambda k: families[k]["ms"], reverse=True):
        f = families[key]
        extra = " " + memory_columns(f) if memory else ""
        print(f"{key[:60]:60s} {int(f['calls']):6d} {f['ms']:10.3f} {1000 * f['ms'] / f['calls']:9.1f} "
              f"{100 * f['ms'] / total:6.1f}%{extra}")
    everything = defaultdict(float)
    for f in families.values():
        for k, v in f.items():
            everything[k] += v
    extra = f" {'':9s} {'':7s} {memory_columns(everything)}" if memory else ""
    print(f"{'all kernels':60s} {int(everything['calls']):6d} {total:10.3f}{extra}")


def print_comparison(a, b, labels):
    """Each kernel's calls and ms in a and in b, and b - a; the largest |b - a| first."""
    ta, tb = ({k: f["ms"] for k, f in families.items()} for families, _ in (a, b))
    ca, cb = ({k: int(f["calls"]) for k, f in families.items()} for families, _ in (a, b))
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
    if args == ["--memory-metrics"]:  # ncu's --metrics for scripts/profile_kernels.sh --memory
        print(",".join([TIME] + MEMORY_METRICS))
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
