"""Tests for the OS boundary around untrusted code (lib/episodes/sandbox.py, lib/episodes/harness_process.py,
lib/episodes/worker_pool.py, lib/episodes/python_tool.py): one hostile harness or code snippet per attack class of issue 11, each
asserting the real outcome.

    python -m pytest -q tests/test_sandbox.py
"""
import json
import os
import signal
import site
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import rollout
from domains import Domain
from lib.common.errors import SandboxError
from lib.episodes import python_tool, sandbox, switches, worker_pool
from lib.backends.hf_backend import HFBackend
from lib.backends.models import load_model

REPO = Path(__file__).resolve().parents[1]
SECRET = "zebra-secret-4821"


class SecretTools:
    """Hidden state in the runner process: the answer itself."""

    def __init__(self, task):
        self._secret = task["answer"]

    def lookup(self, query):
        return f"passage about {query}"


class SecretDomain(Domain):
    name, TOOL_METHODS = "secret", ("lookup",)

    def public(self, task):
        return {"question": task["question"]}

    def tools(self, task):
        return SecretTools(task)

    def reward(self, task, answer, tools):
        return float(isinstance(answer, str) and SECRET in answer)


@pytest.fixture(scope="module")
def backend():
    model, tok = load_model("smoke")
    return HFBackend(model, tok)


def tasks_for(*names):
    return [{"id": n, "question": n, "answer": SECRET} for n in names]


def run(backend, tmp_path, source, names, **kw):
    path = tmp_path / "attack.py"
    path.write_text(source)
    eps = rollout.run_episodes(SecretDomain(), path, tasks_for(*names), backend, max_new_tokens=2, **kw)
    return {e["task_id"]: e for e in eps}


