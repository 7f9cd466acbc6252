"""The bounds the kernel enforces (issue 61), each shown from inside the sandbox it concerns: a proposer's writes
capped by its folder's file system, untrusted values that cannot crash the run, the socket families each sandbox
may open, the egress proxy under a flood, and the fallback where no cgroup can be made.

    python -m pytest -q tests/test_kernel_bounds.py
"""
import json
import os
import subprocess
import tempfile
import threading
import time
from types import SimpleNamespace

import pytest

import meta_harness as mh
import rollout
from fixtures import stand_ins
from lib import proposers
from lib.episodes import cgroups, egress, python_tool, sandbox, seccomp, switches
from lib.ops import preflight
from lib.common.errors import SandboxError
from test_archive_security import processes_with
from test_meta_harness import SEED, FakeDomain, FakeRollout, make_args
from test_sandbox_bounds import CALLS, EchoDomain, numbers, run_confined

needs_sandbox = pytest.mark.skipif(switches.disabled(), reason=f"{switches.OPT_OUT}=1: no OS boundary to test")
MiB = 1 << 20


# -----------------------------------------------------------------------------
# a proposer's writes: its folder is a tmpfs of its bound, inside its sandbox

ATTACK = r'''
import json, os, resource, sys, time
attack, work = sys.argv[1:3]
fresh = sorted(d for d in os.listdir(f"{work}/candidates")
               if not json.load(open(f"{work}/candidates/{d}/meta.json"))["proposed"])
seed = open(f"{work}/candidates/h0/harness.py").read()
with open(f"{work}/candidates/{fresh[0]}/harness.py", "w") as f:
    f.write(seed.replace("Answer briefly", "Answer"))


def fallocate(folder, hide):
    """80 files in a folder of its own, opened first, then hidden (unlinked: each unlinked and held open;
    unreadable: the folder made mode 000), then given 63 MiB each through their descriptors, 16 of them, and 1 MiB
    the rest (four processes racing for the last 63 MiB may all be refused); -> MiB the kernel gave."""
    os.mkdir(folder)
    sizes = [63] * 16 + [1] * 64
    fds = [os.open(f"{folder}/f{i}", os.O_CREAT | os.O_RDWR, 0o600) for i in range(len(sizes))]
    if hide == "unlinked":
        for i in range(len(sizes)):
            os.unlink(f"{folder}/f{i}")
    else:
        os.chmod(folder, 0)
    got = 0
    for fd, mib in zip(fds, sizes):
        try:
            os.posix_fallocate(fd, 0, mib << 20)
            got += mib
        except OSError:
            pass
    return got


if attack in ("unlinked", "unreadable"):  # four processes, 4 GiB asked in all
    for _ in range(4):
        if os.fork() == 0:
            print("allocated", fallocate(f"{work}/hidden{os.getpid()}", attack), flush=True)
            time.sleep(30)  # its files held open
            os._exit(0)
    time.sleep(30)
elif attack == "deep":  # its candidate's harness.py a folder 1,200 deep, locked at the bottom
    path = f"{work}/candidates/{fresh[0]}/harness.py"
    os.remove(path)
    os.makedirs(path)
    os.chdir(path)
    for _ in range(1200):
        os.mkdir("d")
        os.chdir("d")
    os.chdir("..")
    os.chmod("d", 0)
elif attack == "files":  # 200,000 empty files in /tmp: no size, but ~1 KiB of kernel memory each
    try:
        for i in range(200_000):
            open(f"/tmp/e{i}", "w").close()
    except OSError:  # where the kernel refuses the next one: it waits, as a command that goes on would
        pass
    time.sleep(30)
elif attack == "stopped":  # stops every other process of its sandbox (a counter among them), then makes empty
    # files in its folder and in /tmp until refused (100,000 at most), removes them, and says how many it made
    import signal
    others = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, os.getpid())]
    for pid in others:
        os.kill(pid, signal.SIGSTOP)
    made = {}
    for name, place in (("folder", f"{work}/many"), ("tmp", "/tmp/many")):
        os.mkdir(place)
        n, why = 0, None
        try:
            while n < 100_000:
                open(f"{place}/{n}", "w").close()
                n += 1
        except OSError as e:
            why = e.strerror
        made[name] = [n, why]
        for i in range(n):
            os.remove(f"{place}/{i}")
    with open(f"{work}/notes.md", "w") as f:
        f.write(json.dumps(made))
    for pid in others:
        os.kill(pid, signal.SIGCONT)
elif attack == "memory":  # shared memory four ways, a stack mapping, descriptors, socket buffers (set large, filled, in flight)
    import ctypes, mmap, socket
    libc, MiB, found = ctypes.CDLL(None, use_errno=True), 1 << 20, {}

    def shared(name, make):  # 512 MiB, twice a 256 MiB bound, touched in full
        try:
            m = make()
            for i in range(0, 512 * MiB, 4096):
                m[i] = 1
            m.close()
            found[name] = "touched 512 MiB"
        except OSError as e:
            found[name] = e.strerror
    shared("anonymous", lambda: mmap.mmap(-1, 512 * MiB, flags=mmap.MAP_SHARED))
    shared("dev_zero", lambda: mmap.mmap(os.open("/dev/zero", os.O_RDWR), 512 * MiB, flags=mmap.MAP_SHARED))
    # private, but stack to the kernel (MAP_GROWSDOWN): no data, so only its address space bounds it
    shared("growsdown", lambda: mmap.mmap(-1, 512 * MiB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x100))
    try:
        os.memfd_create("m")
        found["memfd"] = "ok"
    except OSError as e:
        found["memfd"] = e.strerror
    found["shmget"] = "ok" if libc.shmget(0, 512 * MiB, 0o1600) >= 0 else os.strerror(ctypes.get_errno())
    fds = []
    try:
        while len(fds) < 100_000:
            fds.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        pass
    found["descriptors"] = len(fds)
    for fd in fds:
        os.close(fd)
    queued, (carrier, far) = 0, socket.socketpair()
    carrier.setblocking(False)  # full: the in-flight round ends

    def fill(s):
        nonlocal_queued = 0
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * MiB)
            found["setsockopt"] = "ok"
        except OSError as e:
            found["setsockopt"] = e.strerror
        s.setblocking(False)
        try:
            while nonlocal_queued < 32 * MiB:
                nonlocal_queued += s.send(b"x" * 65536)
        except BlockingIOError:
            pass
        return nonlocal_queued
    for round in range(2):  # pairs until out of descriptors; then in flight through carrier, and again
        pairs = []
        try:
            while queued < 512 * MiB:
                a, b = socket.socketpair()
                pairs.append((a, b))
                queued += fill(a) + fill(b)
        except OSError:
            pass
        for a, b in pairs if round == 0 else ():
            try:
                socket.send_fds(carrier, [b"."], [a.fileno(), b.fileno()])
            except OSError:
                break
            a.close()
            b.close()
    found["queued_mib"] = queued // MiB
    for a, b in pairs:  # descriptors for what follows
        a.close()
        b.close()
    for name, make in (("tcp", lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM)),
                       ("datagram", lambda: socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)),
                       ("listener", lambda: socket.socket(socket.AF_UNIX).listen(4096))):
        try:  # a listener queues connections nobody accepted, each with what its closed client sent
            make()
            found[name] = "ok"
        except OSError as e:
            found[name] = e.strerror
    with open(f"{work}/notes.md", "w") as f:
        f.write(json.dumps(found))
elif attack == "shm":  # 1 GiB into /dev/shm, then what the kernel let it write, in notes.md
    written, chunk, why = 0, b"x" * (1 << 20), None
    try:
        with open("/dev/shm/fill", "wb") as f:
            for _ in range(1024):
                f.write(chunk)
                f.flush()
                written += 1
    except OSError as e:
        why = e.strerror
    with open(f"{work}/notes.md", "w") as f:
        f.write(json.dumps({"shm_mib": written, "why": why, "nproc": resource.getrlimit(resource.RLIMIT_NPROC)[0]}))
'''


