"""The store serves only what it stored (lib/run_folder/store.py): an item edited on disk (an evaluation's mean, a
search's scores and code, a weights item's rewards and lora_alpha) is found out by its hashes, removed and computed
again, so the next command's numbers are its own; a run holds copies, so editing its files never edits the store;
and a command under --unsafe-no-sandbox neither reads nor writes it. Whale smoke runs with test_whale's stand-in
episodes (rewards from the task, the sample and the seed), as tests/test_whale.py drives them."""
import hashlib
import json
import os
from pathlib import Path

import pytest

import meta_harness as mh
import whale
from fixtures import stand_ins
from fixtures.configs import search_config
from lib.episodes import switches
from lib.run_folder import store as store_module
from lib.run_folder.store import Store, about
from test_meta_harness import FakeDomain, SEED, fake as search_fake  # noqa: F401
from test_whale import assert_same_record, fake, record  # noqa: F401


def listing(store):
    """Every file of the store's items with its content hash (the lock file aside: a command takes it)."""
    return {str(p.relative_to(store)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(store.rglob("*")) if p.is_file() and p.name != "lock"}


def items(store, kind, **about):
    return [p.parent for p in sorted(store.glob(f"{kind}/*/key.json"))
            if all(json.loads(p.read_text())["about"].get(k) == v for k, v in about.items())]


def edit_json(path, change):
    value = json.loads(path.read_text())
    change(value)
    path.write_text(json.dumps(value))


def test_a_stored_item_edited_on_disk_is_computed_again_and_the_numbers_are_the_commands_own(tmp_path, fake, capsys):
    argv, executed = fake
    argv = argv + ["--method", "whale"]  # a weight phase, a search, a weight phase: every kind of item
    whale.main(argv + ["--out", str(tmp_path / "first")])
    store, want = tmp_path / "store", record(tmp_path / "first")
    [evaluation] = items(store, "evaluation", tag="phase_0")
    edit_json(evaluation / "evaluation.json", lambda e: e["stats"].update(mean_at_k=0.77))
    [search] = items(store, "search")
    edit_json(search / "candidates" / "h0" / "scores.json", lambda s: s.update(score=0.99))
    harness = search / "candidates" / "h1_1" / "harness.py"
    harness.write_text(harness.read_text().replace("MAX_TURNS = ", "MAX_TURNS = 2 or "))
    [weights] = [item for item in items(store, "weights") if about(item)["rows"][-1]["step"] == 2]
    edit_json(weights / "adapter" / "adapter_config.json", lambda c: c.update(lora_alpha=4096))
    edit_json(weights / "state.json", lambda s: s.update(rollouts=0))
    executed.clear()
    capsys.readouterr()
    whale.main(argv + ["--out", str(tmp_path / "second")])
    out = capsys.readouterr().out
    for item, why in ((evaluation, "evaluation.json was edited"), (search, "was edited"),
                      (weights, "was edited")):
        assert f"{item}: damaged (" in out and why in out.split(f"{item}: damaged (")[1].split("\n")[0], out
    assert executed == ["second"] * 2  # the first weight phase trained again (its item refused)
    assert_same_record(record(tmp_path / "second"), want, "the second command, its damaged items computed again")
    assert "0.77" not in out and "0.99" not in out


def test_editing_a_runs_files_leaves_the_store_as_it_was(tmp_path, fake):
    """A run's evals/*.json, its checkpoint and its archive are copies of the store's items (what it put, and what it
    took): a user's post-processing of them never reaches the store."""
    argv, _ = fake
    argv = argv + ["--method", "whale"]
    whale.main(argv + ["--out", str(tmp_path / "first")])
    whale.main(argv + ["--out", str(tmp_path / "second")])  # takes every item the first put
    store = tmp_path / "store"
    before = listing(store)
    for run in ("first", "second"):
        for path in (tmp_path / run / "evals").glob("*.json"):
            edit_json(path, lambda e: e["stats"].update(mean_at_k=0.77))
        edit_json(tmp_path / run / "weights" / "ckpt" / "adapter" / "adapter_config.json",
                  lambda c: c.update(lora_alpha=4096))
        for path in (tmp_path / run).glob("harness_w*/candidates/*/scores.json"):
            edit_json(path, lambda s: s.update(score=0.99))
    assert listing(store) == before


def test_an_unconfined_command_neither_reads_nor_writes_the_store(tmp_path, fake, monkeypatch, capsys):
    """Under --unsafe-no-sandbox harness and proposer code run as the user: what the command would take from the
    shared store or put there is theirs to change, so it computes everything in store-unconfined beside it and leaves
    the shared one as it was (an item it would find damaged included); that store, like the shared one, serves one
    command at a time, and it holds the shared store's lock too: a command in the sandbox and one without never run in
    the same folders at once (each would append to the other's rows)."""
    argv, executed = fake
    argv = argv + ["--method", "weight-only"]
    whale.main(argv + ["--out", str(tmp_path / "first")])
    store = tmp_path / "store"
    [damaged] = items(store, "evaluation", tag="phase_0")
    edit_json(damaged / "evaluation.json", lambda e: e["stats"].update(mean_at_k=0.77))
    before = listing(store)
    executed.clear()
    capsys.readouterr()
    monkeypatch.setenv(switches.OPT_OUT, "1")  # the opt-out (the episodes are made up: no sandbox needed)
    whale.main(argv + ["--out", str(tmp_path / "unconfined")])
    out = capsys.readouterr().out
    assert listing(store) == before
    assert executed == ["unconfined"] * 4 and "(the store)" not in out and "damaged" not in out
    assert f"store: {tmp_path / 'store-unconfined'} (--unsafe-no-sandbox: the shared store is neither read nor " \
           "written)" in out
    for held in ("store-unconfined", "store"):  # another unconfined command, or one in the sandbox, still running
        with store_module.only_command(tmp_path / held), pytest.raises(SystemExit) as e:
            whale.main(argv + ["--out", str(tmp_path / "unconfined-2")])
        assert str(e.value.code).startswith(f"whale.py: error: {tmp_path / held} is in use by another command")
    assert not (tmp_path / "unconfined-2" / "metrics.jsonl").exists()
    assert record(tmp_path / "unconfined")["summary"]["final_mean_at_k"] == \
        record(tmp_path / "first")["summary"]["final_mean_at_k"]


def test_an_unconfined_proposer_is_logged_as_unconfined(search_fake, tmp_path, monkeypatch, capsys):
    _, seed, run_dir = search_fake
    monkeypatch.setenv(switches.OPT_OUT, "1")
    cfg = search_config(candidates=1, proposer="command", proposer_cmd="true")
    mh.search(stand_ins.BACKEND, FakeDomain(), str(seed), run_dir, cfg, rounds=1)
    out = capsys.readouterr().out
    assert "proposer command (UNCONFINED: --unsafe-no-sandbox, as you, on the host, in " in out
    assert "sandboxed" not in out


def test_find_checks_the_key_and_every_files_hash(tmp_path):
    (tmp_path / "evaluation.json").write_text(json.dumps({"stats": {"test_rollouts": 1}, "per_task": {"a": 1.0}}))
    (tmp_path / "traces.jsonl").write_text('{"task_id": "a"}\n')
    parts = {name: tmp_path / name for name in ("evaluation.json", "traces.jsonl")}
    store, key = Store(tmp_path / "store"), {"weights": "base", "harness": "h", "config": "c"}
    for damage in (lambda item: edit_json(item / "key.json", lambda k: k["key"].update(harness="other")),
                   lambda item: (item / "notes.txt").write_text("added"),
                   lambda item: (item / "traces.jsonl").write_text('{"task_id": "b"}\n'),
                   lambda item: edit_json(item / "key.json", lambda k: k.pop("files")),
                   lambda item: edit_json(item / "key.json", lambda k: k["about"].update(run="/elsewhere"))):
        item = store.put("evaluation", key, parts, about={"tag": "phase_0"})
        assert store.find("evaluation", key) == item
        damage(item)
        assert store.find("evaluation", key) is None and not item.exists()


def test_a_search_items_about_edited_is_computed_again_not_a_crash(tmp_path):
    """key.json's `about` is read back (a search's rounds bound its check, a checkpoint's run names its harness
    files): an edit of it is a damaged item, removed and computed again, never a KeyError that stops every command."""
    archive = tmp_path / "archive" / "candidates" / "h0"
    archive.mkdir(parents=True)
    (archive / "harness.py").write_text("def run(task, llm, tools):\n    return {}\n")
    (archive / "meta.json").write_text(json.dumps({"valid": False, "proposer": "seed", "reason": "x"}))
    store, key = Store(tmp_path / "store"), {"weights": "base", "seed": "s", "config": "c"}
    for damage in (lambda about: about.pop("rounds"), lambda about: about.update(rounds="0")):
        item = store.put("search", key, tmp_path / "archive", about={"run": "/r", "rounds": 0, "candidates": 1})
        assert store.find("search", key) == item
        edit_json(item / "key.json", lambda k: damage(k["about"]))
        assert store.find("search", key) is None and not item.exists()


def test_an_item_that_is_a_symlink_is_damaged_not_a_crash(tmp_path):
    """A damaged item whose folder is a symlink (to an edited copy of itself) is removed and computed again, as
    any damaged one is, not an OSError from removing it that stops every command."""
    (tmp_path / "evaluation.json").write_text(json.dumps({"stats": {"test_rollouts": 1}, "per_task": {"a": 1.0}}))
    (tmp_path / "traces.jsonl").write_text('{"task_id": "a"}\n')
    parts = {name: tmp_path / name for name in ("evaluation.json", "traces.jsonl")}
    store, key = Store(tmp_path / "store"), {"weights": "base", "harness": "h", "config": "c"}
    item = store.put("evaluation", key, parts, about={"tag": "phase_0"})
    item.rename(tmp_path / "elsewhere")
    item.symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere" / "traces.jsonl").write_text('{"task_id": "b"}\n')
    assert store.find("evaluation", key) is None and not item.is_symlink() and (tmp_path / "elsewhere").exists()


def test_a_put_killed_while_it_replaces_an_item_leaves_the_older_one(tmp_path, monkeypatch):
    """A put replacing an item (a phase or search a step or round further) moves the older one aside until the new one
    is in place: killed between the two renames, the next command puts the older one back, whole."""
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "state.json").write_text('{"step": 1}')
    store, key = Store(tmp_path / "store"), {"weights": "base", "step": 0, "harness": "h", "config": "c"}
    first = store.put("weights", key, tmp_path / "work", about={"rows": [1]})
    (tmp_path / "work" / "state.json").write_text('{"step": 2}')
    replace = os.replace

    def killed_before_the_new_one_is_in_place(src, dst):
        if ".tmp-" in Path(src).name:  # the new item's rename, after the older one's
            raise KeyboardInterrupt("killed between the renames")
        replace(src, dst)
    with monkeypatch.context() as m:
        m.setattr(os, "replace", killed_before_the_new_one_is_in_place)
        with pytest.raises(KeyboardInterrupt):
            store.put("weights", key, tmp_path / "work", about={"rows": [1, 2]})
    assert not first.exists() and store.find("weights", key) is None  # between the renames: no item in place
    with store_module.only_command(tmp_path / "store"):
        item = store.find("weights", key)
    assert item == first and about(item)["rows"] == [1] and (item / "state.json").read_text() == '{"step": 1}'
    assert not list((tmp_path / "store" / "weights").glob("*.old-*")) and not list((tmp_path / "store").glob("*/*.tmp-*"))
