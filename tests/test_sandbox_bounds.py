"""The sandbox bounds what it holds (issue 52), each shown from inside the sandbox it concerns: the syscalls no harness
needs (EPERM), shared memory and /tmp past their bounds, a trace's fields and size, a proposer's network, output,
processes; and the three small errors (a traceback's exception line, a non-UTF-8 run file, a FIFO as --harness).

    python -m pytest -q tests/test_sandbox_bounds.py
"""
import json
import os
import socket
import subprocess
import threading
import time
from types import SimpleNamespace

import pytest

import meta_harness as mh
import rollout
from domains import Domain
from fixtures import stand_ins
from lib.episodes import cgroups, python_tool, sandbox, seccomp, switches
from lib.contract import check_harness
from lib.common.json_files import read_json
from lib.episodes.runner import MAX_CHARS, TRACE_RECORD_BYTES
from test_archive_security import processes_with
from test_meta_harness import SEED, FakeDomain, FakeRollout, make_args

needs_sandbox = pytest.mark.skipif(switches.disabled(), reason=f"{switches.OPT_OUT}=1: no OS boundary to test")
needs_cgroup = pytest.mark.skipif(not cgroups.cgroup_parents(), reason="no writable cgroup on this host: "
                                  "the fallback bounds apply (lib/episodes/cgroups.memory_bound)")

# each call, with zero arguments: the filter answers before the kernel reads them
CALLS = r"""
import ctypes, json, sys
libc = ctypes.CDLL(None, use_errno=True)
found = {}
for name, number in json.loads(sys.argv[1]).items():
    ctypes.set_errno(0)
    rc = libc.syscall(number, 0, 0, 0, 0, 0, 0)
    found[name] = "ok" if rc >= 0 else ctypes.get_errno()
ctypes.set_errno(0)
found["unshare(CLONE_NEWUSER)"] = ctypes.get_errno() if libc.unshare(0x10000000) else "ok"
import threading
t = threading.Thread(target=lambda: None)
t.start()
t.join()
found["thread"] = "ok"
print(json.dumps(found))
"""


def numbers(names):
    import pyseccomp
    return {n: pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, n) for n in names}


def run_confined(script, *args, no_fork=True, cgroup=None, **wrap_kw):
    """script in a sandbox as a harness worker's (no_fork: its filter, the standard library only, read-only
    /dev) or a proposer's (no_fork=False). -> CompletedProcess."""
    fd = seccomp.no_fork_filter(no_fork, seccomp.WORKER_FAMILIES if no_fork else seccomp.PROPOSER_FAMILIES)
    try:
        argv = sandbox.wrap([sandbox.python(), "-I", "-c", script, *args], seccomp_fd=fd, packages=not no_fork,
                            ro_dev=no_fork, cgroup=cgroup, **wrap_kw)
        return subprocess.run(argv, pass_fds=(fd,), capture_output=True, text=True, timeout=120, env={})
    finally:
        os.close(fd)


@needs_sandbox
@pytest.mark.parametrize("no_fork", [True, False], ids=["worker", "proposer"])
def test_each_denied_syscall_gets_eperm_inside_the_sandbox(no_fork):
    names = seccomp.DENIED_CALLS + (seccomp.IPC_CALLS + seccomp.NOTIFY_CALLS if no_fork else ())
    done = run_confined(CALLS, json.dumps(numbers(names)), no_fork=no_fork)
    found = json.loads(done.stdout)
    eperm = 1
    assert {n: found[n] for n in names if found[n] != eperm} == {}, done.stderr
    assert found["unshare(CLONE_NEWUSER)"] == eperm and found["thread"] == "ok"


@needs_sandbox
def test_worker_cannot_ptrace_bwrap_or_read_its_memory():
    script = ("import ctypes; libc = ctypes.CDLL(None, use_errno=True)\n"
              "print(libc.ptrace(16, 1, 0, 0), ctypes.get_errno())\n"  # PTRACE_ATTACH to the sandbox's pid 1
              "try:\n    open('/proc/1/mem', 'rb').read(1)\nexcept OSError as e:\n    print('mem', e.errno)\n")
    lines = run_confined(script).stdout.split("\n")
    assert lines[0] == "-1 1" and lines[1].startswith("mem ")


def shmem_kib():
    return next(int(line.split()[1]) for line in open("/proc/meminfo") if line.startswith("Shmem:"))


def settle_shmem(before_kib, slack_kib=64 << 10, timeout_s=10.0):
    """The host's Shmem back within slack of before (the kernel frees a dead namespace's memory shortly after)."""
    end = time.time() + timeout_s
    while shmem_kib() > before_kib + slack_kib and time.time() < end:
        time.sleep(0.05)
    return shmem_kib()


