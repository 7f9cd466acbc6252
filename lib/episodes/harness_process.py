"""
The harness worker: ONE episode of untrusted harness code, inside the OS sandbox, then the process ends.

    python -I -S lib/episodes/harness_process.py RFD WFD
        (lib/episodes/worker_pool.py's Worker starts it in the sandbox; never by hand)

lib/episodes/worker_pool.py starts each worker inside bubblewrap under the no-fork seccomp filter
(lib/episodes/sandbox.py), before any episode needs it, so a warm one is waiting when an episode starts. Only this file
is bound into the sandbox, so it imports the standard library only, nothing from the project (and -I keeps the project's
folders off sys.path). The worker says {"ready": true}, then reads one job: the
harness source, its path, the tool names, the task (only what the agent may see), the seed of the harness's
`random`, its memory limit and the size limits. It sets the limits, then runs `run(task, llm, tools)`:
llm() and every tool call is a JSON line to the parent on the WFD pipe, answered on the RFD pipe with
{"value": ...} or {"raise": name, "message": ...}; the episode ends with {"done": result, "stdout": ...}
or {"error": traceback, "stdout": ...}, and the parent kills the sandbox.

What keeps answers safe is not in this file: the sandbox shows this process no project folder, no data, no
other process and no network, and the parent holds the answers and the tools' hidden state and checks every
request it reads. The checks here (argument types, the import list, the audit hook) are a courtesy: a
harness author gets a clear error early. Harness code can undo them, and gains nothing by it.
"""
import builtins
import io
import json
import os
import resource
import sys

inp, out = os.fdopen(int(sys.argv[1]), "rb"), os.fdopen(int(sys.argv[2]), "wb")


def send(msg):
    out.write(json.dumps(msg).encode() + b"\n")
    out.flush()


def recv():
    line = inp.readline()
    if not line:
        os._exit(0)
    return json.loads(line)


class Capped(io.TextIOBase):
    """stdout/stderr of the harness: keeps the first `keep` characters, counts the rest; O(1) per write, so
    50,000 print() calls cost what 50,000 appends cost."""

    def __init__(self, keep):
        self.keep, self.kept, self.size, self.dropped = keep, [], 0, 0

    def write(self, s):
        s = str(s)
        room = self.keep - self.size
        if room > 0:
            self.kept.append(s[:room])
            self.size += len(self.kept[-1])
        self.dropped += max(len(s) - max(room, 0), 0)
        return len(s)

    def text(self):
        return "".join(self.kept) + (f"\n[... {self.dropped} more characters dropped]" if self.dropped else "")


def set_limits(memory_bytes, open_files, tasks):
    """Before any harness code: the memory limit (soft = hard, which a process without capabilities cannot
    raise), no file writes, no core files, `open_files` descriptors (what bounds the bytes it can queue in pipes),
    and where no cgroup counts its threads, `tasks` of them (RLIMIT_NPROC, counted in the sandbox's own user
    namespace)."""
    limits = [(resource.RLIMIT_AS, memory_bytes), (resource.RLIMIT_FSIZE, 0), (resource.RLIMIT_CORE, 0),
              (resource.RLIMIT_NOFILE, open_files)] + ([(resource.RLIMIT_NPROC, tasks)] if tasks else [])
    for lim, val in limits:
        resource.setrlimit(lim, (val, val))


BLOCKED = ("open", "os.", "subprocess.", "socket.", "ctypes.", "_posixsubprocess", "pty.", "mmap.", "shutil.",
           "glob.", "sqlite3.", "urllib.", "http.", "webbrowser.", "fcntl.", "resource.", "sys.addaudithook")


STDLIB = os.path.dirname(os.__file__) + os.sep  # the allowed modules load from here when first imported


def audit(event, args):
    if event in ("open", "os.listdir", "os.scandir") and str(args[0]).startswith(STDLIB) and args[1:2] in (
            ("r",), ("rb",), ()):
        return  # the import system reading the standard library
    if event.startswith(BLOCKED):
        raise PermissionError(f"sandbox: {event} is not allowed in a harness")


def import_guard(allowed):
    real_import = builtins.__import__

    def harness_import(name, globals=None, locals=None, fromlist=(), level=0):
        if level or name.split(".")[0] not in allowed:
            raise ImportError(f"a harness may import only {', '.join(sorted(allowed))}, not {name!r}")
        return real_import(name, globals, locals, fromlist, level)
    return harness_import