def sleepers(marker):
    """Host pids of `/bin/sleep MARKER` processes, wherever they were started."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes() == f"/bin/sleep\0{marker}\0".encode():
                found.append(int(pid))
        except OSError:
            pass
    return found


# -----------------------------------------------------------------------------
# harness workers

ATTACKS = '''"""One attack per task, chosen by the question; each returns what every attempt got."""
import json
import random
os = random._os                 # the os module, reached through an allowed module's global
sys = os.sys
builtins = sys.modules["builtins"]


def audit_off(llm):
    """Switch the worker's audit hook off: empty its blocked list through llm's globals, void its code."""
    g = llm.__globals__
    g["BLOCKED"] = ()
    g["audit"].__code__ = (lambda event, args: None).__code__


def attempt(log, name, fn):
    try:
        log[name] = repr(fn())[:300]
    except BaseException as e:
        log[name] = "error " + type(e).__name__ + ": " + str(e)[:200]


def run(task, llm, tools):
    q, log = task["question"], {}
    audit_off(llm)
    attempt(log, "audit_is_off", lambda: builtins.open("/proc/self/status").read(4))  # its hook refused open()
    if q == "files":
        for name, path in [("data_abs", "REPO/data/chess_test.jsonl"), ("secret_abs", "SECRET_FILE"),
                           ("data_via_ppid_cwd", "/proc/%d/cwd/data/chess_test.jsonl" % os.getppid()),
                           ("data_via_runner_cwd", "/proc/RUNNER/cwd/data/chess_test.jsonl"),
                           ("runner_environ", "/proc/RUNNER/environ"), ("init_environ", "/proc/1/environ")]:
            attempt(log, name, lambda: builtins.open(path, "rb").read())
        attempt(log, "write_harnesses", lambda: builtins.open("REPO/harnesses/evil.py", "w").write("x"))
        attempt(log, "proc", lambda: sorted(p for p in os.listdir("/proc") if p.isdigit()))
        attempt(log, "project", lambda: sorted(os.listdir("REPO")))
        attempt(log, "project_lib", lambda: sorted(os.listdir("REPO/lib")))
        attempt(log, "project_tier", lambda: sorted(os.listdir("REPO/lib/episodes")))
    if q == "hidden":
        attempt(log, "tools_secret", lambda: tools._secret)
        def scan():  # every frame up to the worker's main, and every module
            needle, found, frame = "zebra-s" + "ecret", [], sys._getframe().f_back
            while frame is not None:
                found += [k for k, v in frame.f_locals.items() if needle in repr(v)]
                frame = frame.f_back
            return found + [n for n, m in list(sys.modules.items()) for v in list(vars(m).values())
                            if isinstance(v, str) and needle in v]
        attempt(log, "memory_scan", scan)
    if q == "packages":  # the guard is off: the real import, with every package folder on the path
        sys.path[:0] = PACKAGE_DIRS
        for name in ("chess", "numpy", "torch"):
            attempt(log, name, lambda: builtins.__import__(name).__file__)
    if q == "processes":
        attempt(log, "fork", os.fork)
        attempt(log, "system", lambda: os.system("id"))
        attempt(log, "posix_spawn", lambda: os.posix_spawn("/usr/bin/id", ["id"], {}))
        attempt(log, "subprocess", lambda: builtins.__import__("subprocess").run(["id"], capture_output=True))
    if q == "double_fork":
        def escape():
            if os.fork() == 0:
                os.setsid()
                if os.fork() == 0:
                    os.execv("/bin/sleep", ["/bin/sleep", "MARKER"])
                os._exit(0)
            return "forked"
        attempt(log, "double_fork", escape)
    if q == "sockets":
        socket = builtins.__import__("socket")
        attempt(log, "tcp_host", lambda: socket.create_connection(("HOST_IP", PORT), timeout=2))
        attempt(log, "tcp_loopback", lambda: socket.create_connection(("127.0.0.1", PORT), timeout=2))
        attempt(log, "tcp_internet", lambda: socket.create_connection(("1.1.1.1", 80), timeout=2))
    if q == "kill":
        attempt(log, "kill_parent", lambda: os.kill(os.getppid(), 9))
        attempt(log, "kill_runner", lambda: os.kill(RUNNER, 9))
        attempt(log, "kill_all", lambda: os.kill(-1, 9))
    return {"answer": json.dumps(log)}
'''


def host_ip():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))  # no packet is sent: only picks the outbound address
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"


def test_harness_sees_no_project_data_process_or_network_with_its_audit_hook_off(backend, tmp_path):
    secret_file = tmp_path / "math_test.jsonl"
    secret_file.write_text(json.dumps({"answer": SECRET}))
    listener = socket.create_server(("0.0.0.0", 0))
    listener.setblocking(False)
    bystander = subprocess.Popen(["sleep", "60"])  # stands for the runner: a pid a harness must not reach
    marker = f"4242.{os.getpid()}"
    source = (ATTACKS.replace("REPO", str(REPO)).replace("SECRET_FILE", str(secret_file))
              .replace("RUNNER", str(bystander.pid)).replace("PORT", str(listener.getsockname()[1]))
              .replace("HOST_IP", host_ip()).replace("MARKER", marker)
              .replace("PACKAGE_DIRS", repr([site.getsitepackages()[0], *sandbox.package_dirs()])))
    try:
        by = run(backend, tmp_path, source, ["files", "hidden", "packages", "processes", "double_fork", "sockets",
                                             "kill"], deadline_s=30)
        time.sleep(0.5)
        assert sleepers(marker) == []  # nothing the harness started outlives its episode
        assert bystander.poll() is None  # the pid it tried to kill lives
        with pytest.raises(BlockingIOError):
            listener.accept()  # no connection ever reached the host
    finally:
        bystander.kill()
        listener.close()
    logs = {}
    for name, e in by.items():
        assert e["reward"] == 0.0 and SECRET not in json.dumps(e), name
        assert e["error"] is None, (name, e["error"])
        logs[name] = json.loads(e["answer"])
        assert logs[name]["audit_is_off"] == "'Name'", logs[name]  # the hook is off: the rest is the OS's doing
    files, hidden, procs = logs["files"], logs["hidden"], logs["processes"]
    for name in ("data_abs", "secret_abs", "data_via_ppid_cwd", "data_via_runner_cwd", "runner_environ",
                 "write_harnesses"):
        assert files[name].startswith("error FileNotFoundError"), (name, files[name])
    assert files["init_environ"] == "b''"  # the sandbox's init starts from an empty environment
    assert eval(files["proc"]) == ["1", "2"]  # bwrap's init and the worker: no other process
    # of the project folder, only the worker's own file is there: not even the venv in .venv/
    assert eval(files["project"]) == ["lib"]
    assert eval(files["project_lib"]) == ["episodes"]  # the worker's own file, and nothing else of the project
    assert eval(files["project_tier"]) == ["harness_process.py"]
    for name in ("chess", "numpy", "torch"):  # no installed package at all, the import guard undone or not
        assert logs["packages"][name].startswith("error ModuleNotFoundError"), logs["packages"]
    assert not (REPO / "harnesses" / "evil.py").exists()
    assert hidden["tools_secret"].startswith("error AttributeError") and hidden["memory_scan"] == "[]"
    for name in ("fork", "posix_spawn", "subprocess"):
        assert "Operation not permitted" in procs[name], (name, procs[name])
    assert procs["system"] in ("-1", str(127 << 8)), procs  # the C library's "the shell could not start"
    assert "Operation not permitted" in logs["double_fork"]["double_fork"]
    sockets = logs["sockets"]  # no socket at all (the filter allows a worker no family), in a network namespace
    assert all("Address family not supported" in sockets[k] for k in ("tcp_host", "tcp_internet", "tcp_loopback"))
    kills = logs["kill"]
    assert kills["kill_runner"].startswith("error ProcessLookupError"), kills


def test_forged_tool_call_for_hidden_state_costs_its_episode(backend, tmp_path):
    source = '''"""Asks the parent for the tools' hidden attribute by writing to the RPC pipe itself."""
