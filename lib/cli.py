"""Command lines: an argparse whose errors are one line naming the flag and the fix, the number checks
every CLI shares (argparse `type=`), the checks of --out and of flags that contradict each other,
`one_line_errors`, the one place that turns the project's own errors into one-line exits, and the typed
configs: what each part of the method reads, built from the flags here and nowhere else.

    run = run_config(args, data_flags)     # whale.py: run.rsft, run.search, run.test, run.sampling
    rsft = rsft_config(args, inputs_of(args, data_flags))    # rft.py alone

Below the command line a part receives its config, never the whole argparse Namespace; a config's hash
(config_hash) is what cross-method reuse and a resume compare, so a flag enters a key only where a
config names it: every flag does, but the few of NO_RESULT_FLAGS, which cannot change a result."""

import argparse
import contextlib
import dataclasses
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from lib.common.errors import InfrastructureError, SandboxError
from lib.methods import METHODS, WEIGHTS


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one line naming the flag and the fix, before any work (-h shows the usage).

    Made with short_help=True (whale.py, plan.py, rft.py, meta_harness.py, rollout.py), its --help starts short: the
    flags a person starting a run needs (the parser's own ungrouped ones and the groups added with lead=True), then
    only the names of the other groups; --help-all prints every flag, grouped, as argparse's whole help.

        p = Parser(description=__doc__, short_help=True)
        g = p.add_argument_group("what to run", lead=True)    # its flags in --help
        rft.add_args(p)                                       # named in --help, its flags in --help-all
    """

    def __init__(self, *args, short_help=False, **kwargs):
        super().__init__(*args, **kwargs)
        self.lead = [self._positionals, self._optionals] if short_help else None
        if short_help:
            self.add_argument("--help-all", action=HelpAll, help="show every flag, grouped, and exit")

    def add_argument_group(self, *args, lead=False, **kwargs):
        group = super().add_argument_group(*args, **kwargs)
        if lead and self.lead is not None:
            self.lead.append(group)
        return group

    def format_help(self):
        """--help: the whole help, or (short_help) the usage of the required flags, the description, the lead
        groups' flags, then the other groups' names, each with how many flags --help-all shows there."""
        if self.lead is None:
            return self.format_help_all()
        head = self._get_formatter()
        head.add_usage(self.usage, [a for a in self._actions if a.required], [])
        formatter = self._get_formatter()
        formatter.add_text(self.description)
        for group in self.lead:
            formatter.start_section(group.title)
            formatter.add_text(group.description)
            formatter.add_arguments(group._group_actions)
            formatter.end_section()
        more = [f"{group_name(g)} ({len(g._group_actions)})," for g in self._action_groups
                if g not in self.lead and g._group_actions]
        return (head.format_help().rstrip("\n") + " [flag ...]\n\n" + formatter.format_help()
                + f"\nmore flags, by group (how many; {self.prog} --help-all lists every flag):\n"
                + names_wrapped(more).rstrip(",") + "\n")

    def format_help_all(self):
        return super().format_help()

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


class HelpAll(argparse.Action):
    """--help-all: every flag, grouped (argparse's whole help), then exit, as -h does."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(parser.format_help_all(), end="")
        parser.exit()


def names_wrapped(names):
    """Names on indented lines as wide as argparse's (the terminal's), a line broken between names, never inside one."""
    width = shutil.get_terminal_size().columns - 2
    lines = [" "]
    for name in names:
        if len(lines[-1]) + 1 + len(name) > width and lines[-1].strip():
            lines.append(" ")
        lines[-1] += " " + name
    return "\n".join(lines)


def group_name(group):
    """A group's name: its title before any parenthesis ("RSFT rollout step (paper: ...)" -> "RSFT rollout step")."""
    return group.title.split(" (")[0]


# -----------------------------------------------------------------------------
# the project's own errors as one line

def project_errors():
    """What the project raises for bad input: ValueError (also JSON and decoding errors), the OSError family
    (FileNotFoundError, PermissionError, IsADirectoryError ...), ImportError of an optional package, the
    sandbox's and the engines' errors, and a run over its error budget (InfrastructureError). EngineError lives beside
    torch (lib/backends/canary.py): it can only have been raised once that module is loaded, so report.py and domains.py
    never pay for the torch import."""
    errors = [ValueError, OSError, ImportError, SandboxError, InfrastructureError]
    canary = sys.modules.get("lib.backends.canary")
    if canary is not None:
        errors.append(canary.EngineError)
    return tuple(errors)


def one_line(e):
    """An error as the one line a person reads: an OSError by its file and reason, else its first line."""
    if isinstance(e, OSError) and e.filename and e.strerror:
        return f"{e.filename}: {e.strerror}"
    text = str(e).strip().splitlines()
    line = text[0] if text else type(e).__name__
    if isinstance(e, ModuleNotFoundError) and e.name:
        line += f": {e.name} is an optional package (pip install -r requirements-gpu.txt, or see README)"
    return line


@contextlib.contextmanager
def one_line_errors(prog):
    """with one_line_errors("whale.py"): main's body. The project's own errors (project_errors) leave as
    `PROG: error: message` on one line, exit status 1, no traceback; anything else (a bug) keeps its
    traceback. WHALE_TRACEBACK=1 shows the traceback of every error, to debug one."""
    try:
        yield
    except Exception as e:
        if not isinstance(e, project_errors()) or os.environ.get("WHALE_TRACEBACK") == "1":
            raise
        raise SystemExit(f"{prog}: error: {one_line(e)}") from None


# -----------------------------------------------------------------------------
# flags checked before any work

def check_out(path, flag="--out"):
    """Refuse an output folder that names a file, or lies where nothing can be written (/proc, a read-only or
    unwritable folder), before any work. The probe is an unnamed temporary file in the folder or its nearest
    existing parent, so nothing is left behind."""
    if path is None:
        return
    base = Path(os.path.abspath(path))
    while not os.path.lexists(base):
        base = base.parent
    if not base.is_dir():
        what = "a file" if base.exists() else "a broken link"
        raise ValueError(f"{flag} {path}: {base} is {what}, not a folder: pass a folder (new or existing)")
    try:
        with tempfile.TemporaryFile(dir=base):
            pass
    except OSError as e:
        raise ValueError(f"{flag} {path}: cannot write in {base} ({e.strerror}): pass a folder you can write "
                         "to") from None


def conflicting_flags(args):
    """The first two flags of `args` that contradict each other (one cannot act under the other), as the line
    naming both and the fix; None when there are none. The CLIs share the flags, so they share this check."""
    get = lambda name, default=None: getattr(args, name, default)
    names = get("method") if isinstance(get("method"), list) else [get("method")]
    searchless = [m for m in names if m in METHODS and METHODS[m].budgets == WEIGHTS]
    if get("prompt_only") and searchless:
        fst = next(m for m in METHODS if METHODS[m].prompt_only)
        return (f"--prompt-only limits the harness search, and --method {searchless[0]} searches no harness: drop "
                f"--prompt-only, or use --method {fst}")
    if get("proposer_cmd") and get("proposer") != "command":
        return f"--proposer-cmd is the command of --proposer command, not of --proposer {get('proposer')}: drop one"
    if get("retriever_url") and get("wiki"):
        return "--retriever-url and --wiki name two retrievers for searchqa: give one of them"
    if get("preset") == "paper" and (get("wiki") or get("wiki_limit")) and not get("paper_with_bm25"):
        return ("--preset paper: --wiki and --wiki-limit search with bm25s, not the official retriever (Search-R1's "
                "e5 server over wiki-18: scripts/search_r1_retriever.sh, then --retriever-url); add "
                "--paper-with-bm25 to run bm25s anyway (a deviation: docs/fidelity.md)")
    if (get("retriever_url") or get("wiki")) and get("data") != "paper":
        return "--retriever-url and --wiki serve the paper's searchqa data: add --data paper, or drop them"
    if (get("backend") == "vllm" and get("lora_rank") is not None and get("max_lora_rank") is not None
            and get("lora_rank") > get("max_lora_rank")):
        return (f"--lora-rank {get('lora_rank')} is above --max-lora-rank {get('max_lora_rank')}: the vllm engine "
                "could not load the adapter; raise --max-lora-rank or lower --lora-rank")
    if get("openai_model") and get("backend") != "openai":
        return f"--openai-model names the served model of --backend openai, not of --backend {get('backend')}: drop one"
    if get("schedule") == "adaptive" and get("harness_min_rounds", 0) > get("harness_max_rounds", math.inf):
        return (f"--harness-min-rounds {get('harness_min_rounds')} is above --harness-max-rounds "
                f"{get('harness_max_rounds')}: an adaptive harness phase could never run its minimum")
    return None


# -----------------------------------------------------------------------------
# the typed configs: what each part reads (field names are the flags' dests)

# The flags no typed config holds, so no reuse key: they change how fast a result is made, where the engine runs or
# what it keeps in memory, where the run is written and reported, or when a failing machine stops it, never the
# result (--paper-with-bm25 only lets the paper preset take --wiki, whose retriever the data flags key). Every other
# flag of every CLI reaches a config (tests/test_layout.py checks each parser against this list).
NO_RESULT_FLAGS = ("out", "threads", "report_to", "gpu_memory", "vllm_sleep", "max_lora_rank", "skip_lora_probe",
                   "openai_url", "openai_workers", "infra_budget", "unsafe_no_sandbox", "allow_weak_bounds", "check",
                   "paper_with_bm25", "gdn_prefill")
FLAG_FIELDS = {"deadline": "deadline_s"}  # a flag whose config field has another name


@dataclass(frozen=True)
class Inputs:
    """What every call runs on: the domain with its data flags, and the base model as its backend serves it."""
    domain: str
    model: str
    backend: str
    bf16: bool
    data: dict  # the flags of domains.add_args (which data, its sizes, the retriever, the judge)
    openai_model: str | None = None  # --backend openai: the served model's name (None: --model)


@dataclass(frozen=True)
class Sampling:
    """How every episode samples and runs (rollout.run_episodes' keyword arguments)."""
    temperature: float
    top_k: int
    max_new_tokens: int
    deadline_s: float
    workers: int | None
    thinking: str
    episode_tokens: int | None
    max_prompt_tokens: int | None
    max_model_len: int | None

    def kwargs(self):
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class RSFTConfig:
    """A weight phase: the rollout step, the SFT update, the LoRA adapter (rft.py). weight_step names the class that
    trains it (rft.WEIGHT_STEPS; the method row's, lib/methods.py): here, so every key that hashes this config (a
    weight phase's snapshot, and so the weights, evaluations and searches made under them) holds it."""
    inputs: Inputs
    sampling: Sampling
    weight_step: str
    seed: int
    batch: int
    group: int
    sft_batch: int
    micro_batch: int
    lr: float
    warmup: int
    weight_decay: float
    grad_clip: float
    lora_rank: int
    lora_alpha: int
    lora_dropout: float
    lora_targets: str
    grad_checkpointing: bool
    train_limit: int | None  # the seeded sample of the train split it draws prompts from

    @property
    def model(self):
        return self.inputs.model


@dataclass(frozen=True)
class SearchConfig:
    """A harness phase: the harness set, the candidates, the proposer (meta_harness.py)."""
    inputs: Inputs
    sampling: Sampling
    seed: int
    candidates: int
    harness_tasks: int | None
    harness_samples: int
    prompt_only: bool
    null_check: str  # refuse | report: a winner that earns more without the model than its parent
    null_margin: float
    proposer: str
    proposer_brief: str  # official | small-model: the brief's rules (lib/briefs.py BRIEFS)
    mutate_order: str
    proposer_cmd: str | None
    proposer_url: str
    proposer_model: str | None
    proposer_key_env: str
    proposer_timeout: float
    proposer_max_failures: int
    proposer_ro: tuple
    proposer_prompt_tokens: int
    proposer_network: str | None  # none | endpoint | host; None: the proposer's default (lib/proposers.network)
    proposer_allow_host: tuple
    proposer_memory_mb: int
    proposer_max_procs: int
    proposer_max_file_mb: int
    proposer_max_written_mb: int


@dataclass(frozen=True)
class EvalConfig:
    """A test evaluation: mean@k on a seeded sample of the test split."""
    inputs: Inputs
    sampling: Sampling  # its workers: None, the runner's own width
    seed: int
    k: int
    test_limit: int | None
    test_holdout: int


@dataclass(frozen=True)
class RunConfig:
    """One method's run of whale.py: its plan (budgets, schedule) and the configs of its calls."""
    domain: str
    method: str
    schedule: str
    preset: str
    out: str
    model: str
    harness: str
    seed: int
    epochs: float
    phase_epochs: float
    harness_iterations: int  # I: the re-scoring of the incoming harness plus I - 1 proposer rounds
    harness_only_rounds: int | None
    adaptive_epochs: float
    harness_patience: int
    harness_min_rounds: int
    harness_max_rounds: int
    test_evals: str
    batch: int
    k: int
    rsft: RSFTConfig
    search: SearchConfig
    test: EvalConfig


def fields_of(cls, args, **given):
    """cls built from the flags of the same names, the rest given."""
    names = [f.name for f in dataclasses.fields(cls) if f.name not in given]
    return cls(**{name: getattr(args, name) for name in names}, **given)


def inputs_of(args, data_flags):
    # rollout.py and meta_harness.py train nothing: no --bf16 there
    return Inputs(args.domain, args.model, args.backend, getattr(args, "bf16", False),
                  {k: getattr(args, k) for k in sorted(data_flags)}, getattr(args, "openai_model", None))


def sampling_of(args, **override):
    """The sampling flags as a Sampling; --max-model-len is the engine's (meta_harness.py and rollout.py
    pass it only when their backend flags have it)."""
    given = dict(temperature=args.temperature, top_k=args.top_k, max_new_tokens=args.max_new_tokens,
                 deadline_s=args.deadline, workers=args.workers, thinking=args.thinking,
                 episode_tokens=args.episode_tokens, max_prompt_tokens=args.max_prompt_tokens,
                 max_model_len=args.max_model_len)
    return Sampling(**{**given, **override})


def rsft_config(args, inputs):
    # rft.py alone: its --train-limit (default: the whole train split); whale.py: the method row's weight step
    # (whale.run_args), rft.py its --weight-step, a script that names none RSFT's
    return fields_of(RSFTConfig, args, inputs=inputs, sampling=sampling_of(args),
                     train_limit=getattr(args, "train_limit", None), weight_step=getattr(args, "weight_step", "rsft"))


def search_config(args, inputs):
    return fields_of(SearchConfig, args, inputs=inputs, sampling=sampling_of(args),
                     proposer_ro=tuple(args.proposer_ro), proposer_allow_host=tuple(args.proposer_allow_host))


def eval_config(args, inputs):
    return fields_of(EvalConfig, args, inputs=inputs, sampling=sampling_of(args, workers=None))


def run_config(args, data_flags):
    """whale.py's flags as one method's RunConfig."""
    inputs = inputs_of(args, data_flags)
    return fields_of(RunConfig, args, rsft=rsft_config(args, inputs), search=search_config(args, inputs),
                     test=eval_config(args, inputs))


def config_hash(config):
    """The content of a config (a dataclass, or JSON holding some), as one sha256: what a key of reuse
    or resume holds."""
    text = json.dumps(config, sort_keys=True, default=dataclasses.asdict)
    return hashlib.sha256(text.encode()).hexdigest()
