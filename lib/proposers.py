"""The proposers that write new candidates from the archive: the instructions they get, the fresh candidate
folders (a copy of the parent to edit), and the untrusted ones' confinement. An untrusted proposer (the
agent CLIs `command` and `claude` here, `openai` in lib/openai_proposer.py) never works in the run folder:
propose_in_copy gives it a copy of the harness-set material in a fresh folder and takes back only each new
candidate's harness.py (size-capped, no symlinks), its parent / hypothesis / axis / changed as short text,
and notes.md. The agent CLIs run in the OS sandbox (lib/episodes/sandbox.py), where that folder is a file system of
its own (a tmpfs of --proposer-max-written-mb beside the archive copy: the kernel refuses what goes past it), filled
from the copy before the command starts; only the files the search takes come back out (FOLDER, HandBack)."""

import inspect
import json
import os
import resource
import shlex
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from lib.episodes import cgroups, sandbox, seccomp, switches
from lib.episodes.egress import Egress, through_egress
from lib.archive import log_cost
from lib.briefs import BRIEFS, INSTRUCTIONS, NULL_RULES, llm_interface
from lib.contract import ALLOWED_IMPORTS, MAX_HARNESS_CHARS
from lib.common.json_files import read_json, write_json
from lib.common.errors import SandboxError
from lib.common.text import valid_text

PROJECT = Path(__file__).resolve().parent.parent  # the repository, denied to the claude proposer by name
# what a proposer sees (a copy) and what the search takes back from it (capped)
ARCHIVE_FILES = ("summary.jsonl", "frontier.json", "notes.md", "setup.json")
CANDIDATE_FILES = ("harness.py", "meta.json", "scores.json", "traces.jsonl")
MAX_HARNESS_BYTES = 4 * MAX_HARNESS_CHARS  # utf-8: up to 4 bytes a character
MAX_META_BYTES = 64_000
MAX_FIELD_CHARS = 2_000  # hypothesis, changed
MAX_NOTES_CHARS = 200_000
MAX_OUTPUT_BYTES = 8_000_000  # a proposer's stdout / stderr kept
# a proposer's bounds (their flags: meta_harness.py): memory and processes of its whole sandbox, any one file,
# everything it writes; an agent CLI on node needs a few GiB
PROPOSER_MEMORY_MB = 8192
PROPOSER_MAX_PROCS = 512
PROPOSER_MAX_FILE_MB = 64
PROPOSER_MAX_WRITTEN_MB = 1024
# Only where no cgroup counts a proposer (--allow-weak-bounds), each a bound the kernel keeps per process or per
# file system: new files and folders in its folder (~1 KiB of kernel memory each), and in /tmp and in /dev/shm each
# (the nr_inodes of tmpfs mounted by MOUNT); its open files (RLIMIT_NOFILE: what bounds the bytes its unix
# sockets can queue, each at net.core.wmem_default since the filter refuses SO_SNDBUF; macOS's own default too)
PROPOSER_MAX_FILES = 65_536
PROPOSER_TMP_FILES = 4_096
PROPOSER_OPEN_FILES = 256
# Claude Code: file tools only (no shell, no web); the variables its login may come from
CLAUDE_TOOLS = "Read,Write,Edit,Glob,Grep"
CLAUDE_ENV = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL", "CLAUDE_CODE_OAUTH_TOKEN")


# -----------------------------------------------------------------------------
# what every proposer gets: the instructions (their text: lib/briefs.py), and fresh candidate folders to fill

def write_instructions(run_dir, domain, names, parent, iteration, cfg):
    example = domain.public(domain.load("harness")[0])
    prompt_only = ("\n- PROMPT-ONLY RUN: change only string constants (prompts, formats); any other change "
                   "to the code is rejected.") if cfg.prompt_only else ""
    text = INSTRUCTIONS.format(domain=domain.name, public_keys=", ".join(f"`{k}`" for k in example),
                               tool_methods=", ".join(f"`{m}`" for m in domain.TOOL_METHODS),
                               allowed=", ".join(ALLOWED_IMPORTS), caps=domain.CAPS, domain_brief=domain.BRIEF,
                               scoring=domain.scoring_brief(), skill_rules=domain.SKILL_RULES,
                               notes_rule=domain.NOTES_RULE, hypothesis_rule=domain.HYPOTHESIS_RULE,
                               axis_rule=domain.AXIS_RULE,
                               prompt_only=prompt_only, llm_interface=llm_interface(), **BRIEFS[cfg.proposer_brief],
                               null_rule=NULL_RULES[cfg.null_check].format(margin=cfg.null_margin),
                               iteration=iteration,
                               parent=parent, targets=", ".join(f"`candidates/{n}/harness.py`" for n in names))
    path = Path(run_dir) / "INSTRUCTIONS.md"
    path.write_text(text)
    return path


