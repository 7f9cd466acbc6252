"""
A sandbox's memory and tasks as a whole: one bound for everything a sandbox holds, the kernel's own accounting in a
cgroup of its own (memory: anonymous, SysV shared memory, tmpfs pages, socket buffers and the kernel's memory for it,
no swap; tasks: every process and thread), which no process's RLIMIT_AS sees.

    from lib.episodes import cgroups
    cgroup = cgroups.Cgroup(memory_bytes + cgroups.CGROUP_SLACK_BYTES, max_tasks)
    argv = sandbox.wrap(argv, cgroup=cgroup)                 # the sandbox starts inside it, from its first instruction
    cgroup.events()                                          # {'oom_kill': n, 'pids_max': n}: what killed or refused it
    cgroup.close()                                           # kills what is left in it, removes it

cgroup_parents() finds where this process can make one (v2 where memory and pids are delegated to it, else the v1
memory and pids hierarchies), by making and removing a child. Where it can make none (most laptops), every Cgroup
does nothing: sandbox.check() stops a run whose proposer writes code unless WHALE_ALLOW_WEAK_BOUNDS=1 (per-process
limits instead; a run with the built-in proposer takes them by itself, sandbox.apply_args), and
memory_bound() says which bound holds on this host. Callers reach cgroup_parents through the module (a test swaps
it for a host without one).
"""
import itertools
import os
import shlex
import signal
import sys
import time
from functools import lru_cache

from lib.episodes.switches import builtin_code_only, disabled

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
    if builtin_code_only():  # the line a run with mutate prints where it gets no cgroup: which bounds, the fix
        return ("no writable cgroup (the built-in proposer writes no code, so the harness files are the project's "
                "own): per-process limits: harness workers and the python tool RLIMIT_AS, RLIMIT_NOFILE and "
                "RLIMIT_NPROC, the filter's IPC and socket denials, a read-only /tmp; the kernel's bound on their "
                "memory and processes as a whole needs a delegated cgroup (README, 'A cgroup of your own')")
    return ("no writable cgroup (--allow-weak-bounds): per-process limits: harness workers and the python tool "
            "RLIMIT_AS, RLIMIT_NOFILE and RLIMIT_NPROC, the filter's IPC and socket denials, a read-only /tmp; "
            "proposers RLIMIT_AS, RLIMIT_NOFILE and RLIMIT_NPROC, no shared memory, socket buffer size nor "
            "network, a tmpfs of a size and an inode count for their folder, /tmp and /dev/shm")


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
