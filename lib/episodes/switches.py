"""
The sandbox's two switches and the refusal that names each: environment variables, so every subprocess sees them (the
CLIs' --unsafe-no-sandbox and --allow-weak-bounds set them: sandbox.apply_args). It bounds nothing itself; it is the
bottom of the sandbox's files (sandbox.py, seccomp.py, cgroups.py and python_tool.py read it, it reads none of them).

    from lib.common.errors import SandboxError
    from lib.episodes.switches import disabled, unavailable
    if disabled(): ...                                       # WHALE_UNSAFE_NO_SANDBOX=1: no OS sandbox at all
    raise SandboxError(unavailable("no bwrap binary"))       # one line naming that opt-out

OPT_OUT (WHALE_UNSAFE_NO_SANDBOX=1) turns every bound off: sandbox.wrap runs the command with `env -i` alone,
seccomp.no_fork_filter hands over an empty program, cgroups.cgroup_parents is empty; unavailable(why) is the refusal,
wherever the sandbox cannot start, that names it. WEAK_BOUNDS (WHALE_ALLOW_WEAK_BOUNDS=1) accepts per-process limits
where this process can make no cgroup; NO_CGROUP is the refusal that names it (sandbox.check). A run whose proposer
writes no code (the built-in `mutate`, or none: its harness files are the project's own, mutated by the project's own
code) gets them without asking: sandbox.apply_args sets WEAK_BOUNDS to BUILTIN for it, and to nothing for a proposer
in WRITES_CODE, whose files are the untrusted code a cgroup exists for (docs/design.md, what the boundary bounds).
"""
import os

OPT_OUT = "WHALE_UNSAFE_NO_SANDBOX"
WEAK_BOUNDS = "WHALE_ALLOW_WEAK_BOUNDS"  # no cgroup: per-process limits instead (memory_bound() says which)
BUILTIN = "builtin"  # WEAK_BOUNDS's value for a run whose proposer writes no code (set by sandbox.apply_args)
WRITES_CODE = ("claude", "openai", "command")  # the proposers whose harness files are untrusted code


def disabled():
    return os.environ.get(OPT_OUT) == "1"


def weak_bounds_allowed():
    return os.environ.get(WEAK_BOUNDS) in ("1", BUILTIN)


def builtin_code_only():
    """The per-process limits hold because the run's proposer writes no code, not because the user accepted them."""
    return os.environ.get(WEAK_BOUNDS) == BUILTIN


def unavailable(why):
    return (f"the OS sandbox for harness code cannot start here ({why}). Harness code, the python tool and "
            f"proposers run only inside it. Allow unprivileged user namespaces (e.g. sysctl "
            f"kernel.unprivileged_userns_clone=1 or kernel.apparmor_restrict_unprivileged_userns=0), or, at your "
            f"own risk, rerun with --unsafe-no-sandbox ({OPT_OUT}=1)")


NO_CGROUP = ("this process can make no cgroup with the memory and pids controllers, so the kernel cannot bound a "
             "sandbox's memory (shared memory, tmpfs, socket buffers) and processes as a whole. Get a delegated one "
             "(README, 'A cgroup of your own': systemd-run --user --scope -p Delegate=yes ...), or accept per-process "
             f"limits with --allow-weak-bounds ({WEAK_BOUNDS}=1; docs/design.md says which bounds hold then), as "
             "a run with the built-in proposer (mutate), which writes no code, does by itself")
