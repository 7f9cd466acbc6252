"""
The kernel calls a sandbox may make: seccomp filters (libseccomp through pyseccomp) that bwrap installs before the
command's first instruction.

    from lib.episodes.seccomp import no_fork_filter, PROPOSER_FAMILIES
    fd = no_fork_filter()                                    # a harness worker: one process, no socket
    fd = no_fork_filter(no_fork=False, families=PROPOSER_FAMILIES)   # a proposer: may start processes
    argv = sandbox.wrap(argv, seccomp_fd=fd)                 # fd in Popen's pass_fds; close it after the start

Every filter denies the kernel surface no harness needs (DENIED_CALLS: ptrace, io_uring, keyctl, bpf, mounts,
namespaces, ...: EPERM, and a clone that asks for a namespace) and every socket family the sandbox does not use
(EAFNOSUPPORT; WORKER_FAMILIES: none; TOOL_FAMILIES; PROPOSER_FAMILIES; HOST_NET_FAMILIES). The no-fork filter, under
which sandbox.start_one_process starts every harness worker and the python tool, refuses fork, vfork and clone without
CLONE_THREAD, so each is one process while threads still work, and the calls whose bounds RLIMIT_AS and the user's
counts would not see: IPC_CALLS (memory outside any address space) and NOTIFY_CALLS (inotify instances), and
the socket calls whose memory no descriptor count bounds (BUFFER_OPTIONS, listen, socket types other than
SOCK_STREAM). A proposer under weak bounds (no cgroup counts its memory: weak=True) gets those socket denials and
IPC_CALLS too, every shared mapping refused (MAP_SHARED), and AF_UNIX only (WEAK_PROPOSER_FAMILIES).
"""
import errno
import os
import socket
import tempfile
from functools import lru_cache

from lib.common.errors import SandboxError
from lib.episodes.switches import disabled, unavailable

CLONE_THREAD = 0x10000
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
# denied to harness workers and the python tool, whose RLIMIT_AS would not see it. Proposers keep them where a
# cgroup counts them; under weak bounds (no cgroup) they are denied too, with shared mappings (below).
IPC_CALLS = ("shmget", "shmat", "msgget", "semget", "memfd_create", "memfd_secret")
# mmap's MAP_SHARED bit (MAP_SHARED_VALIDATE has it too): a shared anonymous mapping, or a shared one of /dev/zero,
# is shared memory, which a proposer under weak bounds gets none of, as workers and the tool get none (its
# RLIMIT_AS would count it only per process). Denied whatever the file (a filter cannot tell /dev/zero from a
# file; a tmpfs file's pages are bounded by its size anyway): programs that map files shared fall back to read().
MAP_SHARED = 0x01
# A socket's buffer sizes: SO_SNDBUF and SO_RCVBUF go up to twice net.core.wmem_max / rmem_max (8 MiB each here),
# the FORCE forms past them. Denied to the python tool and to a proposer under weak bounds, so each socket keeps
# net.core.wmem_default (208 KiB here): what bounds the bytes their descriptors can queue where no cgroup counts
# socket memory. (level SOL_SOCKET = 1; SO_SNDBUF 7, SO_RCVBUF 8, SO_SNDBUFFORCE 32, SO_RCVBUFFORCE 33)
SOL_SOCKET = 1
INT_BITS = 0xFFFFFFFF
# The same sandboxes open stream sockets only, and listen on none: a unix listener queues up to somaxconn
# connections not yet accepted, each holding what its client sent before it closed (910 MiB on one listener here,
# no descriptor of the sandbox's own counting them), and a datagram socket queues what any sender sent it. Stream
# socket pairs (asyncio's wake-up, a parent and its child) are all they keep.
SOCK_STREAM, SOCK_TYPE_BITS = 1, 0xF
BUFFER_OPTIONS = (7, 8, 32, 33)
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
# a proposer under weak bounds (no network, see proposers.refuse_weak_network): AF_UNIX only, whose buffers keep
# wmem_default; a TCP socket's grow by themselves to tcp_wmem and tcp_rmem (7.5 MiB a loopback connection here)
WEAK_PROPOSER_FAMILIES = (socket.AF_UNIX,)
HOST_NET_FAMILIES = PROPOSER_FAMILIES + (socket.AF_NETLINK,)
AF_LIMIT = 64  # above every family Linux has (46 in 6.x): a larger domain argument is refused whatever it is
# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET
CLONE_NAMESPACES = (0x20000, 0x2000000, 0x4000000, 0x8000000, 0x10000000, 0x20000000, 0x40000000)


