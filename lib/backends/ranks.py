"""Data-parallel RSFT under torchrun: the trainer ranks, the few commands rank 0 sends the others, and the one
gradient sum per optimizer step. Without torchrun there is no process group and every function here leaves the
one-process code path as it is, result for result.

    torchrun --nproc_per_node 8 whale.py --preset paper --domain math --backend openai ...   # docs/gpu.md

Rank 0 runs the whole loop as one process does (rollouts, harness phases, proposer, the run folder). The other ranks
(rft.follow) hold the base model and wait for rank 0's next command, broadcast over a gloo group:
    ("trainer", (config, checkpoint folder or None))  build the trainer as RSFT does: a fresh LoRA, or a checkpoint's
    ("update", (trajectories, weights))               their share of every SFT mini-batch, the same optimizer steps
    ("stop", None or rank 0's error line)             the end
Each SFT mini-batch is split the same way on every rank (share: balanced by tokens); each rank divides its loss by
the whole mini-batch's completion tokens, and one all-reduce a step sums the flat LoRA gradients (sum_gradients), so
every rank takes the same optimizer step and holds the same weights. Not DDP: rft.completion_nll calls the decoder
and the head directly, and DDP reduces only what runs through its own forward (pytorch#14616).

No hang: the gradient sum has a timeout (STEP_TIMEOUT); a follower that fails prints one line naming its rank and
exits, and rank 0's next collective fails at once (gloo sees the closed connection; torchrun also stops the others);
rank 0's error path tells the followers to stop (leading), those inside a gradient sum through the launch's store
(announce_failure, wait_or_leave): an NCCL sum rank 0 never joins would wait out STEP_TIMEOUT.
"""
import contextlib
import datetime
import os
import socket
import sys
import time
import traceback
import uuid
from pathlib import Path

import torch
import torch.distributed as dist

from lib.backends.models import model_path

# a gradient sum waits for the slowest rank's share of one mini-batch (minutes at most), never longer
STEP_TIMEOUT = datetime.timedelta(minutes=30)
# a follower waits for the next command through rank 0's rollouts, harness phases and test evaluations (hours); rank
# 0's death ends the wait at once (its closed connection), so this bounds only a node that vanishes from the network
COMMAND_TIMEOUT = datetime.timedelta(days=7)
# rank 0's failure, as the followers inside a gradient sum learn it: a key in the launch's store, looked for each second
ABORT_KEY, ABORT_POLL_S = "whale/rank-0-failed", 1.0
PROBE = ".trainer-ranks"  # the file rank 0 writes in the run folder, every rank reads: one file system for all

_commands = None  # the gloo group of the commands (the gradients go over the default group: nccl on GPUs)


class RankLost(ConnectionError):
    """A collective failed: another rank stopped (its own line says why) or did not answer in time."""