@pytest.fixture
def search(tmp_path, monkeypatch):
    """search(attack, **args): one round of a search whose command proposer runs ATTACK attack in its sandbox;
    -> (run folder, the proposer's last cost line)."""
    monkeypatch.setattr(mh, "rollout", FakeRollout())
    (tmp_path / "tmp").mkdir()  # the proposer's scratch folder goes here: others' runs share /tmp
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    seed, script = tmp_path / "seed.py", tmp_path / "attack.py"
    seed.write_text(SEED)
    script.write_text(ATTACK)

    def run(attack, **over):
        cmd = " ".join([sandbox.python(), str(script), attack, "{workdir}"])
        args = make_args(proposer="command", proposer_cmd=cmd, proposer_ro=[str(script)], candidates=1,
                         proposer_max_failures=1, **over)
        try:
            mh.search(stand_ins.BACKEND, FakeDomain(), str(seed), tmp_path / "run", args, rounds=1)
        finally:  # every process the proposer started is gone when the search moves on
            assert processes_with(str(script)) == []
        return tmp_path / "run"
    return run


def disk_used():
    st = os.statvfs(tempfile.gettempdir())  # the file system of the proposer's scratch folder
    return (st.f_blocks - st.f_bfree) * st.f_frsize


# beside the bound: the proposer's stdout and stderr, the archive copy, and whoever else writes to this disk
# meanwhile (measured on the project's shared machine: 0.1 to 1.5 MiB in all; the attack asks 4 GiB)
DISK_SLACK = 256 * MiB


