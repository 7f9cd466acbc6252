"""The code's shape as README "Files" and docs/design.md describe it, checked on the source: the method scripts import
no operation, whale.run drives its phases itself and the ledger runs nothing, no function below a script's CLI layer
takes the whole argparse Namespace, one RSFT step runs at most 13 lib/ modules, and docs/design.md's reading path
names functions that exist."""
import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
METHOD_SCRIPTS = ("whale.py", "rft.py", "meta_harness.py")
# The CLI layer: the functions that turn flags into configs, checks and loaded engines. A function elsewhere
# that takes `args` (this project's name for the Namespace) fails the test below: give it its config
# (lib/cli.py) instead.
CLI_LAYER = {
    "whale.py": {"parse_args", "run_args", "check_args", "start_run"},
    "plan.py": {"plan_sizes", "describe", "sft_line"},
    "rft.py": {"train_cli", "run_steps", "preflight"},
    "meta_harness.py": {"search_cli"},
    "rollout.py": {"apply_args", "adapted_policy", "evaluate_cli"},
    "domains.py": {"from_args", "data_of", "check_harness", "check_inputs", "check_tools"},
    "report.py": {"write_report"},
    "presets.py": {"flags_beyond"},
    "lib/cli.py": {"conflicting_flags", "fields_of", "inputs_of", "sampling_of", "rsft_config", "search_config",
                   "eval_config", "run_config"},
    "lib/backends/policy.py": {"check_backend", "load_backend", "max_lora_rank", "load_policy"},
    "lib/paper/retriever.py": {"check_flags"},
    "lib/episodes/sandbox.py": {"apply_args"},
}


def tree(path):
    return ast.parse((ROOT / path).read_text(), filename=path)