def prepare(run_dir, names, parent, iteration, proposer):
    """Fresh folders for the new candidates: a copy of the parent and a meta.json to fill in."""
    for name in names:
        d = Path(run_dir) / "candidates" / name
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        shutil.copy(Path(run_dir) / "candidates" / parent / "harness.py", d / "harness.py")
        write_json(d / "meta.json", {"parent": parent, "hypothesis": "", "axis": "", "changed": "",
                                     "proposer": proposer, "iteration": iteration, "proposed": False, "valid": None,
                                     "reason": None})


def finish(run_dir, name, **fields):
    d = Path(run_dir) / "candidates" / name
    meta = read_json(d / "meta.json", {})
    meta.update(fields, proposed=True)
    write_json(d / "meta.json", meta)


# -----------------------------------------------------------------------------
# untrusted proposers (command, claude, openai) work on a copy; the search takes back only harness.py files

class ProposalFailed(Exception):
    """A proposer call that produced nothing usable (its error message); the iteration is asked again."""


def propose_in_copy(run_dir, names, rows, parent, iteration, domain, cfg, ask):
    """Ask the proposer for `names` in a fresh copy of the archive outside the run folder, then take back only
    the new candidates' harness.py files and text fields. ask(work, scratch) is the proposer's call: it fills
    the candidate folders of `work` (each a copy of `parent`, the archive best), or a copy of `work` in its
    sandbox and returns what that sandbox handed back (HandBack), or raises ProposalFailed.
    Returns None, or the proposer's error message."""
    scratch = Path(tempfile.mkdtemp(prefix="whale-proposer-"))  # holds the copy, the proposer's output, settings
    work = scratch / "archive"
    try:
        copy_archive(run_dir, work, rows)
        prepare(work, names, parent, iteration, cfg.proposer)
        write_instructions(work, domain, names, parent, iteration, cfg)
        shutil.copyfile(work / "INSTRUCTIONS.md", run_dir / "INSTRUCTIONS.md")  # for the record
        try:
            handed = ask(work, scratch)
        except ProposalFailed as e:
            return valid_text(str(e))  # what a CLI or a server said: printed and kept
        take_candidates(work, handed, run_dir, names, parent, iteration, cfg.proposer)
        take_notes(work, handed, run_dir)
        return None
    finally:
        remove_tree(scratch)


def copy_archive(run_dir, work, rows):
    """The proposer's view: harness-set material only (no evals, metrics or anything of the test split)."""
    (work / "candidates").mkdir(parents=True)
    for name in ARCHIVE_FILES:
        if (run_dir / name).is_file():
            shutil.copyfile(run_dir / name, work / name)
    for r in rows:
        src, dst = run_dir / "candidates" / r["name"], work / "candidates" / r["name"]
        dst.mkdir()
        for name in CANDIDATE_FILES:
            if (src / name).is_file():
                shutil.copyfile(src / name, dst / name)


def taken_files(names):
    """[(path, byte cap)] of every file the search takes from a proposer's folder."""
    return [(f"candidates/{name}/{file}", cap) for name in names
            for file, cap in (("harness.py", MAX_HARNESS_BYTES), ("meta.json", MAX_META_BYTES))] + \
        [("notes.md", 4 * MAX_NOTES_CHARS)]


def read_left(work, handed, rel, limit):
    """What the proposer left at rel: from what its sandbox handed back ({rel: line}, HandBack), or, where
    nothing was handed (None: the openai proposer, --unsafe-no-sandbox), from `work` as read_untrusted reads it."""
    if handed is None:
        return read_untrusted(work, rel, limit)
    line = handed.get(rel, {})
    if "text" in line:
        try:
            size = len(line["text"].encode("utf-8"))
        except UnicodeEncodeError:  # a lone surrogate: JSON can say it, a file cannot hold it
            raise ValueError(f"{rel}: not utf-8 text") from None
        if size > limit:
            raise ValueError(f"too large: {rel} has more than {limit} bytes")
        return line["text"]
    if "error" in line:
        raise ValueError(line["error"][:300].encode("utf-8", "replace").decode("utf-8"))
    raise FileNotFoundError(rel)


def take_candidates(work, handed, run_dir, names, parent, iteration, proposer):
    """Each asked-for candidate's harness.py and text fields go into the archive, with our own bookkeeping;
    scores, validity and every other file the proposer wrote stay behind."""
    for name in names:
        rel = f"candidates/{name}/harness.py"
        try:
            source, reason = read_left(work, handed, rel, MAX_HARNESS_BYTES), None
        except FileNotFoundError:
            source, reason = None, None  # validate() says "no code"
        except ValueError as e:
            source, reason = None, str(e)
        except OSError as e:  # e.g. its folder replaced by a file
            source, reason = None, f"{rel}: {e.strerror}"
        fields = untrusted_fields(work, handed, name)
        d = run_dir / "candidates" / name
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        if source is not None:
            (d / "harness.py").write_text(source)
        write_json(d / "meta.json", {"parent": fields.get("parent") or parent,
                                     "hypothesis": fields.get("hypothesis", ""), "axis": fields.get("axis", ""),
                                     "changed": fields.get("changed", ""),
                                     "proposer": proposer, "iteration": iteration, "proposed": True,
                                     "valid": None if reason is None else False, "reason": reason})