@needs_sandbox
@pytest.mark.parametrize("attack", ["unlinked", "unreadable"])
def test_a_proposer_fallocating_past_its_folder_is_stopped_and_the_host_disk_stays_under_the_bound(search, attack):
    bound_mb, peak, before = 64, [0], disk_used()
    done = threading.Event()

    def sample():  # the host disk's use, every 10 ms, while the search runs
        while not done.is_set():
            peak[0] = max(peak[0], disk_used() - before)
            time.sleep(0.01)
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.time()
    try:
        with pytest.raises(SystemExit, match=r"last: filled its folder: wrote 64 MiB \(--proposer-max-written-mb\)"):
            search(attack, proposer_max_written_mb=bound_mb, proposer_timeout=120)
    finally:
        done.set()
        sampler.join()
    assert peak[0] <= (bound_mb * MiB) + DISK_SLACK, peak[0] / MiB
    assert time.time() - t0 < 60  # stopped when the folder filled, not at the attack's 30 s sleep nor the timeout
    assert os.listdir(tempfile.gettempdir()) == []  # its scratch folder is gone


@needs_sandbox
def test_a_proposers_1200_deep_tree_fails_its_candidate_and_is_cleaned_up(search):
    run_dir = search("deep")
    meta = json.loads((run_dir / "candidates" / "h1_1" / "meta.json").read_text())
    assert meta["valid"] is False and meta["reason"] == "candidates/h1_1/harness.py: not a regular file"
    assert os.listdir(tempfile.gettempdir()) == []  # its scratch folder is gone


def test_a_1200_deep_locked_tree_is_measured_and_removed_without_recursion(tmp_path):
    # the host's own walks, as --unsafe-no-sandbox uses them on a proposer's folder
    path = tmp_path / "scratch"
    os.makedirs(path)
    fd = os.open(path, os.O_RDONLY)
    for _ in range(1200):
        os.mkdir("d", dir_fd=fd)
        inner = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = inner
    os.close(os.open("f", os.O_CREAT | os.O_WRONLY, dir_fd=fd))
    os.chmod(f"/proc/self/fd/{fd}", 0)
    os.close(fd)
    total = proposers.usage(path)[0]
    assert total > 0
    proposers.remove_tree(path)
    assert not path.exists()