SHM = r"""
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
for i in range(int(sys.argv[1])):  # 32 MiB segments, attached, touched and detached: in no address space
    sid = libc.shmget(0, 32 << 20, 0o1600)
    if sid < 0:
        print("shmget", ctypes.get_errno(), flush=True)
        break
    addr = libc.shmat(sid, None, 0)
    ctypes.memset(addr, 1, 32 << 20)
    libc.shmdt(ctypes.c_void_p(addr))
    print("segment", i, flush=True)
"""


@needs_sandbox
def test_shared_memory_is_refused_to_workers():
    before = shmem_kib()
    out = run_confined(SHM, "80").stdout  # 2.5 GiB asked
    assert out.strip() == "shmget 1"
    assert settle_shmem(before) <= before + (64 << 10)


@needs_sandbox
@needs_cgroup
def test_shared_memory_past_a_cgroup_bound_kills_the_sandbox_and_is_freed():
    # a proposer's sandbox may use SysV IPC: its cgroup counts it, and the kernel kills the sandbox at the bound
    before = shmem_kib()
    cgroup = cgroups.Cgroup(256 << 20, 64)
    try:
        done = run_confined(SHM, "32", no_fork=False, cgroup=cgroup)  # 1 GiB asked under 256 MiB
        events = cgroup.events()
    finally:
        cgroup.close()
    segments = done.stdout.count("segment")
    assert done.returncode != 0 and events["oom_kill"] >= 1 and segments < 8, (done.returncode, events, segments)
    assert settle_shmem(before) <= before + (64 << 10)


@needs_sandbox
def test_the_python_tool_gets_no_shared_memory():
    code = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "print(libc.shmget(0, 1 << 20, 0o1600), ctypes.get_errno(), libc.memfd_create(b'm', 0), ctypes.get_errno())")
    assert python_tool.run_python(code).split() == ["-1", "1", "-1", "1"]


@needs_sandbox
@needs_cgroup
def test_a_workers_sandbox_is_bounded_as_a_whole_and_its_group_goes_with_it():
    from lib.episodes import worker_pool

    def limits():
        found = []
        for folder in w.cgroup.folders:
            for name in ("memory.max", "memory.limit_in_bytes"):
                if os.path.exists(os.path.join(folder, name)):
                    found.append(int(open(os.path.join(folder, name)).read()))
        return found
    w = worker_pool.Worker()
    folders = list(w.cgroup.folders)
    try:
        assert limits() == [worker_pool.WORKER_MEMORY_MAX + cgroups.CGROUP_SLACK_BYTES]
        w.limit_memory(256 << 20)  # as the runner does when it sends the episode
        assert limits() == [(256 << 20) + cgroups.CGROUP_SLACK_BYTES]
        assert worker_pool.readable(w.rfd, 60) and os.read(w.rfd, 100) == b'{"ready": true}\n'
        procs = [open(os.path.join(f, "cgroup.procs")).read().split() for f in folders]
        assert all(str(w.proc.pid) in p and len(p) == 3 for p in procs)  # bwrap, its init, the worker
    finally:
        w.kill()
    assert not any(os.path.exists(f) for f in folders)


@needs_sandbox
def test_tmp_cannot_take_more_than_its_size():
    # the python tool: 100,000 long symlinks (counted by no file-size limit) fill its 64 MiB /tmp and stop
    before = shmem_kib()
    code = ("import os\nn = 0\ntry:\n    for n in range(100_000):\n        os.symlink('x' * 3000, f'/tmp/l{n}')\n"
            "except OSError as e:\n    print(n, e.strerror)\n")
    out = python_tool.run_python(code, timeout_s=60)
    made, why = out.split(" ", 1)
    if not cgroups.cgroup_parents():  # --allow-weak-bounds: no cgroup would count its inodes, so no /tmp to write
        assert (made, why.strip()) == ("0", "Read-only file system"), out
    else:
        assert why.strip() == "No space left on device" and int(made) <= sandbox.TMP_BYTES // 4096, out
    assert settle_shmem(before) <= before + (64 << 10)


# -----------------------------------------------------------------------------
# traces

class EchoTools:
    def __init__(self, task):
        self.calls = 0

    def search(self, query):
        self.calls += 1
        return f"{len(query)} characters"


class EchoDomain(Domain):
    name = "echo"
    TOOL_METHODS = ("search",)

    def public(self, task):
        return {"question": task["question"]}

    def tools(self, task):
        return EchoTools(task)

    def reward(self, task, answer, tools):
        return float(answer == "3000000 characters")