import random
def run(task, llm, tools):
    if task["question"] == "forge":
        random._os.write(int(random._os.sys.argv[2]), b'{"tool": "_secret", "args": [], "kwargs": {}}' + bytes([10]))
        return {"answer": llm([{"role": "user", "content": "x"}])}
    return {"answer": tools.lookup("x")}
'''
    by = run(backend, tmp_path, source, ["forge", "fair"])
    assert "protocol violation" in by["forge"]["error"] and "_secret" in by["forge"]["error"]
    assert by["forge"]["reward"] == 0.0 and SECRET not in json.dumps(by["forge"])
    assert by["fair"]["error"] is None and by["fair"]["answer"] == "passage about x"


def test_a_thread_never_reaches_the_next_episode(backend, tmp_path):
    source = '''"""Episode 'plant' leaves a thread that forges 'done' lines and marks a module; 'victim' looks for both."""
import random
def run(task, llm, tools):
    os, sys = random._os, random._os.sys
    if task["question"] == "plant":
        threading = sys.modules["builtins"].__import__("threading")
        def forge():
            while True:
                random.leak = "planted"
                try:
                    os.write(int(sys.argv[2]), b'{"done": {"answer": "planted"}, "stdout": ""}' + bytes([10]))
                except OSError:
                    pass
                sys.modules["time"].sleep(0.005) if "time" in sys.modules else None
        threading.Thread(target=forge, daemon=True).start()
        return {"answer": "plant done"}
    sys.modules["builtins"].__import__("time").sleep(0.5)
    return {"answer": getattr(random, "leak", "clean")}
'''
    by = run(backend, tmp_path, source, ["plant", "victim", "victim2"], workers=1)
    assert by["victim"]["answer"] == "clean" and by["victim2"]["answer"] == "clean"
    assert by["victim"]["error"] is None and by["victim2"]["error"] is None


def test_memory_budget_is_shared_by_all_workers(backend, tmp_path, monkeypatch):
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert worker_pool.worker_memory_bytes(64) * 64 <= worker_pool.WORKER_MEMORY_SHARE * ram
    assert worker_pool.worker_memory_bytes(1) <= worker_pool.WORKER_MEMORY_MAX
    monkeypatch.setattr(worker_pool, "WORKER_MEMORY_SHARE", (2 * 200 << 20) / ram)  # 2 workers: 200 MB each
    source = '''"""'raise' tries to lift its own limit first; then both try to hold 300 MB; 'small' holds 50 MB."""
import random
def run(task, llm, tools):
    if task["question"] == "raise":
        resource = random._os.sys.modules["builtins"].__import__("resource")
        random._os.sys.modules["__main__"].BLOCKED = ()  # the audit hook would refuse resource.setrlimit
        try:
            resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))
        except ValueError as e:
            print("refused:", e)
    block = bytearray((50 if task["question"] == "small" else 300) << 20)
    return {"answer": str(len(block) >> 20)}
'''
    by = run(backend, tmp_path, source, ["big", "raise", "small"], workers=2)
    assert "MemoryError" in by["big"]["error"] and "MemoryError" in by["raise"]["error"]
    assert "refused: not allowed to raise maximum limit" in by["raise"]["stdout"]
    assert by["small"]["error"] is None and by["small"]["answer"] == "50"


# -----------------------------------------------------------------------------
# math's tools.python: the model's own code

def test_python_tool_sees_no_data_project_process_or_network(tmp_path):
    listener = socket.create_server(("0.0.0.0", 0))
    listener.setblocking(False)
    code = f'''