# -----------------------------------------------------------------------------
# untrusted values: read with bounded depth, a value past a bound is its episode's error

DEEP = '''"""Returns a list nested as deep as the task asks, or a plain answer."""
def run(task, llm, tools):
    depth = int(task["question"])
    value = "3000000 characters"
    for _ in range(depth):
        value = [value]
    return {"answer": value}
'''


@needs_sandbox
def test_a_deeply_nested_return_fails_its_episode_in_one_line_and_the_run_finishes(tmp_path):
    harness, traces = tmp_path / "deep.py", tmp_path / "traces.jsonl"
    harness.write_text(DEEP)
    tasks = [{"id": f"t{d}", "question": str(d)} for d in (0, 100, 980)]
    no_model = SimpleNamespace(tokenizer=SimpleNamespace(chat_template=""))  # the harness never calls llm()
    eps = rollout.run_episodes(EchoDomain(), harness, tasks, no_model, deadline_s=60, workers=3, traces_path=traces)
    assert eps[0]["error"] is None and eps[0]["reward"] == 1.0
    for e in eps[1:]:
        assert e["reward"] == 0.0 and "\n" not in e["error"] and ("nested more than 64 deep" in e["error"]
                                                                  or "RecursionError" in e["error"]), e["error"]
    assert [json.loads(line)["task_id"] for line in traces.read_text().splitlines()] == ["t0", "t100", "t980"]


def test_a_deep_claude_result_is_an_error_line_not_a_crash():
    deep = "[" * 900 + "]" * 900
    for stdout in (deep, '{"type": "result", "subtype": %s, "errors": %s, "permission_denials": 5}' % (deep, deep)):
        error, _ = proposers.claude_result(stdout)
        assert isinstance(error, str) and "\n" not in error


def test_a_cut_trace_value_is_not_escaped_past_its_cap():
    from lib.episodes.runner import MAX_CHARS, capped
    for value in ('"' * 40_000, ['"' * 40_000], "\\" * 40_000):
        kept = capped(value)
        assert len(json.dumps(kept)) <= MAX_CHARS + 60 and kept.endswith("characters)"), len(json.dumps(kept))
    assert capped("a" * 40_000).startswith("a" * MAX_CHARS)  # a string keeps its own text, not its JSON


# -----------------------------------------------------------------------------
# socket families: each sandbox opens only the ones it needs

FAMILIES = r"""
import ctypes, json, socket
libc = ctypes.CDLL(None, use_errno=True)
found = {}
for name in ("AF_UNIX", "AF_INET", "AF_INET6", "AF_VSOCK", "AF_PACKET", "AF_ALG", "AF_NETLINK"):
    try:
        socket.socket(getattr(socket, name), socket.SOCK_DGRAM if name == "AF_PACKET" else socket.SOCK_STREAM).close()
        found[name] = "ok"
    except OSError as e:
        found[name] = e.errno
ctypes.set_errno(0)  # AF_UNIX with a high bit set: the filter compares the whole argument
rc = libc.syscall(SOCKET_NR, ctypes.c_long((1 << 32) | 1), 1, 0)
found["high_bits"] = "ok" if rc >= 0 else ctypes.get_errno()
try:
    socket.socketpair(socket.AF_UNIX)
    found["socketpair"] = "ok"
except OSError as e:
    found["socketpair"] = e.errno
print(json.dumps(found))
"""
EAFNOSUPPORT = 97