def functions(t):
    return [n for n in ast.walk(t) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def imported(path, tiers):
    """The modules of lib/<tier>/ (for each of `tiers`) that the source at `path` imports."""
    t = tree(path)
    found = {f"{n.module}.{a.name}" for n in ast.walk(t) if isinstance(n, ast.ImportFrom) for a in n.names
             if (n.module or "").split(".")[:2] in [["lib", tier] for tier in tiers]}
    found |= {a.name for n in ast.walk(t) if isinstance(n, ast.Import) for a in n.names
              if a.name.split(".")[:2] in [["lib", tier] for tier in tiers]}
    found |= {f"lib.{a.name}" for n in ast.walk(t) if isinstance(n, ast.ImportFrom) and n.module == "lib"
              for a in n.names if a.name in tiers}
    return found


def test_the_method_imports_no_operation_and_no_report():
    """whale.py, rft.py and meta_harness.py import no lib/ops or lib/report module, and no lib/ module outside those
    two does: the operations (plan.py's plan and --check, the time model, the hub) and the report depend on the
    method, never the other way round. One door: whale.py and rft.py call lib/ops/preflight.launch once, at their
    launch, before any model loads (issue 68: every launch runs plan.py --check's checks)."""
    below = [str(p.relative_to(ROOT)) for p in (ROOT / "lib").rglob("*.py") if p.parent.name not in ("ops", "report")]
    launch = {"whale.py": {"lib.ops.preflight"}, "rft.py": {"lib.ops.preflight"}}
    for path in [*METHOD_SCRIPTS, *below]:
        found = imported(path, ("ops", "report")) - launch.get(path, set())
        assert not found, f"{path} imports {sorted(found)}"


def test_lib_is_in_tiers_of_at_most_twelve_files():
    """lib/ shows its tiers: the method's helpers at the top, a sub-package per tier, none over 12 files."""
    folders = {p.parent for p in (ROOT / "lib").rglob("*.py")}
    crowded = {str(f.relative_to(ROOT)): n for f in folders if (n := len(list(f.glob("*.py")))) > 12}
    assert not crowded, f"folders of more than 12 modules: {crowded}"


def test_whale_drives_its_loop_and_the_ledger_runs_nothing():
    """whale.run calls each phase itself (weight_phase, harness_phase, test_evaluation), and each phase makes its work
    a direct call (RSFT steps, the search, the evaluation), with no lambda or nested function anywhere in whale.py;
    the ledger's and the store's methods take no callable: none calls a parameter."""
    t = tree("whale.py")
    assert not [n.lineno for n in ast.walk(t) if isinstance(n, ast.Lambda)], "whale.py: a lambda"
    nested = [f"{g.name} in {f.name}" for f in functions(t) for g in functions(f) if g is not f]
    assert not nested, f"whale.py: nested functions {nested}"
    calls = {f.name: {ast.unparse(n.func) for n in ast.walk(f) if isinstance(n, ast.Call)}
             for f in t.body if isinstance(f, ast.FunctionDef)}
    assert {"weight_phase", "harness_phase", "test_evaluation"} <= calls["run"], calls["run"]
    assert "trainer.step" in calls["weight_phase"] and "meta_harness.search" in calls["harness_phase"]
    assert "evaluate_test" in calls["test_evaluation"]
    for path, name in (("lib/run_folder/ledger.py", "Ledger"), ("lib/run_folder/store.py", "Store")):
        [cls] = [c for c in tree(path).body if isinstance(c, ast.ClassDef) and c.name == name]
        for method in functions(cls):
            params = {a.arg for a in method.args.posonlyargs + method.args.args + method.args.kwonlyargs}
            called = {n.func.id for n in ast.walk(method) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
            assert not params & called, f"{name}.{method.name} calls its parameter {sorted(params & called)}"


def test_no_function_below_the_cli_layer_takes_the_namespace():
    """Every function with a parameter `args` is one of the CLI layer's (lib/ops/ is the operation commands'
    layer, reading every flag by design); a phase, a trainer, a search, a domain or a policy gets its config."""
    paths = ["whale.py", "rft.py", "meta_harness.py", "rollout.py", "domains.py", "report.py", "presets.py",
             *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "lib").rglob("*.py") if p.parent.name != "ops")]
    found = {}
    for path in paths:
        for f in functions(tree(path)):
            params = [a.arg for a in f.args.posonlyargs + f.args.args + f.args.kwonlyargs]
            if "args" in params and f.name not in CLI_LAYER.get(path, set()):
                found.setdefault(path, []).append(f.name)
    found.pop("lib/episodes/harness_process.py", None)  # audit(event, args): the audit hook's own arguments
    assert not found, f"functions below the CLI layer take the Namespace: {found}; pass their config instead"


def test_one_rsft_step_runs_at_most_fourteen_lib_modules(tmp_path):
    """scripts/lib_modules.py on README's one-step rft.py command: the rooms a reader opens to follow it (nine, and
    lib/backends/ranks.py since issue 58: the data-parallel update's calls, which do nothing in one process; and
    since issue 59 the sandbox's concerns in files of their own, three of which the step opens beside sandbox.py:
    seccomp.py, the no-fork filter each harness worker starts under; cgroups.py, each worker's cgroup; switches.py,
    the opt-out every one of them reads; and since issue 70 lib/run_folder/store.py, where the step's checkpoint is
    kept, the one place a rerun finds it). lib/common/ is not counted: it is lib/'s floor (the number checks, JSON
    files and a file's sha256 the step calls, moved out of cli.py and run_folder/files.py in issue 59 so that no
    import runs back up), and its pieces read as their names."""
    done = subprocess.run([sys.executable, "scripts/lib_modules.py", "rft.py", "--domain", "math", "--harness",
                           "harnesses/math.py", "--model", "smoke", "--steps", "1", "--batch", "2", "--group", "2",
                           "--out", str(tmp_path / "rft")], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]  # the script's count, after the step's own output
    common = sum(line.startswith("lib/common/") for line in done.stderr.splitlines())
    assert last.endswith(" lib modules") and int(last.split()[0]) - common <= 14, done.stderr[-2000:]


