"""Untrusted text is text before it is used: a lone surrogate (JSON's "\\ud800", which no file or terminal can hold)
from a harness's error, a proposer's meta.json or an openai reply is that candidate's matter, and the search
finishes and resumes; a NUL byte in a candidate is a one-line rejection, on CI's Python and on Debian 12's 3.11.2.
capsys makes stdout strict UTF-8, as a terminal's is: a surrogate printed there stops the search."""
import json
import os
import subprocess
import textwrap
from types import SimpleNamespace

import pytest

import meta_harness as mh
import rollout
from fixtures import stand_ins
from fixtures.configs import search_config
from lib import contract
from lib.episodes import sandbox
from test_meta_harness import ChatServer, FakeDomain, FakeRollout, SEED, chat_server, fake, rows_of  # noqa: F401

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# a command proposer: writes each fresh candidate's harness.py and meta.json as the test says (the file sys.argv[2])
WRITER = textwrap.dedent('''\
    import json, pathlib, sys
    work, edit = pathlib.Path(sys.argv[1]), json.loads(pathlib.Path(sys.argv[2]).read_text())
    for meta_path in work.glob("candidates/*/meta.json"):
        meta = json.loads(meta_path.read_text())
        if meta["proposed"]:
            continue
        if "harness" in edit:
            (meta_path.parent / "harness.py").write_text(edit["harness"])
        meta.update(edit.get("meta", {}))
        meta_path.write_text(json.dumps(meta))  # ensure_ascii: a surrogate is its escape, valid UTF-8
    ''')


def command_search(tmp_path, seed, run_dir, edit, rounds, rollout_module, monkeypatch):
    agent = tmp_path / "writer.py"
    agent.write_text(WRITER)
    edit_file = tmp_path / "edit.json"
    edit_file.write_text(json.dumps(edit))
    cfg = search_config(candidates=1, proposer="command", proposer_ro=[str(agent), str(edit_file)],
                        proposer_cmd=f"{sandbox.python()} {agent} {{workdir}} {edit_file}")
    monkeypatch.setattr(mh.rollout, "run_episodes", rollout_module.run_episodes)
    monkeypatch.setattr(mh.rollout, "evaluate", rollout_module.evaluate)
    return mh.search(stand_ins.BACKEND, FakeDomain(), str(seed), run_dir, cfg, rounds=rounds)


class RunnableDomain(FakeDomain):
    def tools(self, task):
        return SimpleNamespace(search=lambda query: "")

    def reward(self, task, answer, tools):
        return 0.0


RUN_EPISODES = rollout.run_episodes  # the real runner, before any test swaps it


class RealSmoke(FakeRollout):
    """The candidate's smoke episode in the real runner (its sandboxed worker; the harness raises before it asks
    the model, so a backend without one will do); scores by the fake."""

    def run_episodes(self, domain, path, tasks, backend, **kw):
        no_model = SimpleNamespace(tokenizer=SimpleNamespace(chat_template=None))
        return RUN_EPISODES(RunnableDomain(), path, tasks, no_model, **kw)


def test_a_harness_error_with_a_lone_surrogate_is_that_candidates_reason(fake, tmp_path, capsys, monkeypatch):
    _, seed, run_dir = fake
    raises = SEED.replace('    reply = llm(', '    raise ValueError("bad \\ud800 text")\n    reply = llm(')
    edit = {"harness": raises}
    for rounds in (1, 2):  # the search, then its resume
        res = command_search(tmp_path, seed, run_dir, edit, rounds, RealSmoke(), monkeypatch)
        assert res["rounds"] == rounds
    reason = rows_of(run_dir)["h1_1"]["reason"]
    assert reason.startswith("smoke episode failed") and "ValueError: bad ? text" in reason, reason
    assert "ValueError: bad ? text" in capsys.readouterr().out


def test_a_lone_surrogate_in_a_proposers_meta_json_is_replaced(fake, tmp_path, capsys, monkeypatch):
    _, seed, run_dir = fake
    edit = {"harness": SEED.replace("MAX_TURNS = 1", "MAX_TURNS = 2"),
            "meta": {"changed": "MAX_TURNS \ud800 2", "hypothesis": "\udfff"}}
    for rounds in (1, 2):
        assert command_search(tmp_path, seed, run_dir, edit, rounds, FakeRollout(), monkeypatch)["rounds"] == rounds
    row = rows_of(run_dir)["h1_1"]
    assert row["valid"] and row["changed"] == "MAX_TURNS ? 2" and row["hypothesis"] == "?"
    assert "(MAX_TURNS ? 2)" in capsys.readouterr().out


def test_a_lone_surrogate_in_an_openai_reply_is_that_candidates_reason(fake, monkeypatch, chat_server, capsys):
    _, seed, run_dir = fake
    code = SEED.replace("MAX_TURNS = 1", 'MAX_TURNS = 1\nMARK = "\ud800"')
    ChatServer.replies = [f"Parent: h0\nHypothesis: a mark\nChanged: MARK \udc80\n```python\n{code}```"]
    monkeypatch.setenv("TEST_KEY", "sk-test")
    cfg = search_config(candidates=1, proposer="openai", proposer_url=chat_server, proposer_model="m",
                        proposer_key_env="TEST_KEY")
    for rounds in (1, 2):
        assert mh.search(stand_ins.BACKEND, FakeDomain(), str(seed), run_dir, cfg, rounds=rounds)["rounds"] == rounds
    row = rows_of(run_dir)["h1_1"]
    assert not row["valid"] and row["reason"] == "candidates/h1_1/harness.py: not utf-8 text", row
    assert row["changed"] == "MARK ?"
    assert "h1_1: rejected, candidates/h1_1/harness.py: not utf-8 text" in capsys.readouterr().out


NUL = 'def run(task, llm, tools):\n    return {"answer": "\0"}\n'


def test_a_nul_byte_in_a_candidate_is_a_one_line_rejection():
    assert contract.static_check(NUL) == "syntax error: source code string cannot contain null bytes"


def test_a_nul_byte_is_a_one_line_rejection_on_debian_12s_python():
    """The contract under /usr/bin/python3 (Debian 12's 3.11.2, which install.sh accepts and whose ast.parse raises
    ValueError, not SyntaxError, for a NUL byte): CI's 3.11.7 alone would never see that path."""
    python = "/usr/bin/python3"
    if not os.access(python, os.X_OK):
        pytest.skip(f"no {python} here: the contract is checked on this interpreter only")
    version = subprocess.run([python, "-c", "import sys; print(sys.version_info[:2] == (3, 11))"],
                             capture_output=True, text=True).stdout.strip()
    if version != "True":
        pytest.skip(f"{python} is not a Python 3.11, which install.sh accepts")
    script = ("import sys; from lib.contract import static_check; "
              f"print(sys.version.split()[0]); print(static_check({NUL!r}))")
    out = subprocess.run([python, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    version, reason = out.stdout.splitlines()
    assert reason == "syntax error: source code string cannot contain null bytes", (version, reason)