@needs_sandbox
@pytest.mark.parametrize("kind", ["worker", "tool", "proposer"])
def test_each_sandbox_opens_only_its_socket_families(kind):
    families = {"worker": seccomp.WORKER_FAMILIES, "tool": seccomp.TOOL_FAMILIES,
                "proposer": seccomp.PROPOSER_FAMILIES}[kind]
    script = FAMILIES.replace("SOCKET_NR", str(numbers(["socket"])["socket"]))
    if kind == "tool":  # the python tool itself
        found = json.loads(python_tool.run_python(script))
    else:
        fd = seccomp.no_fork_filter(kind != "proposer", families)
        try:
            argv = sandbox.wrap([sandbox.python(), "-I", "-c", script], seccomp_fd=fd)
            found = json.loads(subprocess.run(argv, pass_fds=(fd,), capture_output=True, text=True, timeout=60,
                                              env={}).stdout)
        finally:
            os.close(fd)
    allowed = {f.name for f in families}
    for name in ("AF_UNIX", "AF_INET", "AF_INET6", "AF_VSOCK", "AF_PACKET", "AF_ALG", "AF_NETLINK"):
        assert (found[name] == "ok") == (name in allowed) and found[name] in ("ok", EAFNOSUPPORT), (name, found)
    assert found["high_bits"] == EAFNOSUPPORT
    assert (found["socketpair"] == "ok") == ("AF_UNIX" in allowed)


@needs_sandbox
def test_inotify_is_denied_to_workers_and_the_tool():
    found = json.loads(run_confined(CALLS, json.dumps(numbers(seccomp.NOTIFY_CALLS))).stdout)
    assert [found[n] for n in seccomp.NOTIFY_CALLS] == [1, 1]  # EPERM


# -----------------------------------------------------------------------------
# the egress proxy under a flood

FLOOD = r"""
import resource, socket, sys, threading, time
path, seconds, wait = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
idle, answers = [], {"403": 0, "closed": 0}
def refused():  # CONNECTs to a 60,000-character host, as fast as the proxy takes them
    end = time.time() + seconds
    while time.time() < end:
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect(path)
            s.sendall(b"CONNECT " + b"h" * 60000 + b".example:443 HTTP/1.1\r\n\r\n")
            answers["403" if b" 403 " in s.recv(100) else "closed"] += 1
        except OSError:
            answers["closed"] += 1
        s.close()
threads = [threading.Thread(target=refused) for _ in range(8)]
for t in threads:
    t.start()
for _ in range(1000):  # and 1,000 connections that never send a head
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
        idle.append(s)
    except OSError:
        break
for t in threads:
    t.join()
time.sleep(wait)  # the idle ones still open: the proxy drops them once their head is late, and answers again
s = socket.socket(socket.AF_UNIX)
s.connect(path)
s.sendall(b"CONNECT 127.0.0.1:22 HTTP/1.1\r\n\r\n")
print(answers["403"], answers["closed"], len(idle), int(b" 403 " in s.recv(100)))
"""


def rss_bytes():
    return next(int(line.split()[1]) << 10 for line in open("/proc/self/status") if line.startswith("VmRSS:"))


@needs_sandbox
def test_the_egress_proxy_under_a_flood_stays_within_its_threads_and_memory(tmp_path, monkeypatch):
    monkeypatch.setattr(egress, "EGRESS_HEAD_S", 2.0)
    folder = tempfile.mkdtemp(prefix="whale-egress-", dir="/tmp")
    proxy = egress.Egress(folder, [])
    threads0, rss0, peak = threading.active_count(), rss_bytes(), {"threads": 0, "rss": 0}
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak["threads"] = max(peak["threads"], threading.active_count() - threads0)
            peak["rss"] = max(peak["rss"], rss_bytes() - rss0)
            time.sleep(0.01)
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        done_flood = run_confined(FLOOD, proxy.path, "5", str(egress.EGRESS_HEAD_S + 1), no_fork=False,
                                  ro=[proxy.path])
        denied, closed, idle, answered_after = map(int, done_flood.stdout.split() or [0] * 4)
        assert denied > 0 and idle == 1000 and answered_after == 1, (done_flood.stdout, done_flood.stderr[-500:])
    finally:
        done.set()
        sampler.join()
        proxy.close()
    # every connection: its thread and, once through, one more; heads of at most 64 KiB each
    assert peak["threads"] <= 2 * egress.EGRESS_CONNECTIONS + 1, peak
    assert peak["rss"] <= 64 * MiB, peak["rss"] / MiB
    assert len(proxy.refused) <= egress.EGRESS_REFUSED_KEPT and all(len(r) <= 200 for r in proxy.refused)
    assert proxy.refusals >= denied


