"""WHALE's two acceptance rules, each written here and nowhere else.

    reward > SUCCESS     an episode is a success (reward > 0.5): RSFT trains on it, the failure kinds skip it
    rank(rows)           harness candidates best first: the harness phase's winner is the first valid one
                         (pick_best); mutate steps from them in this order; the null check, the archive best
                         the adaptive stop reads, and the proposer's brief (WINNER_RULE) all take it from here
"""

SUCCESS = 0.5  # the success threshold every reader imports (rft.py, lib/failures.py, the openai proposer, scripts)
# the proposer's brief says it in these words
WINNER_RULE = "the best score wins, ties go to fewer mean turns, then to the earlier candidate"


def rank(rows):
    """The scored candidate rows, best first: the higher harness-set score, then fewer mean turns, then the earlier
    row (so a tie stays with the incumbent)."""
    return sorted((r for r in rows if r.get("score") is not None), key=lambda r: (-r["score"], r["mean_turns"]))


def pick_best(rows):
    """The harness phase's winner: the first valid row of rank(rows) (a candidate the null check refused, or one
    that never validated, is not valid)."""
    valid = rank(r for r in rows if r.get("valid") is not False)
    if not valid:
        raise ValueError("pick_best: no scored candidate in the archive; score the seed harness first")
    return valid[0]