def untrusted_fields(work, handed, name):
    """parent / hypothesis / axis / changed from the proposer's meta.json, as short strings (anything else: absent)."""
    try:
        meta = json.loads(read_left(work, handed, f"candidates/{name}/meta.json", MAX_META_BYTES))
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(meta, dict):
        return {}
    caps = {"parent": 100, "hypothesis": MAX_FIELD_CHARS, "axis": 100, "changed": MAX_FIELD_CHARS}
    return {k: valid_text(meta[k]).strip()[:cap] for k, cap in caps.items() if isinstance(meta.get(k), str)}


def take_notes(work, handed, run_dir):
    try:
        notes = read_left(work, handed, "notes.md", 4 * MAX_NOTES_CHARS)
    except (OSError, ValueError):
        return
    (run_dir / "notes.md").write_text(notes[-MAX_NOTES_CHARS:])  # the newest sections are at the end


def read_untrusted(root, rel, limit):
    """The text of a file a proposer wrote under root: a regular file reached without symlinks, at most
    `limit` bytes, utf-8. Raises FileNotFoundError when absent, ValueError naming what is wrong."""
    path = root
    for part in Path(rel).parts:
        path = path / part
        mode = os.lstat(path).st_mode
        if stat.S_ISLNK(mode):
            raise ValueError(f"{rel}: {path.relative_to(root)} is a symlink (never followed)")
    if not stat.S_ISREG(mode):
        raise ValueError(f"{rel}: not a regular file")
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with open(fd, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"too large: {rel} has more than {limit} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{rel}: not utf-8 text") from None


def remove_tree(path):
    """Remove the folder at path whatever its shape: any depth (a loop, never recursion, one folder open at a
    time, by descriptor, so no path grows past the kernel's limit), folders a proposer made unreadable (chmod 000)
    unlocked first; symlinks are removed, never followed. Best effort: what cannot be removed stays."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        try:
            os.unlink(path)  # a file or symlink where the folder was
        except OSError:
            pass
        return
    names = []  # the folders entered below path
    while True:
        child = None
        try:
            with os.scandir(fd) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        child = entry.name
                        break
                    os.unlink(entry.name, dir_fd=fd)
        except OSError:
            pass
        if child is not None:
            try:
                os.chmod(child, 0o700, dir_fd=fd)
                inner = os.open(child, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError:  # cannot enter it: leave it, and move on to the next one
                inner = None
            if inner is not None:
                os.close(fd)
                fd = inner
                names.append(child)
                continue
        if not names:
            break
        parent = os.open("..", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = parent
        try:
            os.rmdir(names.pop(), dir_fd=fd)
        except OSError:
            break  # a folder that cannot go (it would be entered again): stop here
    os.close(fd)
    try:
        os.rmdir(path)
    except OSError:
        pass


def run_in_sandbox(argv, cwd, out_dir, timeout, limits=None, cgroup=None, pass_fds=()):
    """Run a proposer in its own session; its output goes to files, so a child that keeps stdout open cannot
    hang the search. On timeout, or past a bound of `limits` (Limits), the sandbox dies and this returns once
    every process of it is gone. -> (rc, "timeout" or a bound's one-line reason, stdout, stderr)"""
    limits = limits or Limits()
    with open(out_dir / "stdout", "wb") as out, open(out_dir / "stderr", "wb") as err:
        proc = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                start_new_session=True, env={},  # env={}: see sandbox.start_one_process
                                preexec_fn=limits.apply, pass_fds=pass_fds)
        reason = None
        try:
            reason = watch(proc, out_dir, limits, cgroup, time.time() + timeout)
        finally:
            sandbox.kill(proc)  # returns once every process of the sandbox is gone (bounded), never before
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # stragglers in its session (all of them without the sandbox)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
    reason = reason or limits.passed(out_dir, cgroup)
    return proc.returncode, reason, tail(out_dir / "stdout"), tail(out_dir / "stderr")