def count():
    """The trainer ranks of this launch: torchrun's WORLD_SIZE, 1 without torchrun."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank():
    return int(os.environ.get("RANK", "0"))


def active():
    return dist.is_available() and dist.is_initialized()


def check_launch(backend, n=None):
    """A launch of n trainer ranks with --backend vllm, refused in one line (also by plan.py --check): its engine, and
    the engine's sleep during an update (--vllm-sleep), live inside rank 0's process on one card. --vllm-sleep does
    nothing with the other backends (a server keeps its cards)."""
    n = count() if n is None else n
    if n > 1 and backend == "vllm":
        raise ValueError(f"--backend vllm runs the engine (and --vllm-sleep puts it to sleep) inside the trainer's "
                         f"process on one card: with {n} trainer ranks, serve the model with `vllm serve "
                         f"--data-parallel-size {n}` and pass --backend openai (docs/gpu.md, several GPUs)")


# -----------------------------------------------------------------------------
# the launch: the process group, rank 0's lead, the followers' loop

def set_device():
    """This rank's card (torchrun's LOCAL_RANK; 0 without torchrun) as the current CUDA device, before anything reads
    or allocates on a card: the card's size the gpu preset fits its micro-batch to (whale.card_gib), the preflight,
    the model. Without a GPU: nothing."""
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))


def start(folder):
    """Join torchrun's process group (nccl on GPUs, each rank on its LOCAL_RANK card; gloo on CPU), the commands'
    gloo group, and check that every rank sees `folder` (the run folder) as rank 0 writes it. After the model cache is
    built (models.model_path): once a group exists, transformers' save_pretrained writes no weights on ranks other
    than 0, so a cache a follower built would hold a tokenizer only."""
    global _commands
    set_device()
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", timeout=STEP_TIMEOUT)
    _commands = dist.new_group(backend="gloo", timeout=COMMAND_TIMEOUT)
    check_shared_folder(folder)


def check_shared_folder(folder):
    """Every rank reads the token rank 0 wrote into `folder`: the followers load rank 0's checkpoints from there (and a
    `vllm serve` on another node its adapters), so it must be one file system, at the same path, on every node."""
    path = Path(folder, PROBE)
    token = None
    if rank() == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        token = uuid.uuid4().hex
        path.write_text(token)
    token = broadcast(token)
    try:
        seen = path.read_text() == token
    except OSError:
        seen = False
    views = [None] * dist.get_world_size()
    dist.all_gather_object(views, (seen, socket.gethostname()), group=_commands)
    if rank() == 0:
        path.unlink(missing_ok=True)
        blind = [f"{r} ({host})" for r, (ok, host) in enumerate(views) if not ok]
        if blind:
            raise ValueError(f"trainer rank {', '.join(blind)} does not see {Path(folder).resolve()} as rank 0 "
                             "writes it: put the run folder (--out) on a file system every node mounts at the same "
                             "path (NFS, Lustre, ...)")


@contextlib.contextmanager
def leading(model, out):
    """Rank 0's whole run (--model, --out): with more than one rank, the model cache, the process group, and, however
    the run ends, the followers told to stop (with rank 0's error line when it failed). One rank: nothing."""
    if count() == 1:
        yield
        return
    try:
        model_path(model)
        start(out)
        yield
    except BaseException as e:
        if active():
            announce_failure()
            stop(error_line(e))
        raise
    stop(None)


@contextlib.contextmanager
def following(prog, model, out):
    """A follower's whole run: the model cache, the process group, then any error as one line naming this rank and
    exit status 1 (a bug keeps its traceback above the line; WHALE_TRACEBACK=1 raises it)."""
    from lib.cli import project_errors
    try:
        model_path(model)
        start(out)
        yield
    except Exception as e:
        if os.environ.get("WHALE_TRACEBACK") == "1":
            raise
        if not isinstance(e, project_errors()):
            traceback.print_exc()
        raise SystemExit(f"{prog}: error: trainer rank {rank()}: {error_line(e)}") from None
    finally:
        if active():
            leave()


def error_line(e):
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


def stop(error):
    """Tell the followers that the run ended (error: rank 0's error line), then leave the group. A follower that is
    gone already cannot hear it: that is not a second error."""
    try:
        broadcast(("stop", error))
    except RankLost:
        pass
    leave()


def leave():
    """Leave the process groups, the commands' gloo group freed now: a group the module still held was destroyed only
    at the interpreter's exit, where joining its threads could abort the process ("terminate called without an
    active exception", exit status -6 after a finished run)."""
    global _commands
    dist.destroy_process_group()
    _commands = None


def tell(command, payload=None):
    """Rank 0: the followers' next command (nothing without followers)."""
    if active():
        broadcast((command, payload))


def commands():
    """A follower's commands from rank 0, until it stops (exit status 1, without a second line, when rank 0 failed)."""
    while True:
        command, payload = broadcast(None)
        if command == "stop":
            if payload:  # rank 0 failed, and its own line says why
                raise SystemExit(1)
            return
        yield command, payload


def broadcast(obj):
    """Rank 0's `obj` on every rank, over the commands' group."""
    box = [obj]
    try:
        dist.broadcast_object_list(box, src=0, group=_commands)
    except RuntimeError as e:  # dist.DistError is one too
        raise RankLost(f"a trainer rank stopped (its own line says why): {error_line(e)}") from None
    return box[0]


# -----------------------------------------------------------------------------
# the update: each rank's share of a mini-batch, the gradient sum, the same start

def tokens(trajectory):
    """What a trajectory costs the trainer: the tokens its examples (prompt, completion[, weight]) run through the
    model."""
    return sum(len(p) + len(c) for p, c, *_ in trajectory)


def split(trajectories, n):
    """An SFT mini-batch's trajectories over n ranks: the largest first, each to the rank with the fewest tokens so far
    (ties: the lowest rank), each share in the mini-batch's order. -> n lists (empty where there are fewer than n)"""
    loads, owner = [0] * n, {}
    for i in sorted(range(len(trajectories)), key=lambda i: -tokens(trajectories[i])):
        owner[i] = min(range(n), key=lambda r: (loads[r], r))
        loads[owner[i]] += tokens(trajectories[i])
    return [[t for i, t in enumerate(trajectories) if owner[i] == r] for r in range(n)]


def share(trajectories):
    """This rank's share of an SFT mini-batch (split: every rank computes the same); all of it with one process."""
    if not active():
        return trajectories
    return split(trajectories, dist.get_world_size())[dist.get_rank()]


def sum_gradients(params, loss):
    """One all-reduce of every rank's gradients of `params` (zeros where its share had none) and loss, as one flat
    buffer; each parameter's gradient becomes the sum. -> the mini-batch's loss. One rank: `loss`, nothing touched."""
    if not active():
        return loss
    parts = [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]
    flat = torch.cat(parts + [torch.tensor([loss], dtype=parts[0].dtype, device=parts[0].device)])
    try:
        work = dist.all_reduce(flat, async_op=True)
        if rank():
            wait_or_leave(work)
        work.wait()
    except RuntimeError as e:
        raise RankLost(f"a trainer rank stopped during the SFT update (its own line says why): {error_line(e)}") \
            from None
    at = 0
    for p in params:
        p.grad = flat[at:at + p.numel()].view_as(p)
        at += p.numel()
    return flat[-1].item()


def wait_or_leave(work):
    """A follower's wait for a gradient sum, which ends within ABORT_POLL_S of rank 0's failure: rank 0 then never joins
    the sum (it failed in its own share, or after it), and an NCCL collective would wait out STEP_TIMEOUT. Rank 0's
    error path sets ABORT_KEY in the launch's store (announce_failure); the follower exits at once, status 1, without a
    line of its own (rank 0's says why), and without leaving the group, which would wait on the pending sum."""
    store = dist.distributed_c10d._get_default_store()
    while not work.is_completed():
        if store.check([ABORT_KEY]):
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)
        time.sleep(ABORT_POLL_S)