BIG_ARGS = '''"""Eight searches with a 3 MB query each, then the last result as the answer."""
def run(task, llm, tools):
    for _ in range(8):
        result = tools.search("q" * 3_000_000)
    return {"answer": result}
'''


@needs_sandbox
def test_a_3mb_tool_argument_is_cut_and_the_episode_trace_stays_under_its_cap(tmp_path):
    harness, traces = tmp_path / "big.py", tmp_path / "traces.jsonl"
    harness.write_text(BIG_ARGS)
    tasks = [{"id": f"t{i}", "question": "q"} for i in range(2)]
    no_model = SimpleNamespace(tokenizer=SimpleNamespace(chat_template=""))  # the harness never calls llm()
    eps = rollout.run_episodes(EchoDomain(), harness, tasks, no_model, deadline_s=60, workers=2,
                               traces_path=traces)
    assert [e["reward"] for e in eps] == [1.0, 1.0]  # the tool got every query whole
    lines = traces.read_text().splitlines()
    assert len(lines) == 2 and all(len(line) < TRACE_RECORD_BYTES for line in lines)
    call = json.loads(lines[0])["tool_calls"][0]
    assert isinstance(call["args"], str) and call["args"].endswith("(cut: 3000004 characters)")
    assert len(call["args"]) < MAX_CHARS + 100  # ["q...q"]: the list of the one 3,000,000-character query


def test_an_episode_over_the_record_cap_keeps_its_last_messages():
    from lib.episodes.runner import trace_line
    message = {"role": "user", "content": "m" * 30_000}
    calls = [{"messages": [message] * 10, "completion": "c", "prompt_ids": [1] * 5, "completion_ids": [2]}] * 8
    record = {"task_id": "t", "reward": 0.0, "calls": calls, "tool_calls": [{"name": "search", "args": "a" * 30_000}]}
    line = trace_line(record)
    kept = json.loads(line)
    assert len(line) <= TRACE_RECORD_BYTES and kept["trace_cut"] > TRACE_RECORD_BYTES
    assert all(len(c["messages"]) == 1 and c["messages_cut"] == 9 and "prompt_ids" not in c for c in kept["calls"])


# -----------------------------------------------------------------------------
# proposers: network, output, processes (through the search, as a hostile --proposer-cmd)

PROPOSER = r'''
import json, os, socket, sys, time
attack, work = sys.argv[1:3]
fresh = sorted(d for d in os.listdir(f"{work}/candidates")
               if not json.load(open(f"{work}/candidates/{d}/meta.json"))["proposed"])
seed = open(f"{work}/candidates/h0/harness.py").read()
with open(f"{work}/candidates/{fresh[0]}/harness.py", "w") as f:
    f.write(seed.replace("Answer briefly", "Answer"))


def reach(port, via_proxy):
    try:
        s = socket.create_connection(("127.0.0.1", via_proxy or port), timeout=5)
        if via_proxy:
            s.sendall(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n".encode())
            head = s.recv(200).decode()
            if " 200 " not in head.split("\r\n")[0]:
                return "refused: " + head.split("\r\n")[0]
        s.sendall(b"hello from the proposer\n")
        return "sent: " + s.recv(100).decode().strip()
    except OSError as e:
        return f"refused: {e.strerror or e}"


if attack == "network":
    host_port, allowed_port = map(int, sys.argv[3:5])
    log = [f"direct {reach(host_port, 0)}", f"proxied {reach(host_port, 3128)}", f"allowed {reach(allowed_port, 0)}"]
    with open(f"{work}/notes.md", "w") as f:
        f.write("\n".join(log) + "\n")
elif attack == "flood":  # 300 MiB on stdout
    chunk = b"x" * (1 << 20)
    for _ in range(300):
        os.write(1, chunk)
elif attack == "forkbomb":
    while True:
        try:
            if os.fork() == 0:
                time.sleep(60)
                os._exit(0)
        except OSError:
            time.sleep(0.01)
'''


class Listener:
    """A TCP listener on the host's loopback: what it received, and an answer for whoever connects."""

    def __init__(self):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port, self.received = self.server.getsockname()[1], []
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    self.received.append(conn.recv(100))
                    conn.sendall(b"hello from the host\n")
                except OSError:
                    pass

    def close(self):
        self.server.close()