def test_no_hard_coded_domain_list_outside_the_registry():
    """The registry (domains.DOMAINS) is the one list: no tuple, list or set of domain names in rollout.py, rft.py,
    report.py, data/build.py or lib/ (presets.py holds the per-preset tables), and run_all.sh takes its domains
    from presets.py."""
    import domains
    names = set(domains.DOMAINS)
    paths = ["rollout.py", "rft.py", "report.py", "data/build.py",
             *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "lib").rglob("*.py"))]
    found = []
    for path in paths:
        for node in ast.walk(tree(path)):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(node.elts) >= 2 and all(
                    isinstance(e, ast.Constant) and e.value in names for e in node.elts):
                found.append(f"{path}:{node.lineno}")
    assert not found, f"hard-coded domain lists: {found}; take them from domains.DOMAINS"
    import presets
    from lib.ops import time_model
    assert [d for d, _, _ in time_model.ADAPTIVE] == list(presets.ADAPTIVE_DOMAINS)  # plan.py times what run_all runs
    shell = (ROOT / "run_all.sh").read_text()
    assert not [line for line in shell.splitlines() if not line.lstrip().startswith("#")
                and sum(name in line for name in names) >= 2]


def test_the_acceptance_rules_are_written_once():
    """lib/rules.py holds the success threshold and the candidates' ranking: no other source compares a reward with
    0.5, and no other source ranks by score and mean turns (mutate, the null check, the proposers take rank and
    pick_best)."""
    sources = [p for p in ROOT.rglob("*.py") if not {"tests", ".venv", "results"} & set(p.relative_to(ROOT).parts)]
    found = []
    for path in sources:
        rel = str(path.relative_to(ROOT))
        for n in ast.walk(tree(rel)):
            if isinstance(n, ast.Compare) and any(isinstance(op, (ast.Gt, ast.LtE)) for op in n.ops) and any(
                    isinstance(c, ast.Constant) and c.value == 0.5 for c in n.comparators):
                found.append(f"{rel}:{n.lineno} compares with 0.5")
            if isinstance(n, ast.Lambda) and rel != "lib/rules.py":
                names = {c.value for c in ast.walk(n.body) if isinstance(c, ast.Constant)}
                if {"score", "mean_turns"} <= names:
                    found.append(f"{rel}:{n.lineno} ranks candidates")
    assert not found, f"{found}: import lib/rules.SUCCESS, rank or pick_best instead"


def test_method_names_only_in_the_method_table():
    """lib/methods.py is the one table of methods: no other source (but the two scripts that measure weight-only
    and harness-only) holds a method's name as a value, and run_all.sh lists none; prose may name them."""
    from lib.methods import METHODS, run_names
    names = set(run_names()) | set(METHODS)
    skip = {"lib/methods.py",
            "scripts/check_engagement.py", "scripts/calibrate_cpu_h0.py",  # about weight-only and harness-only
            "lib/backends/models.py",
            "lib/run_folder/report_to.py"}  # "whale": the project's cache folder and wandb project
    sources = [p for p in ROOT.rglob("*.py") if not {"tests", ".venv", "results"} & set(p.relative_to(ROOT).parts)]
    found = []
    for path in sources:
        rel = str(path.relative_to(ROOT))
        if rel in skip:
            continue
        t = tree(rel)
        prose = {id(n.body[0].value) for n in ast.walk(t) if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef))
                 and n.body and isinstance(n.body[0], ast.Expr)}  # docstrings
        found += [f"{rel}:{n.lineno} {n.value!r}" for n in ast.walk(t)
                  if isinstance(n, ast.Constant) and n.value in names and id(n) not in prose]
    shell = [f"{p.name}:{i}" for p in (ROOT / "run_all.sh", ROOT / "scripts" / "vllm_cpu_check.sh")
             for i, line in enumerate(p.read_text().splitlines(), 1)
             if not line.lstrip().startswith("#") and sum(f" {n} " in f" {line} " for n in names) >= 2]
    assert not found + shell, f"method names outside lib/methods.py: {found + shell}"


class Parsed(Exception):
    pass