class Limits:
    """A proposer's bounds (flags --proposer-memory-mb, --proposer-max-procs, --proposer-max-file-mb,
    --proposer-max-written-mb). Memory and processes: its sandbox's cgroup, where the host has one (else, with
    --allow-weak-bounds, memory is RLIMIT_AS, open files RLIMIT_NOFILE and processes RLIMIT_NPROC, set by
    FOLDER); file size: RLIMIT_FSIZE;
    what it writes: its folder's size (folder_bytes, a tmpfs the kernel fills no further). On the host, its stdout
    and stderr (and, without the sandbox, its folder) are measured every WATCH_S, the sandbox killed past a bound."""

    def __init__(self, memory_mb=PROPOSER_MEMORY_MB, max_procs=PROPOSER_MAX_PROCS, max_file_mb=PROPOSER_MAX_FILE_MB,
                 max_written_mb=PROPOSER_MAX_WRITTEN_MB, base_bytes=0):
        self.memory_mb, self.max_procs, self.max_file_mb = memory_mb, max_procs, max_file_mb
        self.max_written_mb, self.base_bytes = max_written_mb, base_bytes

    def apply(self):
        """In the child before bwrap starts (every process of the sandbox inherits them)."""
        size = self.max_file_mb << 20
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if not cgroups.cgroup_parents():
            # its address space, not RLIMIT_DATA: a MAP_GROWSDOWN mapping (1 GiB touched under a 256 MiB
            # RLIMIT_DATA), a raised stack and the page tables of a huge read-only mapping are no data
            memory = self.memory_mb << 20
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
            resource.setrlimit(resource.RLIMIT_NOFILE, (PROPOSER_OPEN_FILES, PROPOSER_OPEN_FILES))

    def folder_bytes(self, work):
        """The size of a proposer's folder (a tmpfs in its sandbox): the archive copy, and the bound beside it."""
        return usage(work)[0] + (self.max_written_mb << 20)

    def passed(self, scratch, cgroup):
        """The one-line reason of the first bound the proposer reached, or None."""
        events = cgroup.events() if cgroup else {}
        if events.get("oom_kill"):
            return f"killed at its memory bound (--proposer-memory-mb {self.memory_mb})"
        if events.get("pids_max"):
            return f"tried to run more than {self.max_procs} processes (--proposer-max-procs)"
        written, largest, _ = usage(scratch)
        if largest >= self.max_file_mb << 20:
            return f"a file reached its size bound (--proposer-max-file-mb {self.max_file_mb})"
        if written - self.base_bytes > self.max_written_mb << 20:
            return f"wrote more than {self.max_written_mb} MiB (--proposer-max-written-mb)"
        return None


WATCH_S = 0.25  # a proposer's bounds are checked this often (a walk of its scratch folder)


def watch(proc, scratch, limits, cgroup, deadline):
    """Wait for the proposer, checking its bounds every WATCH_S. -> None (it exited), "timeout", or a reason."""
    while True:
        try:
            proc.wait(timeout=min(WATCH_S, max(deadline - time.time(), 0)))
            return None
        except subprocess.TimeoutExpired:
            if time.time() >= deadline:
                return "timeout"
            reason = limits.passed(scratch, cgroup)
            if reason:
                return reason


def usage(root):
    """(bytes on disk under root, the largest file's size, the number of entries), symlinks not followed; a loop
    over a list of folders, never recursion, so no depth breaks it (a folder it cannot read is skipped)."""
    total = largest = count = 0
    folders = [root]
    while folders:
        try:
            with os.scandir(folders.pop()) as entries:
                found = list(entries)
        except OSError:
            continue
        for entry in found:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:  # gone meanwhile
                continue
            total += st.st_blocks * 512
            count += 1
            if stat.S_ISREG(st.st_mode):
                largest = max(largest, st.st_size)
            elif stat.S_ISDIR(st.st_mode):
                folders.append(entry.path)
    return total, largest, count


def tail(path, limit=MAX_OUTPUT_BYTES):
    with open(path, "rb") as f:
        f.seek(max(0, os.path.getsize(path) - limit))
        return f.read().decode("utf-8", errors="replace")