@pytest.fixture
def proposer(tmp_path, monkeypatch):
    """run(attack, *argv, **args): a search of one round whose command proposer runs PROPOSER attack."""
    monkeypatch.setattr(mh, "rollout", FakeRollout())
    seed, script = tmp_path / "seed.py", tmp_path / "proposer.py"
    seed.write_text(SEED)
    script.write_text(PROPOSER)

    def run(attack, *argv, **over):
        cmd = " ".join([sandbox.python(), str(script), attack, "{workdir}", *map(str, argv)])
        args = make_args(proposer="command", proposer_cmd=cmd, proposer_ro=[str(script)], candidates=1,
                         proposer_max_failures=1, **over)
        try:
            mh.search(stand_ins.BACKEND, FakeDomain(), str(seed), tmp_path / "run", args, rounds=1)
        finally:  # every process the proposer started is gone when the search moves on
            assert processes_with(str(script)) == []
        return tmp_path / "run"
    return run


@needs_sandbox
@needs_cgroup  # under --allow-weak-bounds a proposer with a network is refused (test_kernel_bounds.py)
def test_a_proposer_reaches_no_host_loopback_and_only_its_allowed_endpoint(proposer):
    host, allowed = Listener(), Listener()
    try:
        run_dir = proposer("network", host.port, allowed.port, proposer_allow_host=[f"127.0.0.1:{allowed.port}"])
        notes = (run_dir / "notes.md").read_text().splitlines()
    finally:
        host.close()
        allowed.close()
    assert notes[0].startswith("direct refused") and notes[1] == "proxied refused: HTTP/1.1 403 Forbidden"
    assert notes[2] == "allowed sent: hello from the host"
    assert host.received == [] and allowed.received == [b"hello from the proposer\n"]
    cost = json.loads((run_dir / "costs.jsonl").read_text().splitlines()[-1])
    assert cost["egress_refused"] == [f"127.0.0.1:{host.port}"]


@needs_sandbox
def test_a_command_proposer_has_no_network_by_default(proposer):
    host = Listener()
    try:
        notes = (proposer("network", host.port, host.port) / "notes.md").read_text().splitlines()
    finally:
        host.close()
    assert all(" refused: " in line for line in notes) and host.received == []


@needs_sandbox
def test_a_proposers_300mib_stdout_is_cut_at_its_file_bound(proposer):
    with pytest.raises(SystemExit, match=r"last: a file reached its size bound \(--proposer-max-file-mb 64\)"):
        proposer("flood")


@needs_sandbox
@needs_cgroup
def test_a_proposers_fork_bomb_is_cut_at_its_process_bound(proposer):
    with pytest.raises(SystemExit, match=r"last: tried to run more than 32 processes \(--proposer-max-procs\)"):
        proposer("forkbomb", proposer_max_procs=32)


# -----------------------------------------------------------------------------
# the three small errors

def test_a_failed_candidates_error_keeps_the_exception_line():
    traceback = "Traceback (most recent call last):\n" + '  File "harness.py", line 9, in run\n' * 40 + \
        "ZeroDivisionError: division by zero"
    assert mh.error_tail(traceback).endswith("ZeroDivisionError: division by zero")
    assert len(mh.error_tail(traceback)) <= 304 and mh.error_tail("short") == "short"


def test_a_non_utf8_run_file_is_named(tmp_path):
    path = tmp_path / "state.json"
    path.write_bytes(b'{"phase": "\xff"}')
    with pytest.raises(ValueError, match=rf"damaged run file {path} \(not UTF-8 text: byte 11\)"):
        read_json(path)


def test_a_fifo_or_a_folder_as_harness_is_not_a_regular_file(tmp_path):
    fifo = tmp_path / "h.py"
    os.mkfifo(fifo)
    for path in (fifo, tmp_path):
        with pytest.raises(ValueError, match="not a regular file"):
            check_harness(path)
    with pytest.raises(FileNotFoundError, match="no such harness file"):
        check_harness(tmp_path / "absent.py")


@needs_sandbox
def test_without_a_writable_cgroup_the_fallback_bounds_hold_and_the_preflight_says_so(monkeypatch):
    monkeypatch.setattr(cgroups, "cgroup_parents", lambda: [])
    cgroup = cgroups.Cgroup(1 << 30, 64)
    assert cgroup.folders == [] and cgroup.enter(["true"]) == ["true"] and cgroup.events() == {}
    assert cgroups.memory_bound().startswith("no writable cgroup (--allow-weak-bounds): per-process limits")
    out = python_tool.run_python("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                                 "print(libc.shmget(0, 1 << 20, 0o1600), ctypes.get_errno())\nprint(sum(range(10)))")
    assert out.split() == ["-1", "1", "45"]  # the tool works; shared memory is still refused by the filter