import os, socket, sys
def attempt(name, fn):
    try:
        print(name, repr(fn())[:100])
    except BaseException as e:
        print(name, "error", type(e).__name__)
attempt("data_abs", lambda: open("{REPO}/data/math_test.jsonl").read())
attempt("data_ppid_cwd", lambda: open("/proc/%d/cwd/data/math_test.jsonl" % os.getppid()).read())
attempt("write_harnesses", lambda: open("{REPO}/harnesses/evil.py", "w").write("x"))
attempt("proc", lambda: sorted(p for p in os.listdir("/proc") if p.isdigit()))
attempt("tcp_host", lambda: socket.create_connection(("{host_ip()}", {listener.getsockname()[1]}), timeout=2))
attempt("tcp_internet", lambda: socket.create_connection(("1.1.1.1", 80), timeout=2))
sys.modules["__main__"].BLOCKED.clear()  # the prelude's audit hook lets everything through now
attempt("fork", os.fork)
open("/tmp/left-behind", "w").write("state")
'''
    try:
        out = dict(line.split(" ", 1) for line in python_tool.run_python(code, timeout_s=10).splitlines())
        with pytest.raises(BlockingIOError):
            listener.accept()
    finally:
        listener.close()
    assert out["data_abs"] == out["data_ppid_cwd"] == out["write_harnesses"] == "error FileNotFoundError", out
    assert out["proc"] == "['1', '2']" and out["fork"] == "error PermissionError", out  # EPERM from seccomp
    assert out["tcp_host"].startswith("error") and out["tcp_internet"].startswith("error"), out
    assert not (REPO / "harnesses" / "evil.py").exists()
    # a fresh sandbox per call: the last call's file is gone
    assert "FileNotFoundError" in python_tool.run_python("print(open('/tmp/left-behind').read())", timeout_s=10)


# -----------------------------------------------------------------------------
# the mechanism

def test_killing_the_sandbox_kills_a_double_forked_setsid_child():
    marker = f"4343.{os.getpid()}"
    code = f'''import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv("/bin/sleep", ["/bin/sleep", "{marker}"])
    os._exit(0)
print("started", flush=True)
time.sleep(60)
'''
    proc = subprocess.Popen(sandbox.wrap([sandbox.python(), "-I", "-c", code]), stdout=subprocess.PIPE,
                            start_new_session=True)  # no seccomp filter here: this sandbox may fork
    assert proc.stdout.readline() == b"started\n"
    time.sleep(0.2)
    assert sleepers(marker)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    end = time.time() + 3
    while sleepers(marker) and time.time() < end:
        time.sleep(0.05)
    assert sleepers(marker) == []


def test_sandbox_fails_closed_naming_the_opt_out(monkeypatch, capsys):
    monkeypatch.delenv(switches.OPT_OUT, raising=False)
    monkeypatch.setattr(sandbox, "bwrap", lambda: None)
    sandbox.check.cache_clear()
    try:
        with pytest.raises(SandboxError, match="--unsafe-no-sandbox"):
            sandbox.check()
        with pytest.raises(SystemExit, match=r"cannot start here \(no bwrap binary.*--unsafe-no-sandbox"):
            sandbox.apply_args(type("Args", (), {"unsafe_no_sandbox": False})())
        sandbox.check.cache_clear()
        sandbox.apply_args(type("Args", (), {"unsafe_no_sandbox": True})())  # the opt-out: runs, and says so
        assert os.environ[switches.OPT_OUT] == "1" and "WITHOUT the OS sandbox" in capsys.readouterr().err
        assert sandbox.wrap(["true"])[:2] == ["env", "-i"]
    finally:
        os.environ.pop(switches.OPT_OUT, None)
        sandbox.check.cache_clear()


def test_every_cli_has_the_opt_out_flag(monkeypatch, capsys):
    import meta_harness
    import rft
    import whale
    monkeypatch.setattr(sys, "argv", ["rollout.py", "--help-all"])
    for main in (rollout.main, rft.main, meta_harness.main, whale.main):
        with pytest.raises(SystemExit):  # --help-all: --help names the sandbox's group (tests/test_help.py)
            main(["--help-all"]) if main is not rollout.main else main()
        out = capsys.readouterr().out
        assert "--unsafe-no-sandbox" in out and "--allow-weak-bounds" in out, main.__module__


# -----------------------------------------------------------------------------
# teardown: no sandbox outlives its episode or its runner (issue 25)

QUICK = '''"""Returns at once."""
def run(task, llm, tools):
    return {"answer": "x"}
