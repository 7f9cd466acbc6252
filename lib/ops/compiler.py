"""What Triton compiles with at run time: a C compiler and Python's headers. Triton builds each kernel's launcher, a
small C extension, the first time the kernel runs (triton/runtime/build.py: $CC, else gcc, else clang on PATH,
with the interpreter's include folder for Python.h): the trainer's fla-core Gated DeltaNet kernels, vLLM's Triton
Gated DeltaNet prefill and torch.compile all need both. A stock Debian or Ubuntu Python 3.11 has no Python.h
without python3.11-dev, and a slim image has no gcc, so the first Triton kernel would die an hour into a night.
Standard library only: install.sh --gpu runs it before its environment has torch.

    python lib/ops/compiler.py      # one line: what was found (exit 0), or what is missing and its packages (exit 1)

    why = compiler.missing()        # None, or the line naming the packages
"""
import os
import shutil
import sys
import sysconfig


def c_compiler():
    """The C compiler Triton takes: $CC, else gcc, else clang on PATH; None where there is none."""
    cc = os.environ.get("CC")
    if cc:
        return shutil.which(cc)
    return shutil.which("gcc") or shutil.which("clang")


def include_dir():
    """The interpreter's include folder as Triton's build takes it (Debian's posix_local scheme as posix_prefix)."""
    scheme = sysconfig.get_default_scheme()
    return sysconfig.get_paths(scheme="posix_prefix" if scheme == "posix_local" else scheme)["include"]


def python_header():
    """Python.h where Triton's build looks for it, or None."""
    path = os.path.join(include_dir(), "Python.h")
    return path if os.path.isfile(path) else None


def missing():
    """None when both are there, else one line naming what is missing and the packages that provide it."""
    version = "python%d.%d" % sys.version_info[:2]
    lacks, packages = [], []
    if c_compiler() is None:
        cc = os.environ.get("CC")
        lacks.append(f"no C compiler ({f'$CC={cc} not found' if cc else 'no gcc or clang on PATH'})")
        packages.append("build-essential")
    if python_header() is None:
        lacks.append(f"no Python.h in {include_dir()}")
        packages.append(f"{version}-dev")
    if not lacks:
        return None
    return (f"{' and '.join(lacks)}: Triton builds its kernel launchers with both at run time (fla-core's Gated "
            f"DeltaNet kernels, vLLM's Triton prefill): apt install {' '.join(packages)} (Debian/Ubuntu; "
            "elsewhere gcc and the Python development headers), or set CC to a C compiler")


def found():
    return f"C compiler {c_compiler()}, {python_header()}"


if __name__ == "__main__":
    why = missing()
    print(why or found(), file=sys.stderr if why else sys.stdout)
    sys.exit(1 if why else 0)
