"""--preset on rollout.py, rft.py and meta_harness.py: whale.py's bundles (presets.py), any flag given still wins.
The README's harness guide scores a harness with `rollout.py --preset cpu --split harness`: the same tasks, samples,
seeds and sampling, so the same episodes and mean@k, as the cpu preset's search scores h0 (run here on the smoke
model: the cpu model's figures are in the README)."""
import json

import pytest

import domains
import meta_harness
import presets
import rft
import rollout
import whale
from lib.backends.policy import load_policy


def episodes(traces):
    """(task, sample, every reply's text, reward) of each episode of a traces.jsonl, in file order."""
    rows = [json.loads(line) for line in traces.read_text().splitlines()]
    return [(r["task_id"], r["sample"], [c["completion"] for c in r["calls"]], r["reward"]) for r in rows]


def test_the_guide_scores_a_harness_as_the_cpu_preset_search_does(tmp_path):
    # the README's step 2, on the smoke model
    rollout.main(["--domain", "math", "--harness", "harnesses/cpu/math.py", "--preset", "cpu", "--split", "harness",
                  "--model", "smoke", "--out", str(tmp_path / "guide")])
    guide = json.loads((tmp_path / "guide" / "results.json").read_text())
    # the cpu preset's harness-set scoring of h0, as whale.py's harness phase runs it
    run = whale.parse_args(["--domain", "math", "--preset", "cpu", "--model", "smoke", "--method", "harness-only"])[0]
    cfg = whale.run_config(run, domains.data_flags())
    meta_harness.search(load_policy(run), domains.from_args(run), run.harness, tmp_path / "mh", cfg.search, rounds=0)
    h0 = tmp_path / "mh" / "candidates" / "h0"
    assert run.harness == "harnesses/cpu/math.py" and cfg.search.harness_tasks == 24
    assert guide["mean_at_k"] == json.loads((h0 / "scores.json").read_text())["score"]
    assert guide["k"] == 1 and len(guide["per_task"]) == 24
    mine, theirs = episodes(tmp_path / "guide" / "traces.jsonl"), episodes(h0 / "traces.jsonl")
    assert mine == theirs and len({replies[0] for _, _, replies, _ in mine}) > 1  # the same sampled episodes


def test_the_test_split_is_the_preset_evaluations_and_a_flag_given_wins(tmp_path):
    rollout.main(["--domain", "math", "--harness", "harnesses/math.py", "--preset", "cpu", "--model", "smoke",
                  "--k", "1", "--max-new-tokens", "4", "--out", str(tmp_path / "test")])
    config = json.loads((tmp_path / "test" / "config.json").read_text())
    results = json.loads((tmp_path / "test" / "results.json").read_text())
    run = whale.parse_args(["--domain", "math", "--preset", "cpu"])[0]
    test = whale.run_config(run, domains.data_flags()).test
    assert list(results["per_task"]) == [t["id"] for t in whale.test_tasks(domains.from_args(run), test)]
    assert (config["test_holdout"], config["limit"], config["temperature"]) == (50, 50, 0.6)  # the preset's
    assert (config["harness"], results["k"], config["max_new_tokens"]) == ("harnesses/math.py", 1, 4)  # the flags'


def test_the_train_split_samples_as_an_rsft_step_does(tmp_path):
    """--split train with a preset: the preset's --group episodes a task (cpu: 4), as RSFT samples a prompt, not the
    script's own --k 8."""
    rollout.main(["--domain", "math", "--harness", "harnesses/math.py", "--preset", "cpu", "--model", "smoke",
                  "--split", "train", "--limit", "2", "--max-new-tokens", "4", "--out", str(tmp_path / "train")])
    results = json.loads((tmp_path / "train" / "results.json").read_text())
    assert results["k"] == whale.parse_args(["--domain", "math", "--preset", "cpu"])[0].group == 4
    assert len(results["per_task"]) == 2