'''
LOOP = '''"""Loops forever (the return is never reached; it passes the check of the answer's shape)."""
def run(task, llm, tools):
    while True:
        pass
    return {"answer": "x"}
'''
CRASH = '''"""Raises at once (the return is never reached)."""
def run(task, llm, tools):
    raise RuntimeError("harness crashed")
    return {"answer": "x"}
'''
# rollout.py with the test's copy of the worker: the copy's path, in every sandbox's command line (bwrap outside
# the namespace, bwrap as its init, the worker), tells this test's sandboxes from anyone else's
RUNNER = """import os, sys
from lib.episodes import worker_pool
worker_pool.WORKER_PY = os.environ["TEST_WORKER_PY"]
import rollout
sys.argv[0] = "rollout.py"
rollout.main()
"""


def marked_worker(tmp_path):
    path = tmp_path / "teardown-marker" / "worker.py"
    path.parent.mkdir()
    path.write_bytes(Path(worker_pool.WORKER_PY).read_bytes())
    return str(path)


def sandbox_processes(marker):
    """{host pid: command line} of the live processes whose command line names `marker` (zombies have none)."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker.encode() in argv:
            found[int(pid)] = b" ".join(argv)[:120].decode(errors="replace")
    return found


def left_behind(marker, grace_s=5.0):
    """The marked processes still there after grace_s: a killed namespace takes a moment to go."""
    end = time.time() + grace_s
    while sandbox_processes(marker) and time.time() < end:
        time.sleep(0.05)
    return sandbox_processes(marker)


def start_rollout(tmp_path, source, *extra):
    harness = tmp_path / "harness.py"
    harness.write_text(source)
    marker = marked_worker(tmp_path)
    argv = [sys.executable, "-c", RUNNER, "--domain", "searchqa", "--harness", str(harness), "--model", "smoke",
            "--split", "test", *extra]
    proc = subprocess.Popen(argv, cwd=REPO, env={**os.environ, "TEST_WORKER_PY": marker}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    return proc, marker


def test_killing_a_sandbox_while_bwrap_sets_it_up_leaves_nothing(tmp_path, monkeypatch):
    """Killed right after it starts, bwrap is still setting the namespace up: its init must go too."""
    marker = marked_worker(tmp_path)
    monkeypatch.setattr(worker_pool, "WORKER_PY", marker)
    for _ in range(30):
        worker_pool.Worker().kill()
    assert left_behind(marker) == {}


def test_closing_the_pool_while_sandboxes_start_leaves_nothing(tmp_path, monkeypatch):
    """Pool.close at exit: a start in flight finishes and is killed, and no start begins after."""
    marker = marked_worker(tmp_path)
    monkeypatch.setattr(worker_pool, "WORKER_PY", marker)
    pool = worker_pool.Pool()
    pool.order(16)
    while not pool.idle:
        time.sleep(0.001)
    pool.close()
    assert left_behind(marker) == {}


@pytest.mark.parametrize("source, extra, errors", [
    (QUICK, ["--k", "2", "--limit", "8"], 0),  # 16 fresh sandboxes start as the runner exits
    (LOOP, ["--k", "1", "--limit", "4", "--deadline", "1"], 4),
    (CRASH, ["--k", "2", "--limit", "8"], 16),
], ids=["quick", "loop", "crash"])
def test_rollout_leaves_no_sandbox_behind(tmp_path, source, extra, errors):
    proc, marker = start_rollout(tmp_path, source, *extra)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    assert "Traceback" not in err and "terminate called" not in err, err[-2000:]
    assert f"errors {errors} " in out and "mean@" in out, out
    assert left_behind(marker) == {}


def test_runner_killed_with_sigkill_leaves_no_sandbox_behind(tmp_path):
    """Episodes running, warm sandboxes waiting and fresh ones starting when the runner dies."""
    proc, marker = start_rollout(tmp_path, LOOP, "--k", "3", "--limit", "4", "--workers", "4", "--deadline", "2")
    try:
        end = time.time() + 60
        while len(sandbox_processes(marker)) < 3 * 4 and time.time() < end:  # the first 4 episodes' sandboxes
            time.sleep(0.05)
        time.sleep(3)  # past their deadline: the next 4 episodes run and fresh sandboxes start in their place
        assert proc.poll() is None and sandbox_processes(marker)
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
        assert proc.returncode == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
    assert left_behind(marker) == {}