def announce_failure():
    """Rank 0 failed: a follower inside a gradient sum stops (wait_or_leave), as one waiting for a command stops at
    the "stop" that follows."""
    try:
        dist.distributed_c10d._get_default_store().set(ABORT_KEY, "1")
    except (RuntimeError, ValueError):  # the store is gone: the launcher is stopping every rank already
        pass


def same_weights(params):
    """Rank 0's values of `params` on every rank, as DDP starts (after every rank built the same trainer: a check
    that costs one broadcast, and a barrier before rank 0 moves its checkpoint on)."""
    if not active():
        return
    with torch.no_grad():
        flat = torch.cat([p.detach().reshape(-1) for p in params])
        try:
            dist.broadcast(flat, src=0)
        except RuntimeError as e:
            raise RankLost(f"a trainer rank stopped while the trainer was built: {error_line(e)}") from None
        at = 0
        for p in params:
            p.copy_(flat[at:at + p.numel()].view_as(p))
            at += p.numel()


# file systems every node of a cluster can mount at one path (/proc/mounts' names); a local one (ext4, xfs, tmpfs,
# overlay) holds a run folder only for ranks on one node
SHARED_FILE_SYSTEMS = {"nfs", "nfs4", "lustre", "gpfs", "cephfs", "ceph", "beegfs", "glusterfs", "fuse.glusterfs",
                       "fuse.juicefs", "fuse.ceph", "wekafs", "pvfs2", "orangefs", "smb3", "cifs", "9p"}


def file_system(path):
    """(type, mount point) of the file system `path` is on (or would be: its nearest existing folder above), as
    /proc/mounts says; ("unknown", path) where it cannot tell."""
    path = os.path.realpath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    kind, at = "unknown", ""
    try:
        with open("/proc/mounts") as f:
            for line in f:
                _, mount, fs = line.split()[:3]
                # the longest mount point above the path; a later mount on the same point covers an earlier one
                if (path == mount or path.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(at):
                    kind, at = fs, mount
    except OSError:
        pass
    return kind, at or path