def propose_agent(work, scratch, run_dir, names, iteration, cfg):
    """command / claude: a CLI edits the candidate folders of `work`, in the sandbox with the network (it calls
    an API) and `work` as its only writable folder. Raises ProposalFailed when the call failed."""
    if cfg.proposer == "claude":
        argv, ro, env = claude_command(work, scratch, run_dir, cfg)
    else:
        cmd = cfg.proposer_cmd.format(workdir=shlex.quote(str(work)),
                                       instructions=shlex.quote(str(work / "INSTRUCTIONS.md")))
        argv, ro = ["/bin/sh", "-c", cmd], cfg.proposer_ro
        env = {k: os.environ[k] for k in [cfg.proposer_key_env] if k in os.environ}
    net, egress = network(cfg), None
    sandboxed = not switches.disabled()
    weak = sandboxed and not cgroups.cgroup_parents()  # --allow-weak-bounds: what the kernel bounds without a cgroup
    refuse_weak_network(cfg)
    shown = f"{net}: {', '.join(endpoints(cfg))}" if net == "endpoint" else net
    how = f"sandboxed, network {shown}" if sandboxed else "UNCONFINED: --unsafe-no-sandbox, as you, on the host"
    print(f"proposer {cfg.proposer} ({how}, in {work}): {shlex.join(argv)}")
    t0 = time.time()
    limits = Limits(cfg.proposer_memory_mb, cfg.proposer_max_procs, cfg.proposer_max_file_mb,
                    cfg.proposer_max_written_mb, base_bytes=usage(scratch)[0])
    cgroup = cgroups.Cgroup(cfg.proposer_memory_mb << 20, cfg.proposer_max_procs)
    families = seccomp.WEAK_PROPOSER_FAMILIES if weak else \
        seccomp.HOST_NET_FAMILIES if net == "host" else seccomp.PROPOSER_FAMILIES
    fd = seccomp.no_fork_filter(no_fork=False, families=families, weak=weak)
    sockets = tempfile.mkdtemp(prefix="whale-egress-", dir="/tmp")  # short: a socket's path has 107 bytes at most
    back = HandBack(taken_files(names)) if sandboxed else None
    try:
        if net == "endpoint" and sandboxed:
            egress = Egress(sockets, endpoints(cfg))
            argv, proxy_env, sock = through_egress(argv, egress)
            env, ro = {**env, **proxy_env}, [*ro, sock]
        if sandboxed:  # its folder: a tmpfs of its bound beside the archive copy, filled and handed back by FOLDER
            argv = back.folder_argv(argv, work, cfg.proposer_max_procs if weak else 0)
            folder = dict(extra=["--ro-bind", str(work), SEED], sized=[(work, limits.folder_bytes(work))])
        else:
            folder = dict(rw=[work])
        sizes = {str(work): limits.folder_bytes(work), "/tmp": cfg.proposer_max_written_mb << 20,
                 "/dev/shm": sandbox.TMP_BYTES}
        mounts = weak_mounts(work, scratch, sizes) if weak else None
        argv = sandbox.wrap(argv, ro=ro, net=net == "host", cwd=str(work), env=env, seccomp_fd=fd, cgroup=cgroup,
                            tmp_bytes=sizes["/tmp"], ro_dev=True, shm_bytes=sizes["/dev/shm"],
                            mounted={place: path for place, (path, _, _) in (mounts or {}).items()}, **folder)
        if mounts:
            argv = [sandbox.python(), "-I", "-c", MOUNT, json.dumps(list(mounts.values())), "--", *argv]
        rc, bound, out, err = run_in_sandbox(argv, work, scratch, cfg.proposer_timeout, limits, cgroup,
                                             pass_fds=(fd, *([back.write_fd] if back else [])))
    finally:
        os.close(fd)
        handed, stopped = back.close() if back else (None, None)
        cgroup.close()
        if egress:
            egress.close()
        shutil.rmtree(sockets, ignore_errors=True)
    bound = bound or {"folder": f"filled its folder: wrote {cfg.proposer_max_written_mb} MiB "
                                "(--proposer-max-written-mb)",
                      "files": f"made {PROPOSER_MAX_FILES} files in its folder (or {PROPOSER_TMP_FILES} in /tmp or "
                               f"/dev/shm), all the kernel allows where no cgroup counts them"}.get(stopped)
    cost = {"iteration": iteration, "proposer": cfg.proposer, "candidates": names,
            "rc": "timeout" if bound == "timeout" else rc, "seconds": round(time.time() - t0, 2)}
    if egress and egress.refused:  # what it tried to reach beside its endpoints (the first few, and how often)
        cost["egress_refused"] = sorted(egress.refused)
        cost["egress_refusals"] = egress.refusals
    if bound == "timeout":
        error = f"timed out after {cfg.proposer_timeout:g}s (--proposer-timeout)"
    elif bound:
        error = bound
    elif cfg.proposer == "claude":
        error, usage_ = claude_result(out)
        cost.update(usage_)
        error = error or (None if rc == 0 else f"exit {rc}: {(err or out).strip()[-300:]}")
    else:
        error = None if rc == 0 else f"exit {rc}: {(err or out).strip()[-300:] or 'no output'}"
    if not error and isinstance(handed, str):  # what its sandbox handed back is not what FOLDER writes
        error = handed
    error = valid_text(error)  # its output's tail, or claude's message
    log_cost(run_dir, {**cost, "error": error})
    if error:
        raise ProposalFailed(error)
    return handed