@pytest.mark.parametrize("address", ["::127.0.0.1", "::ffff:0:7f00:1", "::ffff:127.0.0.1", "64:ff9b::a9fe:a9fe",
                                     "64:ff9b:1::a9fe:a9fe", "2002:7f00:1::1", "2002:a9fe:a9fe::", "fec0::1",
                                     "2001:0:4136:e378:8000:63bf:3fff:fdd2", "::1", "169.254.169.254", "10.0.0.1"])
def test_public_refuses_every_form_that_embeds_a_private_address(address):
    assert not egress.public(address)


@pytest.mark.parametrize("address", ["8.8.8.8", "2606:4700::1111", "64:ff9b::808:808", "2002:808:808::1"])
def test_public_keeps_public_addresses(address):
    assert egress.public(address)


# -----------------------------------------------------------------------------
# no silent fallback: without a cgroup, the preflight stops naming the opt-in; with it, the fallback bounds hold

@pytest.fixture
def no_cgroup(monkeypatch):
    monkeypatch.setattr(cgroups, "cgroup_parents", lambda: [])
    # recorded first, so the variable is back as it was after the test (apply_args sets it directly)
    monkeypatch.setenv(switches.WEAK_BOUNDS, "0")
    monkeypatch.delenv(switches.WEAK_BOUNDS)
    sandbox.check.cache_clear()
    yield monkeypatch
    sandbox.check.cache_clear()


def sandbox_args(proposer, allow_weak_bounds=False):
    return SimpleNamespace(unsafe_no_sandbox=False, allow_weak_bounds=allow_weak_bounds, proposer=proposer)


@needs_sandbox
@pytest.mark.parametrize("proposer", ["command", "claude", "openai"])
def test_without_a_cgroup_a_proposer_that_writes_code_stops_naming_the_opt_in(no_cgroup, proposer):
    with pytest.raises(preflight.Failed) as e:
        preflight.check_sandbox(sandbox_args(proposer))
    assert "\n" not in str(e.value) and "--allow-weak-bounds" in str(e.value) and "Delegate=yes" in str(e.value)
    sandbox.check.cache_clear()
    line = preflight.check_sandbox(sandbox_args(proposer, allow_weak_bounds=True))
    assert os.environ[switches.WEAK_BOUNDS] == "1" and "no writable cgroup (--allow-weak-bounds)" in line


@needs_sandbox
def test_without_a_cgroup_the_built_in_proposer_runs_under_per_process_limits_and_says_so(no_cgroup, capfd):
    line = preflight.check_sandbox(sandbox_args("mutate"))  # the smoke and cpu presets' proposer: writes no code
    assert os.environ[switches.WEAK_BOUNDS] == switches.BUILTIN
    assert "no writable cgroup (the built-in proposer writes no code" in line and "RLIMIT_AS" in line
    assert "delegated cgroup (README, 'A cgroup of your own')" in line
    # the one line every process of the run prints on its start
    warned = capfd.readouterr().err.strip()
    assert warned.count("\n") == 0 and warned.startswith("WARNING: sandbox: no writable cgroup (the built-in")
    # a process that inherits the choice but runs a proposer that writes code still stops
    sandbox.check.cache_clear()
    with pytest.raises(preflight.Failed, match="--allow-weak-bounds"):
        preflight.check_sandbox(sandbox_args("command"))


WEAK = '''"""Undoes the worker's audit hook, then tries each bound a cgroup would hold."""
import json
import random
os = random._os
sys = os.sys
builtins = sys.modules["builtins"]


def attempt(log, name, fn):
    try:
        log[name] = repr(fn())[:300]
    except BaseException as e:
        log[name] = "error " + type(e).__name__ + ": " + str(e)[:200]


def pipes():
    n = 0
    while n < 1000:
        os.pipe()
        n += 1
    return n


def run(task, llm, tools):
    g = llm.__globals__
    g["BLOCKED"] = ()
    g["audit"].__code__ = (lambda event, args: None).__code__
    log = {}
    attempt(log, "pipes", pipes)
    attempt(log, "tmp_file", lambda: builtins.open("/tmp/x", "w"))
    attempt(log, "nproc", lambda: g["resource"].getrlimit(g["resource"].RLIMIT_NPROC))
    attempt(log, "uid", os.getuid)
    return {"answer": json.dumps(log)}
'''


