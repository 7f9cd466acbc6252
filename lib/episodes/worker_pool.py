"""The harness workers: lib/episodes/harness_process.py in a fresh OS sandbox (lib/episodes/sandbox.py) under the
no-fork filter, each serving exactly one episode, so no state carries over from one episode to the next. POOL starts
them in a background thread and keeps started ones across run_episodes calls, so an episode rarely waits for one. The
workers of a run share one memory budget (WORKER_MEMORY_SHARE of the machine's RAM, split as each worker's
RLIMIT_AS, and as its sandbox's cgroup bound, 64 MiB above it, where the host has cgroups).

    POOL.order(n)            # start n more in the background
    workers = POOL.take(n)   # up to n started ones, without waiting; the runner reads and writes their pipes
"""
import atexit
import os
import queue
import resource
import select
import selectors
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from lib.episodes.cgroups import CGROUP_SLACK_BYTES, Cgroup
from lib.episodes.sandbox import kill as kill_sandbox, python, start_one_process

WORKER_PY = str(Path(__file__).resolve().with_name("harness_process.py"))
WORKER_MEMORY_SHARE = 0.25  # of the machine's RAM: one budget for all concurrent harness workers together
WORKER_MEMORY_MAX = 2 << 30  # per worker, however few run at once
FDS_PER_WORKER = 3  # the parent's descriptors of a started worker: its two pipe ends and its stderr file
FDS_BESIDE_WORKERS = 1024  # CUDA's, vLLM's zmq sockets, the model's and the run's files (stated, not measured)
NR_OPEN = 1 << 20  # Linux's default ceiling for a soft limit, where the hard one is unlimited
WORKER_TASKS = 256  # threads of one worker's sandbox, bwrap's two processes included (its cgroup's pids.max)