def weak_mounts(work, scratch, sizes):
    """{place: (host folder, bytes, inodes)}: under weak bounds a proposer's folder, /tmp and /dev/shm are each a
    tmpfs that MOUNT makes with nr_inodes (bwrap 0.11 sets no such option), so the kernel refuses a file past
    PROPOSER_MAX_FILES new ones in its folder, past PROPOSER_TMP_FILES in the others: a bound the proposer
    cannot stop, unlike a count."""
    inodes = {str(work): usage(work)[2] + 1 + PROPOSER_MAX_FILES, "/tmp": PROPOSER_TMP_FILES,
              "/dev/shm": PROPOSER_TMP_FILES}
    mounts = {}
    for place, name in ((str(work), "fs-folder"), ("/tmp", "fs-tmp"), ("/dev/shm", "fs-shm")):
        (scratch / name).mkdir()  # empty on the host: the tmpfs is mounted on it in MOUNT's namespace only
        mounts[place] = (str(scratch / name), sizes[place], inodes[place])
    return mounts


# Runs on the host before bwrap, under weak bounds: in a user and mount namespace of its own (the sandbox's
# parent's, invisible to the host and gone with the sandbox) it mounts a tmpfs with size and nr_inodes on each
# folder it is given, [[path, bytes, inodes], ...], then execs the sandbox's command (bwrap, which binds them).
MOUNT = r"""
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
uid, gid = os.getuid(), os.getgid()


def fail(what):
    sys.exit(f"whale: {what}: {os.strerror(ctypes.get_errno())} (a proposer's file systems, --allow-weak-bounds)")


if libc.unshare(0x10000000 | 0x20000) != 0:  # CLONE_NEWUSER | CLONE_NEWNS
    fail("unshare")
for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
    with open(f"/proc/self/{name}", "w") as f:
        f.write(text)
for path, size, inodes in json.loads(sys.argv[1]):
    options = f"size={size},nr_inodes={inodes},mode=0755".encode()
    if libc.mount(b"tmpfs", path.encode(), b"tmpfs", 2 | 4, options) != 0:  # MS_NOSUID | MS_NODEV
        fail(f"mount {path}")
os.execv(sys.argv[3], sys.argv[3:])
"""


# Runs inside a proposer's sandbox as the command's parent, its folder a fresh tmpfs of the bound's size: it fills
# the folder from the archive copy (bound read-only at SEED), runs the command, stops it when the folder is
# (nearly) full (or out of inodes: under weak bounds MOUNT's nr_inodes), then kills whatever the command left
# running and hands back on a pipe only the files the search takes, one JSON line each: {"path", "text"},
# {"path", "error"} or {"path", "absent"}, read as read_untrusted reads (READ stands for its source: the script runs
# where this module cannot be imported), then {"stopped": "folder" or "files"} if it stopped the command. The search trusts none of it (HandBack reads it with a cap, line by line). Whatever
# the proposer hid or unlinked in its folder was never on the host's disk and goes with the sandbox.
FOLDER = r"""
import json, os, shutil, signal, stat, subprocess, sys, resource
from pathlib import Path
seed, work, out, tasks, wanted, argv = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), \
    json.loads(sys.argv[5]), sys.argv[7:]
PLACES = (work, "/tmp", "/dev/shm")  # its writable file systems, each a tmpfs

READ



def why_stop():  # its folder (nearly) full; a file system out of inodes (under weak bounds: MOUNT's nr_inodes)
    st = os.statvfs(work)
    if st.f_bavail * st.f_frsize < max(size // 32, 1 << 20):
        return "folder"
    return "files" if any(os.statvfs(place).f_ffree == 0 for place in PLACES) else None


shutil.copytree(seed, work, dirs_exist_ok=True)
size = os.statvfs(work).f_blocks * os.statvfs(work).f_frsize
if tasks:  # no cgroup counts its processes: RLIMIT_NPROC, which the kernel counts in this user namespace
    resource.setrlimit(resource.RLIMIT_NPROC, (tasks, tasks))
proc, stop = subprocess.Popen(argv, cwd=work), None
while proc.poll() is None and not stop:
    try:
        proc.wait(timeout=0.1)
    except subprocess.TimeoutExpired:
        stop = why_stop()
try:
    os.kill(-1, signal.SIGKILL)  # every process of the sandbox but its init and this one
except ProcessLookupError:
    pass
rc = proc.wait()
with os.fdopen(out, "w") as f:
    for rel, limit in wanted:
        try:
            line = {"path": rel, "text": read_untrusted(Path(work), rel, limit)}
        except FileNotFoundError:
            line = {"path": rel, "absent": True}
        except ValueError as e:
            line = {"path": rel, "error": str(e)}
        except OSError as e:
            line = {"path": rel, "error": f"{rel}: {e.strerror}"}
        f.write(json.dumps(line) + "\n")
    if stop:
        f.write(json.dumps({"stopped": stop}) + "\n")
sys.exit(128 - rc if rc < 0 else rc)
"""
SEED = "/.whale-archive"  # where the archive copy is bound read-only in a proposer's sandbox, for FOLDER


