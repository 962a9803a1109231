#!/usr/bin/env bash
# Tests that the documentation stays what a newcomer can read and run (no GPU, no build, seconds):
#  - lines: README.md and dev/RESULTS.md have no line over 100 characters;
#  - history: README.md names no commit (a word of 7-40 hexadecimal digits with at least one digit
#    and one of a-f) and no step time (a number with ms, s, seconds or minutes followed by "a
#    step", "per step", "each step" or "a micro step", or a "ms/step" or "s/step" column); such
#    numbers live in dev/RESULTS.md and dev/notes/;
#  - commands: every line of a ```bash block of README.md (continued lines joined; `&&`, `;` and
#    `|` split it) is a command whose program exists and takes the flags given:
#      ./NAME             a Makefile target; for ./train_gpt2 every -flag is in llmc/flags.h's
#                         table, for ./train_gpt2cu in that table, train_gpt2.cu's own flags or
#                         llmc/record_flags.h's;
#      bash FILE.sh, scripts/NAME.sh
#                         an existing script; every --option (up to a lone --) is in its --help;
#      python3 FILE.py    an existing file; every --option is a quoted string in its source;
#      build/NAME         built from dev/data, dev/tools or dev/cuda NAME.cpp or .cu; every
#                         --option is a quoted string in that source;
#      make TARGET...     each TARGET a Makefile target or such a build/NAME;
#      mpirun, srun       checked as the program they launch; pip, apt-get and nvidia-smi pass.
#    A command that needs a GPU (the CUDA programs, mpirun and srun, the run, multi-GPU, scaling,
#    profiling and FP8 scripts, run_tests.sh --gpu-only, the benchmark tools, build/bench_* and the
#    kernel tests), unless it only asks for --help or --dry-run, carries a comment saying so:
#    "# needs a GPU" or "# needs N GPUs". A block without a language holds program output, so no
#    line of it may start as a command does;
#  - links: every relative link of README.md, dev/RESULTS.md and dev/notes/README.md names an
#    existing file (and a #heading of README.md one of its headings), and the notes' index links
#    every file of dev/notes/.
#
#   bash dev/test/test_docs.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source dev/test/lib.sh

output=$(python3 - <<'EOF'
import glob
import os
import re
import shlex
import subprocess


def report(what, problems):
    print(f"{what}\t{'ok' if not problems else '; '.join(problems)}")


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read().split("\n")


readme = read("README.md")

for path in ["README.md", "dev/RESULTS.md"]:
    report(f"{path}: no line over 100 characters",
           [f"line {n}: {len(line)} characters" for n, line in enumerate(read(path), 1)
            if len(line) > 100])

COMMIT = re.compile(r"(?<![0-9A-Za-z_])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}"
                    r"(?![0-9A-Za-z_])")
STEP_TIME = re.compile(r"\d[\d,.]*\s*(ms|s|seconds?|minutes?)\s+(a|per|each)\s+(micro\s+)?step\b"
                       r"|\bm?s/step\b")
report("README.md: no commit hashes",
       [f"line {n}: {m.group(0)}" for n, line in enumerate(readme, 1)
        for m in COMMIT.finditer(line)])
report("README.md: no step-time history",
       [f"line {n}: {m.group(0)}" for n, line in enumerate(readme, 1)
        for m in STEP_TIME.finditer(line)])

# --- commands
makefile = "\n".join(read("Makefile"))
make_targets = set(re.findall(r"^([A-Za-z0-9_./-]+)\s*:(?!=)", makefile, re.M))
shared_flags = set(re.findall(r'_flag\("(-[A-Za-z0-9]+)"', "\n".join(read("llmc/flags.h"))))
cuda_flags = set(re.findall(r'(?:_flag\(|return \{)"(-[A-Za-z0-9]+)"',
                            "\n".join(read("train_gpt2.cu") + read("llmc/record_flags.h"))))
trainer_flags = {"./train_gpt2": shared_flags, "./train_gpt2cu": shared_flags | cuda_flags}
GPU_PROGRAMS = re.compile(
    r"^(\./(train|test|profile)_gpt2(fp32)?cu|mpirun|srun"
    r"|scripts/(run_gpt2_\w+|multi_gpu_tests|scaling_tests|profile_kernels|fp8_convergence)\.sh"
    r"|dev/(bench|bench_checkpoint|bench_quality|profile_peer|error_budget)\.py|dev/cuda/\w+\.py"
    r"|build/(bench_\w+|test_kernels\w*|test_attention\w*))$")
GPU_MARK = re.compile(r"#.*\bneeds (a GPU|\d+\+? GPUs)\b")
SYSTEM_TOOLS = {"pip", "apt-get", "nvidia-smi"}
help_cache = {}


def split_comment(line):
    quote = None
    for i, c in enumerate(line):
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i], line[i:]
    return line, ""


def build_source(name):
    for pattern in ["dev/data/{}.cpp", "dev/tools/{}.cpp", "dev/cuda/{}.cu"]:
        if os.path.isfile(pattern.format(name)):
            return pattern.format(name)
    return None


def long_options(args):
    options = []
    for a in args:
        if a == "--":
            break
        if a.startswith("--"):
            options.append(a.split("=")[0])
    return options