def worker_memory_bytes(n_workers):
    """Each worker's RLIMIT_AS: the budget split over the run's concurrent workers. The no-fork filter keeps a
    sandbox to one process, so the workers together never pass the budget (idle warm workers run no harness
    code: a bare interpreter each)."""
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return min(WORKER_MEMORY_MAX, int(ram * WORKER_MEMORY_SHARE) // max(n_workers, 1))


def raise_open_file_limit():
    """The soft RLIMIT_NOFILE up to the hard one, before any worker starts: a soft 1,024 (a common default under
    a far higher hard limit) is spent by some 250 warm workers beside CUDA's and zmq's descriptors. -> (soft,
    hard) now; a kernel that refuses leaves it as it was (the preflight names a hard limit that is too low)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = NR_OPEN if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError):
            pass
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def open_files_needed(n_workers):
    return n_workers * FDS_PER_WORKER + FDS_BESIDE_WORKERS


def readable(fd, timeout_s):
    """fd has bytes (or its end) within timeout_s. poll, not select: select refuses descriptors above 1,023,
    which a raised open-file limit hands out."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(timeout_s, 0) * 1000))


class Worker:
    """lib/episodes/harness_process.py in a fresh sandbox (bwrap: no project, no data, no other process, no network; no
    fork). It serves exactly one episode, so no state carries over; killing bwrap ends every process and thread of
    it."""

    def __init__(self):
        p2w_r, self.wfd = os.pipe()
        self.rfd, w2p_w = os.pipe()
        self.stderr = tempfile.TemporaryFile()  # start-up errors (bwrap's, the interpreter's); RLIMIT_FSIZE=0 later
        # the whole sandbox's memory (shared memory, tmpfs and kernel memory included) and tasks, counted by the
        # kernel where the host has cgroups; lowered to the episode's share when its job is sent (limit_memory)
        self.cgroup = Cgroup(WORKER_MEMORY_MAX + CGROUP_SLACK_BYTES, WORKER_TASKS)
        try:
            # no start_new_session: it costs the vfork fast path (a plain fork of a parent holding a model is
            # slow), and killing bwrap reaches everything inside anyway
            self.proc = start_one_process(
                [python(), "-I", "-S", WORKER_PY, str(p2w_r), str(w2p_w)], files=[WORKER_PY], packages=False,
                cgroup=self.cgroup, ro_tmp=True, pass_fds=(p2w_r, w2p_w), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=self.stderr)
        except BaseException:
            self.cgroup.close()
            raise
        finally:
            for fd in (p2w_r, w2p_w):
                os.close(fd)
        os.set_blocking(self.wfd, False)
        self.inbuf, self.outbuf, self.ready, self.episode = b"", b"", False, None

    def startup_error(self):
        self.stderr.seek(0)
        return self.stderr.read(4000).decode(errors="replace")[-2000:]

    def flush(self, sel):
        """Non-blocking writes: a harness that stops reading its pipe must not stall the parent. What the pipe
        does not take now waits in outbuf, its write end registered in the runner's selector `sel`."""
        try:
            n = os.write(self.wfd, self.outbuf) if self.outbuf else 0
            self.outbuf = self.outbuf[n:]
        except BlockingIOError:
            pass
        except OSError:
            self.outbuf = b""  # the worker is gone; its EOF is handled on the read side
        watched = self.wfd in sel.get_map()
        if self.outbuf and not watched:
            sel.register(self.wfd, selectors.EVENT_WRITE, self)
        elif watched and not self.outbuf:
            sel.unregister(self.wfd)

    def unwatch(self, sel):
        for fd in (self.rfd, self.wfd):
            if fd in sel.get_map():
                sel.unregister(fd)

    def limit_memory(self, memory_bytes):
        """The sandbox's cgroup bound: the episode's RLIMIT_AS plus what lives outside its address space."""
        self.cgroup.limit_memory(memory_bytes + CGROUP_SLACK_BYTES)

    def kill(self):
        kill_sandbox(self.proc)  # its pid namespace, with every process and thread inside, even while bwrap sets it up
        self.cgroup.close()
        for fd in (self.rfd, self.wfd):
            try:
                os.close(fd)
            except OSError:
                pass
        self.stderr.close()


class Pool:
    """Started sandboxed workers kept across run_episodes calls. A background thread starts them, so the event
    loop never waits on a start; a run takes them as it needs them, and orders a fresh one for every worker
    whose episode ended, which then waits here for the next episode or the next call."""

    def __init__(self):
        self.idle, self.errors, self.pending = [], [], 0
        self.lock, self.orders, self.thread = threading.Lock(), queue.SimpleQueue(), None
        self.starting, self.closed = threading.Lock(), False  # held while a worker starts; close() takes it
        self.notify = None  # the running Runner's wake-up, called after every start

    def order(self, n):
        """Start n more workers in the background. The thread lives as long as the process: bwrap's
        --die-with-parent follows the thread that started it, so a short-lived thread would take them along."""
        with self.lock:
            self.pending += max(n, 0)
            if self.thread is None:
                raise_open_file_limit()
                self.thread = threading.Thread(target=self.start_workers, name="whale-sandboxes", daemon=True)
                self.thread.start()
        for _ in range(n):
            self.orders.put(None)

    def start_workers(self):
        while True:
            self.orders.get()
            with self.starting:  # close() waits for a start in flight, and none begins after it
                if self.closed:
                    continue
                try:
                    w = Worker()
                except Exception as e:  # the runner's thread reads it from failed_starts()
                    w = e
                with self.lock:
                    self.pending -= 1
                    (self.errors if isinstance(w, Exception) else self.idle).append(w)
                self.wake_runner()

    def wake_runner(self):
        """Wake the running Runner. This frame holds this thread's only reference to it (and through it to the
        model), and it ends inside start_workers' lock, so before close() returns: a daemon thread that frees
        torch tensors while the interpreter shuts down aborts the process (the tensor's destructor takes the GIL,
        which ends the thread by pthread_exit, whose unwinding through that noexcept destructor calls
        std::terminate: 'terminate called without an active exception')."""
        notify = self.notify
        if notify:
            notify()

    def supply(self):
        """Workers started or on their way, and failed starts the runner has not charged yet."""
        with self.lock:
            return len(self.idle) + self.pending + len(self.errors)

    def failed_starts(self):
        """The errors of the starts that failed (each tried twice: sandbox.start_one_process) since the last call:
        the runner charges each to an episode, as the machine's failure."""
        with self.lock:
            errors, self.errors = self.errors, []
        return errors

    def take(self, n):
        """Up to n started workers, without waiting; warm ones that died while idle are replaced."""
        with self.lock:
            dead = [w for w in self.idle if w.proc.poll() is not None]
            alive = [w for w in self.idle if w not in dead]
            taken, self.idle = alive[:n], alive[n:]
        for w in dead:
            w.kill()
        self.order(len(dead))
        return taken

    def put(self, workers):
        with self.lock:
            self.idle = workers + self.idle

    def warm(self, n):
        """At least n started workers, ready (scripts/bench_rollout.py's steady state: as after a run's first call)."""
        self.order(n - self.supply())
        self.wait_ready()

    def wait_ready(self, timeout_s=60.0):
        """Block until every ordered worker has started and said it is ready (the bench charges that wait to
        the runner)."""
        end = time.time() + timeout_s
        while self.pending and time.time() < end:
            time.sleep(0.002)
        for w in list(self.idle):
            while not w.ready and b"\n" not in w.inbuf and readable(w.rfd, end - time.time()):
                chunk = os.read(w.rfd, 4096)
                w.inbuf += chunk
                if not chunk:
                    break
            if not w.ready and b"\n" in w.inbuf:
                line, w.inbuf = w.inbuf.split(b"\n", 1)
                w.ready = line == b'{"ready": true}'

    def close(self):
        """Kill every started worker (at exit): a start in flight finishes first, and none begins after."""
        with self.starting:
            self.closed = True
        with self.lock:
            idle, self.idle = self.idle, []
        for w in idle:
            w.kill()


POOL = Pool()
atexit.register(POOL.close)