class HandBack:
    """The pipe a proposer's sandbox hands the taken files back on (FOLDER writes them), drained by a thread
    while the proposer runs, so the sandbox never blocks on it, and kept up to a cap.

        back = HandBack(taken_files(names)); argv = back.folder_argv(argv, work, tasks)
        ... run the sandbox with back.write_fd passed ...
        handed, stopped = back.close()  # {path: line} or the one-line error; why FOLDER stopped it, or None"""

    def __init__(self, wanted):
        self.wanted = dict(wanted)
        self.cap = sum(6 * cap + 1024 for cap in self.wanted.values()) + 1024  # JSON escapes: 6 bytes a byte at most
        self.read_fd, self.write_fd = os.pipe()
        self.data = bytearray()
        self.thread = threading.Thread(target=self.drain, daemon=True, name="whale-hand-back")
        self.thread.start()

    def folder_argv(self, argv, work, tasks):
        script = FOLDER.replace("\nREAD\n", "\n" + inspect.getsource(read_untrusted))
        return [sandbox.python(), "-I", "-c", script, SEED, str(work), str(self.write_fd), str(tasks),
                json.dumps(list(self.wanted.items())), "--", *argv]

    def drain(self):
        while chunk := os.read(self.read_fd, 1 << 16):
            if len(self.data) <= self.cap:  # past the cap: still read (the sandbox must not block), not kept
                self.data += chunk

    def close(self):
        """-> ({path: line} or a one-line error, why FOLDER stopped it or None), once the sandbox is gone."""
        os.close(self.write_fd)
        self.thread.join(timeout=30)
        os.close(self.read_fd)
        if len(self.data) > self.cap:
            return f"its sandbox handed back more than {self.cap} bytes", None
        handed, stopped = {}, None
        for raw in bytes(self.data).splitlines():
            try:
                line = json.loads(raw)
            except (ValueError, RecursionError):
                return "its sandbox handed back a line that is not JSON", None
            if line in ({"stopped": "folder"}, {"stopped": "files"}):
                stopped = line["stopped"]
            elif isinstance(line, dict) and line.get("path") in self.wanted and len(line) == 2 and (
                    isinstance(line.get("text"), str) or isinstance(line.get("error"), str) or line.get("absent")):
                handed[line["path"]] = line
            else:
                return f"its sandbox handed back an unexpected line: {raw[:100]!r}", None
        return handed, stopped


def refuse_weak_network(cfg):
    """Under --allow-weak-bounds a proposer runs with AF_UNIX only (seccomp.WEAK_PROPOSER_FAMILIES): one that needs
    a network is refused before any work, in one line."""
    net = network(cfg)
    if net != "none" and not switches.disabled() and not cgroups.cgroup_parents():
        raise SandboxError(f"proposer {cfg.proposer} with network {net}: under --allow-weak-bounds no per-process "
                           f"limit bounds its TCP buffers (tcp_wmem and tcp_rmem a connection): run where a cgroup "
                           f"can be made (README), or use --proposer openai")


def network(cfg):
    """none: an empty network namespace (command's default: it edits files); endpoint: that namespace with one
    way out, lib/episodes/egress.Egress, to endpoints(cfg) only (claude's default, and command's with
    --proposer-allow-host); host: the host's network, loopback and private addresses included, only when the user asks for it."""
    if cfg.proposer_network:
        return cfg.proposer_network
    return "endpoint" if cfg.proposer == "claude" or cfg.proposer_allow_host else "none"


def endpoints(cfg):
    """Where the proposer may connect: claude's API (ANTHROPIC_BASE_URL, else api.anthropic.com) and every
    --proposer-allow-host."""
    found = [os.environ.get("ANTHROPIC_BASE_URL") or "https://api.anthropic.com"] if cfg.proposer == "claude" else []
    return found + list(cfg.proposer_allow_host)