def quoted_in(path, options):
    text = "\n".join(read(path))
    return [f"{o} not in {path}" for o in options if f'"{o}"' not in text and f"'{o}'" not in text]


def check_command(words):
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
        words = words[1:]
    if not words:
        return []
    program, args = words[0], words[1:]
    if program in ("mpirun", "srun"):
        launched = next((i for i, a in enumerate(args) if a.startswith(("./", "build/"))), None)
        return ([f"{program} launches no ./ or build/ program"] if launched is None
                else check_command(args[launched:]))
    if program == "bash":
        program, args = (args[0], args[1:]) if args else ("", [])
    if program in SYSTEM_TOOLS:
        return []
    if program == "make":
        targets = [a for a in args if not a.startswith("-") and "=" not in a]
        return [f"make {t}: no such target" for t in targets
                if t not in make_targets
                and not (t.startswith("build/") and build_source(t[len("build/"):]))]
    if program in ("python3", "python"):
        if not args or not os.path.isfile(args[0]):
            return [f"{program} {args[0] if args else ''}: no such file"]
        return quoted_in(args[0], long_options(args[1:]))
    if program.endswith(".sh"):
        if not os.path.isfile(program):
            return [f"{program}: no such script"]
        if long_options(args) and program not in help_cache:
            help_cache[program] = subprocess.run(["bash", program, "--help"], capture_output=True,
                                                 text=True, timeout=20).stdout
        return [f"{program} {o}: not in its --help" for o in long_options(args)
                if not re.search(re.escape(o) + r"(?![\w-])", help_cache[program])]
    if program.startswith("build/"):
        source = build_source(program[len("build/"):])
        return [f"{program}: built from no source"] if source is None else quoted_in(
            source, long_options(args))
    if program.startswith("./"):
        if program[2:] not in make_targets:
            return [f"{program}: not a Makefile target"]
        flags = trainer_flags.get(program)
        if flags is None:
            return []
        return [f"{program} {a}: not a flag of its table" for a in args
                if re.match(r"^-[A-Za-z][A-Za-z0-9]*$", a) and a not in flags]
    return [f"{program}: not a program this test knows"]


def needs_gpu(words):
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
        words = words[1:]
    if words and words[0] == "bash":
        words = words[1:]
    if not words or any(a in ("--help", "-h", "--dry-run") for a in words[1:]):
        return False
    return bool(GPU_PROGRAMS.match(words[0])) or (
        words[0] == "scripts/run_tests.sh" and "--gpu-only" in words)


blocks, block, language = [], None, None
for n, line in enumerate(readme, 1):
    if line.startswith("```"):
        if block is None:
            block, language = [], line[3:].strip()
        else:
            blocks.append((language, block))
            block = None
    elif block is not None:
        block.append((n, line))

command_start = re.compile(r"^(\./|bash |make |python3? |scripts/|build/|mpirun |srun )")
problems, commands = [], 0
for language, lines in blocks:
    if language == "":
        problems += [f"line {n}: a command in an output block" for n, line in lines
                     if command_start.match(line)]
        continue
    if language != "bash":
        problems.append(f"line {lines[0][0] - 1}: a block in {language}, not bash or output")
        continue
    joined, start = "", None
    for n, line in lines:
        start = start or n
        if line.endswith("\\"):
            joined += line[:-1] + " "
            continue
        joined += line
        code, comment = split_comment(joined)
        if code.strip():
            lexer = shlex.shlex(code, posix=True, punctuation_chars=";&|")
            lexer.whitespace_split = True
            command, pieces = [], []
            for token in list(lexer) + [";"]:
                if set(token) <= set(";&|"):
                    pieces.append(command)
                    command = []
                else:
                    command.append(token)
            for words in pieces:
                if not words:
                    continue
                commands += 1
                problems += [f"line {start}: {p}" for p in check_command(words)]
                if needs_gpu(words) and not GPU_MARK.search(comment):
                    problems.append(f"line {start}: {words[0]} needs a GPU, and its comment "
                                    "does not say so")
        joined, start = "", None
report(f"README.md: each of its {commands} commands runs here or is marked as needing a GPU",
       problems)

# --- links
LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading):
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


readme_anchors = {slug(line.lstrip("#")) for line in readme if line.startswith("#")}
for path in ["README.md", "dev/RESULTS.md", "dev/notes/README.md"]:
    problems = []
    for n, line in enumerate(read(path), 1):
        for target in LINK.findall(line):
            if re.match(r"^[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            if file and not os.path.exists(os.path.join(os.path.dirname(path), file)):
                problems.append(f"line {n}: {target}: no such file")
            elif not file and path == "README.md" and anchor not in readme_anchors:
                problems.append(f"line {n}: {target}: no such heading")
    report(f"{path}: every relative link names an existing file", problems)

index = "\n".join(read("dev/notes/README.md"))
report("dev/notes/README.md links every note",
       [f"{os.path.basename(p)} not linked" for p in sorted(glob.glob("dev/notes/*.md"))
        if os.path.basename(p) != "README.md" and f"]({os.path.basename(p)})" not in index])
EOF
)
check_verdicts "the documentation checker" $? "$output" ok
finish test_docs
