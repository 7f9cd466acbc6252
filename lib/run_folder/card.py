"""Turns on the card: the domain processes of one night (run_all.sh) share one GPU, one at a time. A process holds
the card while it samples, trains or evaluates, and gives it back while its proposer writes (its engine asleep), so
the next process wakes into the whole share and the card never waits for a proposer.

    card = Card(os.environ.get("WHALE_CARD"), "math")   # WHALE_CARD: the lease file run_all.sh names; unset: no turns
    with card.held():                                   # blocks until no other process holds the card
        ...                                             # the model loads, phases run
        with card.away(policy):                         # the engine sleeps, the card goes to the next process
            ...                                         # the proposer writes (no GPU)

The lease is an exclusive flock on results/<preset>/card.lock: the kernel drops it when its holder dies however it
dies, so a killed process never keeps the card. Each take and give is a row of card.jsonl beside it (pid, domain,
method, phase, time): the report's timeline draws who held the card when, and a holding whose process died has a
take and no give. One holder at a time keeps every memory check of the plan true as it is: one engine awake."""
import fcntl
import json
import os
import time
from contextlib import contextmanager
from pathlib import Path


class Card:
    def __init__(self, lock_path, domain):
        """lock_path: the lease file (None: no turns, every call below does nothing)."""
        self.lock_path, self.domain = lock_path, domain
        self.method, self.phase = None, None  # what this process does now: whale.run sets them, the rows say them
        self.lock = None  # the open lease file while this process holds the card

    def take(self):
        """Wait for the card, then hold it."""
        if self.lock_path is None:
            return
        Path(self.lock_path).parent.mkdir(parents=True, exist_ok=True)
        self.lock = open(self.lock_path, "a")
        fcntl.flock(self.lock, fcntl.LOCK_EX)  # blocks while another process holds it
        self.record("take")

    def give(self):
        if self.lock is None:
            return
        self.record("give")  # before the unlock: the next holder's take is after it in the file and in time
        fcntl.flock(self.lock, fcntl.LOCK_UN)
        self.lock.close()
        self.lock = None

    @contextmanager
    def held(self):
        """The card for the whole block, given back however it ends."""
        self.take()
        try:
            yield self
        finally:
            self.give()

    @contextmanager
    def away(self, policy):
        """The card given back for the block (the proposer's wait): the policy leaves it first (the engine asleep
        under --vllm-sleep, the trainer's weights in host memory: Policy.leave_card) and comes back after the take
        (the engine wakes at its next generate)."""
        if self.lock is None:
            yield
            return
        policy.leave_card()
        self.give()
        try:
            yield
        finally:
            self.take()
            policy.back_on_card()

    def record(self, event):
        row = {"event": event, "time": time.time(), "pid": os.getpid(), "domain": self.domain,
               "method": self.method, "phase": self.phase}
        with open(rows_path(self.lock_path), "a") as f:  # one short line, appended whole by one write
            f.write(json.dumps(row) + "\n")


NO_TURNS = Card(None, None)  # a process alone on its machine: meta_harness.py's own command, tests


def rows_path(lock_path):
    """card.jsonl beside the lease file."""
    return Path(lock_path).with_name("card.jsonl")


def holdings(lock_path):
    """The lease's rows as holdings, in the order taken: [{pid, domain, method, phase, start, end}]; a holding whose
    process died holding the card ends where the next one starts (the kernel's unlock), or is open (end None)."""
    path = rows_path(lock_path)
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    out, open_by_pid = [], {}
    for row in rows:
        if row["event"] == "take":
            for other in out:  # a take while a holding is open: that holder died (its lock went with it)
                if other["end"] is None:
                    other["end"], other["died"] = row["time"], True
            open_by_pid[row["pid"]] = len(out)
            out.append({k: row[k] for k in ("pid", "domain", "method", "phase")} | {"start": row["time"], "end": None})
        elif row["pid"] in open_by_pid:
            out[open_by_pid.pop(row["pid"])]["end"] = row["time"]
    return out
