"""
The python tool (math's tools.python): the model's own code, one process in a fresh sandbox under the no-fork filter
(AF_UNIX stream sockets only, no listener, each at its default buffer: TOOL_FAMILIES), bounded in CPU time, memory (its own cgroup, and RLIMIT_AS), output
(RLIMIT_FSIZE on a file, then cut at max_chars), open files, tasks and wall time; a fresh sandbox per call, so
nothing carries over.

    from lib.episodes.python_tool import run_python
    run_python(code, timeout_s=10)                           # stdout+stderr, cut; a limit it hit said at the end

A sandbox or cgroup that cannot be made raises InfrastructureError (lib/common/errors.py): the machine's failure, not the code's.
"""
import subprocess
import tempfile

from lib.episodes import cgroups
from lib.common.errors import InfrastructureError
from lib.episodes.sandbox import SANDBOX_OPEN_FILES, kill, python, start_one_process
from lib.episodes.seccomp import TOOL_FAMILIES
from lib.episodes.switches import disabled

PYTHON_TIMEOUT_S = 30.0
PYTHON_MEMORY_BYTES = 1 << 30
PYTHON_MAX_OUTPUT_BYTES = 1 << 20
PYTHON_TASKS = 64  # threads (OpenBLAS, the interpreter's) of the tool's sandbox, bwrap included
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
    weak = not cgroups.cgroup_parents() and not disabled()  # no cgroup counts its tasks nor /tmp's inodes: rlimits
    # and a read-only /tmp instead
    limits = [str(cpu_s), str(memory_bytes), str(PYTHON_MAX_OUTPUT_BYTES), str(SANDBOX_OPEN_FILES),
              str(PYTHON_TASKS if weak else 0)]
    # output goes to a file whose size the child may not push past the limit, never into our memory
    with tempfile.TemporaryFile() as out:
        try:
            # shared memory, /tmp: counted too
            cgroup = cgroups.Cgroup(memory_bytes + cgroups.CGROUP_SLACK_BYTES, PYTHON_TASKS)
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