def claude_command(work, scratch, run_dir, cfg):
    """argv, read-only paths and environment for Claude Code in print mode, confined to `work`.
    Every flag checked against `claude --help` of Claude Code 2.1.197."""
    real = os.path.realpath(shutil.which("claude"))
    install = os.path.dirname(real)
    if os.path.basename(install) == "bin" and os.path.isfile(os.path.join(install, "..", "package.json")):
        install = os.path.dirname(install)  # the npm package (bin/claude.exe, its install script, vendor files)
    settings = scratch / "claude-settings.json"  # outside `work`: the agent cannot edit its own permissions
    write_json(settings, claude_settings(work, run_dir))
    argv = [real, "-p", "Read INSTRUCTIONS.md in the current directory and do what it says.",
            "--output-format", "json",            # one result object: is_error, subtype, result, usage, cost
            "--settings", str(settings),          # the scoped permissions below
            "--setting-sources", "user",          # no project settings from the folder it can write to
            "--tools", CLAUDE_TOOLS,              # the built-in tools it has at all: no Bash, no web
            "--permission-mode", "dontAsk",       # what is not allowed is denied, never asked
            "--strict-mcp-config",                # no MCP servers from the user's config (they skip permissions)
            "--no-session-persistence"]
    argv += ["--model", cfg.proposer_model] if cfg.proposer_model else []
    home = os.path.expanduser("~")
    config = os.environ.get("CLAUDE_CONFIG_DIR")
    logins = [os.path.join(home, ".claude"), os.path.join(home, ".claude.json")] + ([config] if config else [])
    node = shutil.which("node")  # an npm install of an older CLI runs on node
    node_dir = [os.path.dirname(os.path.realpath(node))] if node else []
    ro = [install, settings, *node_dir] + [p for p in logins if os.path.exists(p)]
    env = {"HOME": home, "PATH": ":".join(node_dir + ["/usr/local/bin", "/usr/bin", "/bin"]),
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
           **{k: os.environ[k] for k in CLAUDE_ENV + ("CLAUDE_CONFIG_DIR",) if k in os.environ}}
    return argv, ro, env


def claude_settings(work, run_dir):
    """Claude Code settings for the proposer, checked against the published schema
    (https://json.schemastore.org/claude-code-settings.json) and Claude Code 2.1.197: its file tools read and
    edit only `work` ("//" starts an absolute path in a rule; Edit rules cover Write); anything else is
    refused without asking (dontAsk); the project and the run folder are denied by name too; no shell, no web,
    no hooks, no bypass, no memory kept between runs. The sandbox is the boundary; this keeps the agent's own
    tools inside it as well (tests/test_meta_harness.py runs the real CLI against a scripted model to show it)."""
    deny = ["Bash", "WebFetch", "WebSearch"]
    for place in {str(PROJECT), str(Path(run_dir).resolve())}:
        if not str(work).startswith(place + os.sep):
            deny += [f"Read(/{place}/**)", f"Edit(/{place}/**)"]
    return {"$schema": "https://json.schemastore.org/claude-code-settings.json",
            "permissions": {"allow": [f"Read(/{work}/**)", f"Edit(/{work}/**)"], "deny": sorted(deny),
                            "defaultMode": "dontAsk", "disableBypassPermissionsMode": "disable",
                            "additionalDirectories": []},
            "disableAllHooks": True, "autoMemoryEnabled": False}


def claude_result(stdout):
    """(error or None, usage) from `claude -p --output-format json`. A result is read, not assumed: is_error,
    a subtype other than success, an empty result or output that is not a result object are failures."""
    try:
        res = json.loads(stdout)
    except (ValueError, RecursionError):
        return f"output is not JSON: {stdout.strip()[:200]!r}", {}
    if not isinstance(res, dict) or res.get("type") != "result":
        return f"output is not a result object: {stdout.strip()[:200]!r}", {}
    usage = res.get("usage") if isinstance(res.get("usage"), dict) else {}
    number = lambda v: v if isinstance(v, (int, float)) and not isinstance(v, bool) else 0
    fields = {"prompt_tokens": sum(number(usage.get(k)) for k in ("input_tokens", "cache_creation_input_tokens",
                                                                   "cache_read_input_tokens")),
              "completion_tokens": number(usage.get("output_tokens")), "cost_usd": number(res.get("total_cost_usd")),
              "turns": number(res.get("num_turns")),
              "permission_denials": len(res["permission_denials"]) if isinstance(res.get("permission_denials"),
                                                                                list) else 0,
              "models": sorted(map(valid_text, res["modelUsage"])) if isinstance(res.get("modelUsage"), dict) else []}
    result = res.get("result") if isinstance(res.get("result"), str) else ""
    errors = res["errors"] if isinstance(res.get("errors"), list) else []  # only its strings: never str() of a
    message = (result or "; ".join(e for e in errors if isinstance(e, str)))[:500] or "no message"  # deep value
    if res.get("subtype") != "success":
        subtype = res["subtype"][:100] if isinstance(res.get("subtype"), str) else "no subtype"
        return f"{subtype}: {message}", fields
    if res.get("is_error"):
        return message, fields
    if not result.strip():
        return "empty result", fields
    return None, fields


def failure_advice(cfg):
    if cfg.proposer == "claude":
        return "log in to Claude Code (run `claude`, then /login) or set ANTHROPIC_API_KEY"
    if cfg.proposer == "openai":
        return f"check that the server at {cfg.proposer_url} answers (and the key in ${cfg.proposer_key_env})"
    return "run --proposer-cmd by hand on a copy of the archive to see why (costs.jsonl has its output)"
