"""The lease on the card (lib/run_folder/card.py) with tiny stand-in processes, no model: one holder at a time, turns
taken while a holder waits on its proposer, and a holder that dies gives the card to the one that waits."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from lib.report.plots import plot_card
from lib.run_folder.card import Card, holdings

ROOT = Path(__file__).resolve().parents[1]
# a domain process in small: it holds the card for its work and gives it back for each proposer wait
STAND_IN = """
import sys, time
from lib.run_folder.card import Card
class Policy:  # the engine and trainer a real process moves off the card
    def leave_card(self): pass
    def back_on_card(self): pass
import os
lock, domain, rounds, work, wait = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
card = Card(lock, domain)
open(lock + "." + domain + ".ready", "w").close()
while not os.path.exists(lock + ".go"):  # every stand-in started (its Python up) before any takes the card
    time.sleep(0.01)
with card.held():
    open(lock + "." + domain + ".holds", "w").close()
    for i in range(rounds):
        card.phase = str(i)
        time.sleep(work)  # sampling, training
        with card.away(Policy()):
            time.sleep(wait)  # the proposer
    time.sleep(work)
"""


def stand_in(lock, domain, rounds, work, wait):
    return subprocess.Popen([sys.executable, "-c", STAND_IN, str(lock), domain, str(rounds), str(work), str(wait)],
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


def wait_for(path, seconds=20):
    end = time.time() + seconds
    while not path.exists():
        assert time.time() < end, f"{path} never appeared"
        time.sleep(0.02)


def test_two_processes_take_turns_and_never_hold_the_card_together(tmp_path):
    """Two processes whose proposer waits are longer than their work: each takes the card while the other waits on
    its proposer (the holdings interleave), and the lease's record shows no two holdings at once."""
    lock = tmp_path / "card.lock"
    procs = [stand_in(lock, domain, 3, 0.1, 0.5) for domain in ("searchqa", "math")]
    for domain in ("searchqa", "math"):
        wait_for(Path(f"{lock}.{domain}.ready"))
    Path(f"{lock}.go").touch()
    assert [p.wait(timeout=30) for p in procs] == [0, 0]
    held = sorted(holdings(lock), key=lambda h: h["start"])
    assert len(held) == 2 * 4 and all(h["end"] is not None for h in held)  # 3 proposer waits: 4 holdings each
    for a, b in zip(held, held[1:]):
        assert a["end"] <= b["start"], f"{a} and {b} held the card at once"
    domains = [h["domain"] for h in held]
    assert sum(x != y for x, y in zip(domains, domains[1:])) >= 3, f"no turns taken: {domains}"
    plot_card(held, tmp_path / "card.png")  # the report's figure of who held the card when
    assert (tmp_path / "card.png").stat().st_size > 0


def test_a_killed_holder_gives_the_card_to_the_waiting_process(tmp_path):
    """The holder is killed (SIGKILL: no cleanup of its own) while the other waits for the card: the kernel drops its
    lock, the other takes the card and finishes, and the record shows the dead holding ended at that take."""
    lock = tmp_path / "card.lock"
    Path(f"{lock}.go").touch()
    holder = stand_in(lock, "chess", 1, 3600, 0)  # holds the card for an hour
    wait_for(Path(f"{lock}.chess.holds"))
    waiting = stand_in(lock, "math", 1, 0.05, 0.05)
    time.sleep(0.5)
    assert waiting.poll() is None and not Path(f"{lock}.math.holds").exists()  # it waits for the card
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=10)
    assert waiting.wait(timeout=20) == 0
    dead, *rest = holdings(lock)
    assert dead["domain"] == "chess" and dead["died"] and dead["end"] == rest[0]["start"]
    assert [h["domain"] for h in rest] == ["math", "math"] and all(h["end"] for h in rest)


def test_no_lease_file_means_no_turns(tmp_path):
    """Without WHALE_CARD (Card(None)), holding and giving the card do nothing: no file, the policy stays."""
    card = Card(None, "math")
    with card.held(), card.away(None):
        pass
    assert list(tmp_path.iterdir()) == []