def call(msg):
    send(msg)
    reply = recv()
    if "raise" in reply:
        exc = getattr(builtins, reply["raise"], None)
        exc = exc if isinstance(exc, type) and issubclass(exc, Exception) else RuntimeError
        raise exc(reply["message"])
    return reply["value"]


def make_llm(max_chars):
    def llm(messages, tools=None, max_tokens=None, stop=None):
        """One chat completion from the policy; it ends at the first stop string, kept as the reply's end.
        messages: [{"role": system|user|assistant|tool, "content": str}] ("tool": a tool's result; an assistant
        turn that called a tool keeps the text the model wrote). tools: None or a list of OpenAI-style function
        schemas, which the model's chat template renders into the prompt (its native tool format); the reply is
        the raw text, tool calls included, for the harness to parse. stop: None, a string, or a list of at most
        4 non-empty strings of at most 32 characters. Once the episode's token budget is spent, the reply is ''."""
        if not isinstance(messages, list) or not all(isinstance(m, dict) and m.get("role") in ("system", "user",
                "assistant", "tool") and isinstance(m.get("content"), str) for m in messages):
            raise TypeError("llm(messages): messages must be a list of {'role': system|user|assistant|tool, "
                            "'content': str}")
        if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
            raise TypeError("llm(tools=...) must be None or a list of function schemas {'type': 'function', "
                            "'function': {'name': ..., 'parameters': ...}} (max_tokens is a keyword argument)")
        if max_tokens is not None and (type(max_tokens) is not int or max_tokens < 1):
            raise TypeError("llm(max_tokens=...) must be a positive int")
        stop = [stop] if isinstance(stop, str) else stop
        if stop is not None and not (isinstance(stop, list) and len(stop) <= 4 and all(
                isinstance(s, str) and 1 <= len(s) <= 32 for s in stop)):
            raise TypeError("llm(stop=...) must be None, a string or a list of at most 4 non-empty strings of "
                            "at most 32 characters")
        messages = [{"role": m["role"], "content": m["content"][:max_chars]} for m in messages]
        request = {"llm": messages, "max_tokens": max_tokens, "stop": stop or None}
        if tools:
            request["tools"] = tools
        return call(request)
    return llm


class Tools:
    def __init__(self, methods):
        self._methods = methods

    def __getattr__(self, name):
        if name.startswith("_") or name not in self._methods:
            raise AttributeError(f"tools has no method {name!r}; it has {', '.join(self._methods)}")

        def method(*args, **kwargs):
            try:
                json.dumps([args, kwargs])
            except (TypeError, ValueError):
                raise TypeError(f"tools.{name}: arguments must be JSON values") from None
            return call({"tool": name, "args": args, "kwargs": kwargs})
        return method


def format_error(path, source):
    """The traceback with the harness's own lines shown (imported only now: most episodes never need it)."""
    import linecache
    import traceback
    linecache.cache[path] = (len(source), None, source.splitlines(True), path)
    return traceback.format_exc()


def main():
    send({"ready": True})
    job = recv()
    set_limits(job["memory_bytes"], job["open_files"], job["tasks"])
    capped = Capped(job["stdout_keep"])
    sys.stdout = sys.stderr = sys.__stdout__ = sys.__stderr__ = capped
    sys.stdin = None
    path, source = job["path"], job["source"]
    safe_builtins = dict(builtins.__dict__, __import__=import_guard(set(job["allowed"])))
    for name in ("open", "input", "breakpoint", "exit", "quit"):
        safe_builtins.pop(name, None)
    import random  # seeded before the harness runs, so its draws depend on the episode's seed only
    random.seed(job["seed"])
    sys.addaudithook(audit)
    try:
        ns = {"__name__": "harness", "__file__": path, "__builtins__": safe_builtins}
        exec(compile(source, path, "exec"), ns)
        result = ns["run"](job["task"], make_llm(job["max_chars"]), Tools(job["methods"]))
        line = json.dumps({"done": result, "stdout": capped.text()})
        if len(line) > job["max_line"]:
            raise ValueError(f"run() returned {len(line)} characters of JSON; the limit is {job['max_line']}")
        out.write(line.encode() + b"\n")
        out.flush()
    except BaseException:
        send({"error": format_error(path, source)[-job["max_chars"]:], "stdout": capped.text()})
    os._exit(0)  # no interpreter shutdown: a harness thread or atexit hook gets no further turn


if __name__ == "__main__":
    main()
