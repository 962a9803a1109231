"""The Python tools' check of the modules they import, made before those imports: under a python3
that lacks one (often not the one scripts/install_deps.sh installed into), a tool stops with one
line on stderr naming the module and the fix, instead of an import traceback.

    from pydeps import require
    require("numpy", "torch")
"""
import importlib
import os
import sys

# scripts/install_deps.sh installs Debian's packages, so they are in Debian's python3.
SYSTEM_PYTHON = "/usr/bin/python3"
DEBIAN_PACKAGES = {"numpy": "python3-numpy", "torch": "python3-torch",
                   "matplotlib": "python3-matplotlib"}


def missing_modules(names):
    """(name, reason) for each module of names that does not import."""
    missing = []
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as e:
            missing.append((name, str(e).splitlines()[0] if str(e) else type(e).__name__))
    return missing


def fix_for(names):
    """How to get the modules names: Debian's python3 with install_deps.sh's packages, or pip."""
    packages = [DEBIAN_PACKAGES[name] for name in names if name in DEBIAN_PACKAGES]
    pip = "pip install " + " ".join(names)
    if len(packages) < len(names):
        return pip
    apt = "apt-get install " + " ".join(packages)
    if os.path.realpath(sys.executable) == os.path.realpath(SYSTEM_PYTHON):
        return f"bash scripts/install_deps.sh installs them ({apt})"
    return (f"run it with {SYSTEM_PYTHON}, for which scripts/install_deps.sh installs them ({apt}), "
            f"or {pip} for this python")


def require(*names):
    """Exits with status 1 and one line on stderr when a module of names does not import."""
    missing = missing_modules(names)
    if not missing:
        return
    program = sys.argv[0] or "python"
    modules = " and ".join(name for name, _ in missing)
    reason = missing[0][1]
    print(f"error: {program} needs {modules}, which {sys.executable} cannot import ({reason}): "
          f"{fix_for([name for name, _ in missing])}", file=sys.stderr)
    sys.exit(1)