def test_rft_and_meta_harness_take_the_preset_for_the_flags_they_have(tmp_path, monkeypatch):
    seen = {}
    monkeypatch.setattr(rft, "train_cli", lambda args: seen.update(rft=vars(args)))
    monkeypatch.setattr(meta_harness, "search_cli", lambda args: seen.update(mh=vars(args)))
    rft.main(["--domain", "math", "--harness", "harnesses/math.py", "--preset", "cpu", "--lr", "1e-4",
              "--out", str(tmp_path / "rft")])
    meta_harness.main(["--domain", "math", "--harness", "harnesses/math.py", "--preset", "cpu", "--candidates", "2",
                       "--out", str(tmp_path / "mh")])
    assert {k: seen["rft"][k] for k in ("model", "batch", "group", "train_limit", "temperature", "lr")} == dict(
        model="cpu", batch=8, group=4, train_limit=64, temperature=0.6, lr=1e-4)
    assert {k: seen["mh"][k] for k in ("model", "harness_tasks", "mutate_order", "max_new_tokens", "candidates")} == \
        dict(model="cpu", harness_tasks=24, mutate_order="traces", max_new_tokens=32, candidates=2)
    assert "epochs" not in seen["rft"] and "epochs" not in seen["mh"]  # whale.py's own flags stay whale.py's
    # --threads is every CLI's: the preset's (auto: chosen at the start, rollout.apply_args) reaches each
    assert seen["rft"]["threads"] == seen["mh"]["threads"] == "auto"


def test_a_preset_without_settings_for_the_domain_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        rollout.main(["--domain", "countdown", "--harness", "harnesses/countdown.py", "--preset", "paper"])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().endswith("countdown has no paper settings (presets.py PAPER: the paper's "
                                                    "domains); run it with --preset smoke or cpu")


def test_a_holdout_on_another_split_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        rollout.main(["--domain", "math", "--harness", "harnesses/math.py", "--split", "harness", "--test-holdout", "3"])
    assert e.value.code == 2 and capsys.readouterr().err.endswith(
        ": error: --test-holdout holds out test tasks, and --split harness draws none: drop it, or use --split test\n")


def parsed(module, entry, argv, monkeypatch):
    """The Namespace a CLI's main parses from argv (its run stood in)."""
    seen = {}
    monkeypatch.setattr(module, entry, lambda args, *rest: seen.update(vars(args)))
    module.main(argv)
    return seen


def test_every_preset_setting_reaches_every_cli_flag_of_its_meaning(tmp_path, monkeypatch):
    """Each preset's value reaches each CLI's flag of the same meaning, for every preset and domain: by the flag's
    name, or by presets.SCRIPT_FLAGS (meta_harness.py's --rounds, --patience and --min-rounds: the preset's adaptive
    harness phase; `--preset paper` once ran 6 rounds with a minimum of 6, the official 5 and patience 2 lost); no
    preset value reaches no CLI at all."""
    import presets
    clis = {"rft.py": (rft, "train_cli"), "meta_harness.py": (meta_harness, "search_cli"),
            "rollout.py": (rollout, "evaluate_cli")}
    for preset in presets.PRESETS:
        for domain in presets.table_domains(preset):
            reached = set()
            defaults = presets.preset_defaults(preset, domain, presets.PRESETS[preset].get("data"))
            whale_args = vars(whale.parse_args(["--domain", domain, "--preset", preset])[0])
            for cli, (module, entry) in clis.items():
                harness = defaults.get("harness", f"harnesses/{domain}.py")
                argv = ["--domain", domain, "--harness", harness, "--preset", preset, "--out", str(tmp_path / cli)]
                args = parsed(module, entry, argv, monkeypatch)
                for key, value in defaults.items():
                    dest = key if key in args else presets.SCRIPT_FLAGS.get(key)
                    if dest in args and not (cli == "rollout.py" and dest in ("k", "limit", "test_holdout")):
                        assert args[dest] == value, (cli, preset, domain, key, dest, args[dest], value)
                        reached.add(key)
            reached |= {key for key in defaults if whale_args.get(key) == defaults[key]}
            assert reached == set(defaults), (preset, domain, set(defaults) - reached)
    mh = parsed(meta_harness, "search_cli", ["--domain", "searchqa", "--harness", "harnesses/searchqa.py",
                                             "--preset", "paper", "--out", str(tmp_path / "mh")], monkeypatch)
    assert (mh["rounds"], mh["min_rounds"], mh["patience"]) == (15, 5, 2)  # alternate.sh's adaptive harness phase
    given = parsed(meta_harness, "search_cli", ["--domain", "math", "--harness", "harnesses/math.py", "--preset",
                                                "paper", "--patience", "0", "--out", str(tmp_path / "mh2")],
                   monkeypatch)
    assert (given["patience"], given["min_rounds"]) == (0, 5)  # a flag given still wins
