r"""
Which lib/ modules a command's main process runs functions of: how many rooms a reader opens to follow it.

    python scripts/lib_modules.py rft.py --domain math --harness harnesses/math.py --model smoke \
        --steps 1 --batch 2 --group 2 --out /tmp/rft1

A profile hook notes every function call (not module or class bodies, not lambdas or comprehensions) whose code lies
under lib/, while the script runs as __main__; then one line per module with the functions it ran, and the count.
"""
import os
import runpy
import sys
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CO_OPTIMIZED = 1  # set on function code, not on module or class bodies


def main():
    seen = {}

    def hook(frame, event, arg):
        code = frame.f_code
        if event == "call" and code.co_filename.startswith(os.path.join(ROOT, "lib")) \
                and code.co_flags & CO_OPTIMIZED and not code.co_name.startswith("<"):
            seen.setdefault(os.path.relpath(code.co_filename, ROOT), set()).add(code.co_name)

    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return
    script, sys.argv = sys.argv[1], sys.argv[1:]
    sys.path.insert(0, ROOT)
    sys.setprofile(hook)
    threading.setprofile(hook)
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        sys.setprofile(None)
        for module in sorted(seen):
            print(module, " ".join(sorted(seen[module])), file=sys.stderr)
        print(f"{len(seen)} lib modules", file=sys.stderr)


if __name__ == "__main__":
    main()