@needs_sandbox
def test_with_the_opt_in_the_fallback_bounds_hold_in_each_sandbox(no_cgroup, search, tmp_path):
    no_cgroup.setenv(switches.WEAK_BOUNDS, "1")
    # a harness worker: open files (which bound the bytes it can queue in pipes), no /tmp to fill with inodes,
    # its threads under RLIMIT_NPROC (the kernel exempts only root, whom a laptop run is not)
    harness = tmp_path / "weak.py"
    harness.write_text(WEAK)
    no_model = SimpleNamespace(tokenizer=SimpleNamespace(chat_template=""))
    ep = rollout.run_episodes(EchoDomain(), harness, [{"id": "t", "question": "q"}], no_model, deadline_s=60,
                              workers=1)[0]
    log = json.loads(ep["answer"])
    assert log["pipes"].startswith("error OSError: [Errno 24] Too many open files"), log
    assert log["tmp_file"].startswith("error OSError: [Errno 30] Read-only file system"), log
    assert log["nproc"] == "(256, 256)", log
    # the python tool: the same, in its own sizes
    out = python_tool.run_python("import resource\nprint(resource.getrlimit(resource.RLIMIT_NOFILE)[0], "
                                 "resource.getrlimit(resource.RLIMIT_NPROC)[0])\nopen('/tmp/x', 'w')")
    assert f"{sandbox.SANDBOX_OPEN_FILES} {python_tool.PYTHON_TASKS}" in out.splitlines()
    assert "Read-only file system" in out
    # a proposer: 1 GiB into /dev/shm stops at its size; its processes under RLIMIT_NPROC
    run_dir = search("shm", proposer_max_procs=48, proposer_max_file_mb=256)  # the file bound above /dev/shm's
    notes = json.loads((run_dir / "notes.md").read_text())
    assert notes["shm_mib"] <= sandbox.TMP_BYTES // MiB and notes["why"] == "No space left on device", notes
    assert notes["nproc"] == 48


@needs_sandbox
def test_with_the_opt_in_a_proposers_empty_files_are_stopped_at_the_kernels_bound(no_cgroup, search):
    no_cgroup.setenv(switches.WEAK_BOUNDS, "1")
    with pytest.raises(SystemExit, match=r"last: made 65536 files in its folder \(or 4096 in /tmp or /dev/shm\)"):
        search("files", proposer_max_written_mb=64)


@needs_sandbox
def test_with_the_opt_in_a_proposer_that_stops_its_sandbox_still_gets_no_more_files(no_cgroup, search):
    # its folder, /tmp and /dev/shm are tmpfs with nr_inodes (proposers.MOUNT): the kernel refuses the next file,
    # whatever the proposer stops; a count inside its sandbox was stopped with SIGSTOP and let 400,000 through
    no_cgroup.setenv(switches.WEAK_BOUNDS, "1")
    made = json.loads((search("stopped", proposer_max_written_mb=64) / "notes.md").read_text())
    # (beside many/ itself, and in /tmp the mount points bwrap made there)
    assert made["folder"][1] == made["tmp"][1] == "No space left on device", made
    assert proposers.PROPOSER_MAX_FILES - 10 <= made["folder"][0] < proposers.PROPOSER_MAX_FILES, made
    assert proposers.PROPOSER_TMP_FILES - 100 <= made["tmp"][0] < proposers.PROPOSER_TMP_FILES, made


