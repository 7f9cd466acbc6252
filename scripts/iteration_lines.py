r"""
The lines a reader follows through one WHALE run: every project function executed inside whale.run (any thread of
the main process), each counted once with its whole source (a nested function's or a lambda's lines once, inside
the function that holds them), tests excluded; then the lines and functions by file.

    python scripts/iteration_lines.py                      # whale.py --domain math --preset smoke --test-limit 2
    python scripts/iteration_lines.py --domain chess --preset smoke --method weight-only

Any flags are whale.py's (default: the smoke run above, the method table's default method, in a fresh temporary
--out). The issue-59 check reads the first line: the total, and the share outside lib/episodes/ and lib/backends/
(the method and its bookkeeping). VERBOSE=1 also names the functions of each file.
"""
import inspect
import os
import sys
import tempfile
import threading
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MACHINERY = ("lib/episodes/", "lib/backends/")  # the runner and the engines, counted apart


def project_file(path):
    rel = os.path.relpath(os.path.abspath(path), ROOT)
    return rel.endswith(".py") and not rel.startswith(("..", "tests" + os.sep, ".venv"))


def main():
    if sys.argv[1:2] in (["-h"], ["--help"]):
        print(__doc__)
        return
    sys.path.insert(0, ROOT)
    os.chdir(ROOT)
    import whale
    from lib import methods
    argv = sys.argv[1:] or ["--domain", "math", "--preset", "smoke", "--method", methods.DEFAULT, "--test-limit", "2"]
    if "--out" not in argv:
        argv += ["--out", os.path.join(tempfile.mkdtemp(prefix="iteration_lines-"), "run")]
    codes = set()

    def profile(frame, event, arg):
        if event == "call" and project_file(frame.f_code.co_filename):
            codes.add(frame.f_code)

    real_run = whale.run

    def traced_run(*a, **kw):
        threading.setprofile(profile)
        sys.setprofile(profile)
        try:
            return real_run(*a, **kw)
        finally:
            sys.setprofile(None)
            threading.setprofile(None)

    whale.run = traced_run
    whale.main(argv)
    lines, functions = defaultdict(set), defaultdict(set)
    for code in codes:
        if code.co_name == "<module>":  # an import's module body is not a function the run follows
            continue
        try:
            source, first = inspect.getsourcelines(code)
        except (OSError, TypeError):
            continue
        path = os.path.relpath(os.path.abspath(code.co_filename), ROOT)
        lines[path] |= set(range(max(first, 1), max(first, 1) + len(source)))
        if not code.co_name.startswith("<"):  # lambdas and comprehensions: their lines lie in their function
            functions[path].add((code.co_name, first))
    total = sum(len(v) for v in lines.values())
    method = [p for p in lines if not p.startswith(MACHINERY)]
    print(f"{total} lines in {len(lines)} files, {sum(len(v) for v in functions.values())} functions; outside "
          f"{' and '.join(MACHINERY)}: {sum(len(lines[p]) for p in method)} lines in {len(method)} files")
    for path in sorted(lines, key=lambda p: -len(lines[p])):
        print(f"{len(lines[path]):6d}  {len(functions[path]):4d}  {path}")
        if os.environ.get("VERBOSE") == "1":
            print("        " + ", ".join(name for name, _ in sorted(functions[path], key=lambda f: f[1])))


if __name__ == "__main__":
    main()