@lru_cache(maxsize=8)
def filter_program(no_fork=True, families=WORKER_FAMILIES, weak=False):
    """A compiled seccomp filter. Every filter: DENIED_CALLS fail with EPERM, and so does a clone that asks for a
    namespace; socket() and socketpair() only for `families`. no_fork (harness workers, the python tool):
    IPC_CALLS and NOTIFY_CALLS too, setsockopt of BUFFER_OPTIONS, listen, sockets of a type other than
    SOCK_STREAM, and fork, vfork and clone without CLONE_THREAD fail with EPERM; clone3 says ENOSYS, so the C library falls back to clone and threads still
    start. (exec stays allowed: bwrap execs the command under the filter, and an exec only replaces the one
    process, rlimits and all.) weak (a proposer where no cgroup counts its memory): IPC_CALLS, mmap with
    MAP_SHARED, setsockopt of BUFFER_OPTIONS, listen and sockets other than SOCK_STREAM fail with EPERM."""
    try:
        import pyseccomp as seccomp
        rules = seccomp.SyscallFilter(seccomp.ALLOW)
        for call in DENIED_CALLS + (IPC_CALLS + NOTIFY_CALLS if no_fork else IPC_CALLS if weak else ()):
            rules.add_rule(seccomp.ERRNO(errno.EPERM), call)
        if no_fork or weak:
            for option in BUFFER_OPTIONS:  # level and name are ints: the kernel reads the low 32 bits only
                rules.add_rule(seccomp.ERRNO(errno.EPERM), "setsockopt",
                               seccomp.Arg(1, seccomp.MASKED_EQ, INT_BITS, SOL_SOCKET),
                               seccomp.Arg(2, seccomp.MASKED_EQ, INT_BITS, option))
            rules.add_rule(seccomp.ERRNO(errno.EPERM), "listen")
            for call in ("socket", "socketpair") if socket.AF_UNIX in families else ():  # the type's low 4 bits
                for kind in sorted(set(range(SOCK_TYPE_BITS + 1)) - {SOCK_STREAM}):  # (the rest: NONBLOCK, CLOEXEC)
                    rules.add_rule(seccomp.ERRNO(errno.EPERM), call, seccomp.Arg(0, seccomp.EQ, socket.AF_UNIX),
                                   seccomp.Arg(1, seccomp.MASKED_EQ, SOCK_TYPE_BITS, kind))
        if weak:
            rules.add_rule(seccomp.ERRNO(errno.EPERM), "mmap", seccomp.Arg(3, seccomp.MASKED_EQ, MAP_SHARED,
                                                                           MAP_SHARED))
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


def no_fork_filter(no_fork=True, families=WORKER_FAMILIES, weak=False):
    """A fresh pipe's read end holding the filter, for wrap(seccomp_fd=...): bwrap reads it once at start.
    no_fork=False: the filter for proposers (DENIED_CALLS only; they may start processes). families: the socket
    families it may open (WORKER_FAMILIES, TOOL_FAMILIES, PROPOSER_FAMILIES, WEAK_PROPOSER_FAMILIES). weak: a
    proposer's filter where no cgroup counts its memory (filter_program)."""
    program = b"" if disabled() else filter_program(no_fork, tuple(families), weak)
    r, w = os.pipe()
    os.write(w, program)  # a few hundred bytes: fits the pipe's buffer
    os.close(w)
    return r