@needs_sandbox
def test_with_the_opt_in_a_proposers_shared_memory_descriptors_and_socket_buffers_stay_within_its_flags(
        no_cgroup, search):
    no_cgroup.setenv(switches.WEAK_BOUNDS, "1")
    found = json.loads((search("memory", proposer_memory_mb=256, proposer_timeout=60) / "notes.md").read_text())
    denied = "Operation not permitted"
    assert [found[k] for k in ("anonymous", "dev_zero", "memfd", "shmget")] == [denied] * 4, found
    assert found["growsdown"] == "Cannot allocate memory", found  # RLIMIT_AS; RLIMIT_DATA let 1 GiB through
    assert found["descriptors"] < proposers.PROPOSER_OPEN_FILES, found
    assert found["setsockopt"] == denied, found
    # 256 descriptors, and as many in flight, at net.core.wmem_default each (111 MiB measured with 212,992)
    assert found["queued_mib"] <= 2 * proposers.PROPOSER_OPEN_FILES * wmem_default() * 1.5 / MiB, found
    assert found["queued_mib"] < 256, found
    assert found["tcp"] == "Address family not supported by protocol", found
    assert found["datagram"] == found["listener"] == denied, found


def wmem_default():
    with open("/proc/sys/net/core/wmem_default") as f:
        return int(f.read())


@needs_sandbox
def test_with_the_opt_in_a_proposer_with_a_network_is_refused(no_cgroup, search, tmp_path):
    """Refused by meta_harness.check_proposer, which whale.py and meta_harness.py call before any model loads, and
    again by the proposer's own start."""
    no_cgroup.setenv(switches.WEAK_BOUNDS, "1")
    refusal = r"proposer command with network endpoint: under --allow-weak-bounds"
    with pytest.raises(SandboxError, match=refusal):
        mh.check_proposer(make_args(proposer="command", proposer_cmd="agent {workdir}",
                                    proposer_allow_host=["127.0.0.1:9"]))
    with pytest.raises(SandboxError, match=refusal):
        search("files", proposer_allow_host=["127.0.0.1:9"])
    assert not list((tmp_path / "run" / "candidates").glob("h1_*"))  # nothing proposed


TOOL_SOCKETS = r"""
import socket
queued, refused = 0, None


def fill(s):
    global queued, refused
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 << 20)
    except OSError as e:
        refused = e.strerror
    s.setblocking(False)
    try:
        while True:
            queued += s.send(b"x" * 65536)
    except BlockingIOError:
        pass


carrier, far = socket.socketpair()
carrier.setblocking(False)  # full: the in-flight round ends
for round in range(2):  # pairs until out of descriptors; then in flight through carrier, and again
    pairs = []
    try:
        while True:
            pairs.append(socket.socketpair())
            fill(pairs[-1][0])
            fill(pairs[-1][1])
    except OSError:
        pass
    for a, b in pairs if round == 0 else ():
        try:
            socket.send_fds(carrier, [b"."], [a.fileno(), b.fileno()])
        except OSError:
            break
        a.close()
        b.close()
try:  # a listener: up to somaxconn connections nobody accepted, each with what its closed client sent
    socket.socket(socket.AF_UNIX).listen(4096)
except OSError as e:
    refused += ", " + e.strerror
try:
    socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
except OSError as e:
    refused += ", " + e.strerror
print(queued >> 20, refused)
"""


@needs_sandbox
def test_with_the_opt_in_the_python_tools_sockets_queue_what_the_table_says(no_cgroup):
    # 64 descriptors and as many in flight, each socket at wmem_default: 25 MiB measured (910 MiB with SO_SNDBUF)
    no_cgroup.setenv(switches.WEAK_BOUNDS, "1")
    queued, refused = python_tool.run_python(TOOL_SOCKETS, timeout_s=30).split(maxsplit=1)
    assert refused.strip() == ", ".join(["Operation not permitted"] * 3)  # SO_SNDBUF, listen, SOCK_DGRAM
    assert int(queued) <= 2 * sandbox.SANDBOX_OPEN_FILES * wmem_default() * 1.5 / MiB
