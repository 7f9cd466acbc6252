"""The command lines start short: whale.py --help shows the method's own flags and names the other groups, --help-all
lists every flag (lib/cli.Parser); the sandbox's switches sit in the sandbox's group on every CLI that has them; a
run's first lines name its preset and only the flags given beyond it (presets.flags_beyond), config.json the rest."""
import json
import re

import pytest

import meta_harness
import plan
import rft
import rollout
import whale
from lib import cli
from presets import PRESETS
from test_layout import parser_of

SANDBOX_SWITCHES = ("--unsafe-no-sandbox", "--allow-weak-bounds", "--infra-budget")
MAINS = {"whale.py": whale.main, "plan.py": plan.main, "rft.py": rft.main, "meta_harness.py": meta_harness.main,
         "rollout.py": rollout.main}


def printed(parse, argv, capsys):
    """What `parse(argv)` prints before it exits (--help, --help-all), on an 80-column terminal."""
    with pytest.raises(SystemExit) as exit:
        parse(argv)
    assert exit.value.code in (0, None)
    return capsys.readouterr().out


def listed(flag, text):
    """Whether `flag` stands in `text` as itself (--k is not --top-k's tail)."""
    return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text) is not None


@pytest.fixture(autouse=True)
def eighty_columns(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")  # argparse wraps to the terminal: the line counts are an 80-column one's


def test_whale_help_shows_the_method_flags_and_names_every_other_group(capsys):
    text = printed(whale.parse_args, ["--help"], capsys)
    p = whale.parser()
    assert len(text.splitlines()) <= 100, f"whale.py --help is {len(text.splitlines())} lines"
    assert "--help-all lists every flag" in text
    for group in p._action_groups:
        if group._group_actions:
            assert cli.group_name(group) in text, group.title
    shown = [flag for a in p._actions for flag in a.option_strings if listed(flag, text)]
    assert {"--domain", "--method", "--preset", "--epochs", "--harness-iterations", "--adaptive-epochs",
            "--test-limit", "--k", "--help-all"} <= set(shown)
    # the other groups' flags: only --help-all lists them
    assert not {"--lora-rank", "--batch", "--proposer", "--backend", "--unsafe-no-sandbox"} & set(shown)


@pytest.mark.parametrize("name", ["whale.py", "plan.py", "rft.py", "meta_harness.py", "rollout.py"])
def test_help_all_lists_every_option_string_grouped(name, monkeypatch, capsys):
    main = MAINS[name]
    p = parser_of(main, monkeypatch)
    everything = printed(main, ["--help-all"], capsys)
    short = printed(main, ["--help"], capsys)
    missing = [flag for a in p._actions for flag in a.option_strings if not listed(flag, everything)]
    assert not missing, f"{name} --help-all leaves out {missing}"
    assert all(g.title in everything for g in p._action_groups if g._group_actions)
    assert len(short.splitlines()) < len(everything.splitlines()) / 2, name
    assert all(cli.group_name(g) in short for g in p._action_groups if g._group_actions), name


def test_plan_help_shows_its_own_flags(capsys):
    """plan.py parses with whale.py's parser: its own groups (the machine, --check) lead its --help."""
    text = printed(plan.parse_args, ["--help"], capsys)
    assert listed("--card", text) and listed("--check", text) and listed("--epochs", text)
    [args] = plan.parse_args(["--domain", "math", "--preset", "smoke", "--card", "24"])
    assert args.card == 24 and args.test_limit == PRESETS["smoke"]["test_limit"]


@pytest.mark.parametrize("name", ["whale.py", "plan.py", "rft.py", "meta_harness.py", "rollout.py"])
def test_the_sandbox_switches_sit_in_the_sandbox_group(name, monkeypatch):
    main = MAINS[name]
    p = parser_of(main, monkeypatch)
    for flag in SANDBOX_SWITCHES:
        [group] = [g for g in p._action_groups if any(flag in a.option_strings for a in g._group_actions)]
        assert cli.group_name(group) == "sandbox and runner", f"{name}: {flag} in {group.title!r}"


class Policy:
    def to_base(self):
        pass


def test_a_run_names_its_preset_and_only_the_flags_beyond_it(tmp_path, capsys):
    out = tmp_path / "run"
    # --k 1 and --threads 1 are the smoke preset's own: not beyond it
    runs, beyond = whale.parse_command(["--domain", "math", "--preset", "smoke", "--out", str(out), "--test-limit",
                                        "2", "--k", "1", "--threads", "1"])
    assert beyond == ["--test-limit 2"]
    whale.start_run(runs[0], Policy(), beyond)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"whale: whale on math, preset smoke -> {out}"
    assert lines[1].startswith("flags beyond the preset: --test-limit 2 (") and len(lines) == 2
    config = json.loads((out / "config.json").read_text())
    assert config == json.loads(json.dumps(vars(runs[0]))) and len(config) > 100  # the whole config is still there


def test_the_flags_beyond_a_preset_are_the_words_that_set_them():
    _, beyond = whale.parse_command(["--domain", "math", "--preset", "smoke", "--method", "whale", "--schedule",
                                     "adaptive", "--harness-only-iterations", "3", "--bf16", "--proposer-ro", "a b",
                                     "--proposer-ro", "c", "--seed", "0"])
    # the run line names the method and schedule; --seed 0 is the default: in parser order, each as typed back
    assert beyond == ["--harness-only-rounds 3", "--bf16", "--proposer-ro 'a b'", "--proposer-ro c"]


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_a_preset_alone_has_no_flags_beyond_it(preset):
    for domain in ("math", "searchqa", "chess"):
        assert whale.parse_command(["--domain", domain, "--preset", preset])[1] == [], (preset, domain)
