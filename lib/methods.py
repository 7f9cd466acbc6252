"""The methods: WHALE and the five baselines it is compared with, one row each. whale.py (the budgets and the order of
the phases), plan.py, the report (lib/report/runs.py, report.py, lib/report/claims.py), lib/ops/time_model.py and
run_all.sh read this table and nothing else, so a fork's method is one row here (README "Adding a method"):

    METHODS["mine"] = Method("mine", ALTERNATE, BOTH, about="...")
    METHODS["whale-pg"] = Method("whale-pg", ALTERNATE, BOTH, weight_step="pg", experimental=True)

A row's weight_step names the class that trains its weight phases, registered by that name in rft.WEIGHT_STEPS
(RSFT, "rsft", the default; README "Adding a weight algorithm"). The name is part of every weight phase's reuse
key (lib/cli.RSFTConfig.weight_step), so two methods with different steps never share a weight phase.

A method is the order it spends its budgets in and which budgets it has; every method of a table gets the same
totals (whale.budgets: S RSFT steps, R proposer rounds). The order:
    ALTERNATE      weight, harness, weight, ..., weight: weight first, a harness phase after each weight phase
                   while rounds are left, and it ends after a weight phase
    WEIGHT_FIRST   all its weight phases, then all its harness phases
    HARNESS_FIRST  all its harness phases, then all its weight phases
The budgets:
    BOTH           S steps and (I - 1) x (weight phases - 1) rounds: a harness phase between every two weight phases
    WEIGHTS        S steps, no rounds
    HARNESS        no steps, --harness-only-rounds rounds (default (I - 1) x the weight phases)
"""
from dataclasses import dataclass, field

ALTERNATE, WEIGHT_FIRST, HARNESS_FIRST = "alternate", "weight-first", "harness-first"
BOTH, WEIGHTS, HARNESS = "both", "weights", "harness"
ADAPTIVE = "-adaptive"  # the run folder of a method under --schedule adaptive: <method>-adaptive


@dataclass(frozen=True)
class Method:
    name: str
    order: str                  # ALTERNATE, WEIGHT_FIRST or HARNESS_FIRST
    budgets: str                # BOTH, WEIGHTS or HARNESS
    about: str = ""             # one line: what it is for
    prompt_only: bool = False   # its proposer may change only h0's prompt strings (--prompt-only)
    baseline: bool = False      # a fixed baseline of report.py's comparison with WHALE (never picked by a score)
    ours: bool = False          # the method the report compares against the baselines (and its adaptive runs)
    adaptive: bool = False      # run_all.sh's ADAPTIVE=1 also runs it under --schedule adaptive
    optional: bool = False      # the tables show it only where some domain ran it
    weight_step: str = "rsft"   # what trains its weight phases: a name in rft.WEIGHT_STEPS
    experimental: bool = False  # outside run_all.sh's table (table_names); whale.py, plan.py and the report take
                                # it when asked, and the tables show it only where some domain ran it
    paper: dict = field(default=None, compare=False)           # the paper's Table 1, best mean@8 in %
    paper_adaptive: dict = field(default=None, compare=False)  # the same, under the adaptive schedule


# The report's baselines are fixed before any result: harness-only searches harnesses as WHALE does, so the
# difference is what the weight phases add; weight-only trains the weights as WHALE does, so the difference is
# what the harness phases add; stagewise-hw has WHALE's budgets in a harness-first order, so the difference is
# what alternation adds. The row order is the tables' and run_all.sh's (a method reuses what an earlier one made).
METHODS = {m.name: m for m in (
    Method("harness-only", WEIGHT_FIRST, HARNESS, "Meta-Harness for its rounds under the base weights",
           baseline=True, paper={"searchqa": 38.29, "math": 0.42, "chess": 19.82}),
    Method("weight-only", WEIGHT_FIRST, WEIGHTS, "RSFT for the whole weight budget under h0",
           baseline=True, paper={"searchqa": 38.27, "math": 15.42, "chess": 22.17}),
    Method("stagewise", WEIGHT_FIRST, BOTH, "all weight phases, then all harness phases"),
    Method("stagewise-hw", HARNESS_FIRST, BOTH, "all harness phases, then all weight phases (separates alternation "
           "from order)", baseline=True, optional=True),
    Method("fast-slow", ALTERNATE, BOTH, "the WHALE alternation, but the proposer may change only h0's prompt "
           "strings (FST)", prompt_only=True, paper={"searchqa": 35.34, "math": 17.92, "chess": 25.68}),
    Method("whale", ALTERNATE, BOTH, "weight, harness, weight, ..., weight: it ends after a weight phase",
           ours=True, adaptive=True, paper={"searchqa": 48.34, "math": 24.79, "chess": 29.83},
           paper_adaptive={"searchqa": 52.82, "math": 26.46, "chess": None}),
)}
DEFAULT = "whale"  # whale.py --method's default

# The paper's claims (lib/report/claims.py) name the methods they compare, in the order their tables show them
CLAIM_I = ("weight-only", "harness-only", "fast-slow")    # (i) WHALE beats each of these
CLAIM_II = ("harness-only", "weight-only")                # (ii) harness search alone against weights alone
CLAIM_III = ("stagewise", "stagewise-hw")                 # (iii) WHALE against stagewise (stagewise-hw: reference)


def table_names():
    """The methods of run_all.sh's table and of the time model's (lib/ops/time_model.TABLE), in the table's order:
    every row but the experimental ones."""
    return [name for name, m in METHODS.items() if not m.experimental]


def run_names():
    """Every run folder name the report reads, in the tables' order: each method, then the adaptive runs (first
    those run_all.sh makes, then any other method's a user ran under --schedule adaptive)."""
    return [*METHODS, *(name + ADAPTIVE for name, m in METHODS.items() if m.adaptive),
            *(name + ADAPTIVE for name, m in METHODS.items() if not m.adaptive)]


def method_of(run_name):
    """The method of a run folder name (<method> or <method>-adaptive)."""
    return METHODS[run_name.removesuffix(ADAPTIVE)]


def budgets(method, steps, phases, harness_iterations, harness_only_rounds=None):
    """(RSFT steps, proposer rounds) `method` (its name) spends in all, from the weight budget of `steps` RSFT steps
    in `phases` fixed weight phases, and I (harness_iterations: a phase's re-scoring plus I - 1 rounds)."""
    kind = METHODS[method].budgets
    if kind == WEIGHTS:
        return steps, 0
    if kind == HARNESS:
        return 0, harness_only_rounds or (harness_iterations - 1) * phases
    return steps, (harness_iterations - 1) * (phases - 1)


def next_phase(method, last, steps_left, rounds_left):
    """The kind of the next phase of `method` (its name) after a `last` one, or None when the run is over."""
    order = METHODS[method].order
    if order == ALTERNATE:
        if steps_left <= 0:
            return None
        return "harness" if last == "weight" and rounds_left > 0 else "weight"
    if order == HARNESS_FIRST:
        return "harness" if rounds_left > 0 else "weight" if steps_left > 0 else None
    return "weight" if steps_left > 0 else "harness" if rounds_left > 0 else None
