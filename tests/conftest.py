"""One torch thread: on the 2-core CI machines the harness worker processes need the other core, and two
intra-op threads competing with them made small forwards 10-100x slower (measured). Every test runs in
the repo root, with a fresh error budget phase."""
import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def in_the_repo_root(monkeypatch):
    """The CLIs run from the repo root (harnesses/<domain>.py is their default): so does every test, whatever
    folder pytest was started from."""
    monkeypatch.chdir(ROOT)


@pytest.fixture(autouse=True)
def fresh_error_budget():
    """Each test starts a phase of rollout's error budget: one test's lost episodes never stop another's run."""
    rollout = sys.modules.get("rollout")  # not imported here: tests that never run episodes need not pay for it
    if rollout is not None:
        rollout.BUDGET.start_phase("the test")