def parser_of(main, monkeypatch):
    """The parser a CLI's main builds, stopped as it parses."""
    from lib import cli
    seen = []

    def record(parser, *a, **kw):
        seen.append(parser)
        raise Parsed
    with monkeypatch.context() as m:
        m.setattr(cli.Parser, "parse_args", record)
        try:
            main(["--domain", "math"])
        except Parsed:
            pass
    return seen[0]


def parser_flags(main, monkeypatch):
    """The flag dests of the parser a CLI's main builds."""
    return {a.dest for a in parser_of(main, monkeypatch)._actions if a.dest not in ("help", "help_all")}


def config_fields(config, out):
    """Every field name of a typed config, nested configs and the data flags included."""
    import dataclasses
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        out.add(f.name)
        if dataclasses.is_dataclass(value):
            config_fields(value, out)
        if isinstance(value, dict):
            out |= set(value)
    return out


def test_every_flag_reaches_the_reuse_key_or_cannot_change_a_result(monkeypatch):
    """Each flag of whale.py and plan.py reaches the RunConfig whose hashes key reuse, or is on lib/cli.NO_RESULT_FLAGS;
    the standalone rft.py, meta_harness.py and rollout.py share that rule for every flag but their own extent (they
    key no reuse: each resumes only its own folder)."""
    import domains
    import meta_harness
    import plan
    import rft
    import rollout
    import whale
    from lib import cli
    [args] = whale.parse_args(["--domain", "math", "--preset", "smoke"])
    keyed = config_fields(cli.run_config(args, domains.data_flags()), set())
    own = {"rft.py": {"steps", "stop_patience"}, "meta_harness.py": {"rounds", "patience", "min_rounds"},
           "rollout.py": {"split", "limit", "adapter", "show"},
           "plan.py": {"card", "gpus", "ranks", "nodes"}}  # the machine a plan is for: no run reads them
    for name, main in (("whale.py", whale.main), ("plan.py", plan.main), ("rft.py", rft.main),
                       ("meta_harness.py", meta_harness.main), ("rollout.py", rollout.main)):
        flags = parser_flags(main, monkeypatch)
        missing = {f for f in flags if cli.FLAG_FIELDS.get(f, f) not in keyed} - set(cli.NO_RESULT_FLAGS)
        assert missing == own.get(name, set()), (f"{name}: {sorted(missing)} reach no config: add each to its "
                                                 "config (lib/cli.py) or, if it cannot change a result, to "
                                                 "NO_RESULT_FLAGS")


def reading_path():
    """[(file, [function names])] of docs/design.md section 9's reading path."""
    doc = (ROOT / "docs" / "design.md").read_text()
    table = doc.split("<!-- reading path -->")[1].split("<!-- end reading path -->")[0]
    rows = [line.split("|")[1:3] for line in table.strip().splitlines()[2:]]
    return [(path.strip(), [n.strip() for n in names.replace("`", "").split(",")]) for path, names in rows]


def definitions(path):
    """{name: its ast node} of a file's top-level functions and classes and its classes' methods (Class.method)."""
    body = tree(path).body
    defined = {n.name: n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    defined |= {f"{c.name}.{f.name}": f for c in body if isinstance(c, ast.ClassDef)
                for f in c.body if isinstance(f, ast.FunctionDef)}
    return defined


def test_the_reading_path_names_functions_that_exist_and_reads_in_at_most_700_lines():
    """docs/design.md section 9's reading path names each function by its file (renamed or moved code would leave a
    reader at a name that is not there), and covers one training iteration and one resume in at most 700 lines: each
    function's whole source, decorators included, counted here from the source, as the doc's count says."""
    lines = 0
    for path, names in reading_path():
        defined = definitions(path)
        for name in names:
            assert name in defined, f"{path} has no {name}"
            node = defined[name]
            lines += node.end_lineno - min([node.lineno] + [d.lineno for d in node.decorator_list]) + 1
    assert len(reading_path()) >= 10 and lines <= 700, lines
    doc = (ROOT / "docs" / "design.md").read_text()
    assert f"{lines} lines" in doc.split("<!-- end reading path -->")[1][:400], lines
