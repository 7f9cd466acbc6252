"""One torch thread: on the 2-core CI machines the harness worker processes need the other core, and two
intra-op threads competing with them made small forwards 10-100x slower (measured). A fresh error budget
phase for every test."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def fresh_error_budget():
    """Each test starts a phase of rollout's error budget: one test's lost episodes never stop another's run."""
    rollout = sys.modules.get("rollout")  # not imported here: tests that never run episodes need not pay for it
    if rollout is not None:
        rollout.BUDGET.start_phase("the test")
