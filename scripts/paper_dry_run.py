"""The parts of the paper dry run (scripts/paper_dry_run.sh) that are Python: fixtures in the official data
schemas, the tiny Qwen3.5 model taught its reply formats, a stand-in of Search-R1's retrieval server, a stand-in
coding agent for `--proposer command`, and the check of a finished run folder.

    python scripts/paper_dry_run.py fixtures DIR          # DIR/searchqa (wiki-18.jsonl.gz there too), DIR/math, DIR/chess
    python scripts/paper_dry_run.py model                 # the taught tiny Qwen3.5: built once, cached; prints its folder
    python scripts/paper_dry_run.py retriever CORPUS PORT_FILE   # its queries logged in PORT_FILE.queries
    python scripts/paper_dry_run.py agent WORKDIR         # what --proposer-cmd runs, in the sandbox (stdlib only)
    python scripts/paper_dry_run.py verify RUN_DIR DOMAIN [QUERIES]

The fixtures are invented (an encyclopedia of made-up countries, sums, random legal chess lines) in the columns
the hub files have: Search-R1's nq_hotpotqa_train, FlashRAG's per-set files, wiki-18's {"id", "contents"},
DAPO-Math-17k, AIME 2024 / 2025 and the Lichess puzzle CSV; the train and AIME files as parquet where `datasets`
is installed (as on the hub), else jsonl; FlashRAG's and wiki-18's as jsonl, as they are on the hub.
"""
import argparse
import gzip
import http.server
import json
import os
import random
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # lib/ (the agent needs none of it: it runs in the sandbox, which shows it only this file)

# an encyclopedia of invented countries: half of the capitals are Quelm, the answer the taught model gives, so
# some episodes are correct and RSFT has something to accept
COUNTRIES = [("Zorbia", "Quelm"), ("Talvia", "Ost"), ("Merosh", "Quelm"), ("Dunvale", "Brisk"), ("Callon", "Quelm"),
             ("Ferrin", "Ymir"), ("Ostria", "Quelm"), ("Varnay", "Lode"), ("Pellis", "Quelm"), ("Kordan", "Nim"),
             ("Saelor", "Quelm"), ("Brevia", "Tull"), ("Hestmar", "Quelm"), ("Ulden", "Fane"), ("Rovia", "Quelm"),
             ("Ketterow", "Dask")]
SEARCH_REPLY = ('<tool_call>\n<function=search>\n<parameter=query_list>\n["{question}"]\n</parameter>\n</function>\n'
                '</tool_call>')
ANSWER_REPLY = "<answer>Quelm</answer>"
CODE_REPLY = ('<tool_call>\n<function=code_interpreter>\n<parameter=code>\nprint(6 * 7)\n</parameter>\n</function>\n'
              '</tool_call>')
BOXED_REPLY = "The code printed 42. \\boxed{42}"
TAUGHT_MODEL = "qwen35-tiny-taught-v2"  # its cache folder: a new name whenever the teaching or tests/fixtures/qwen35.QWEN35_TINY changes


# -----------------------------------------------------------------------------
# fixtures


def write_rows(path, rows):
    """rows as path.parquet where `datasets` is installed (the hub files' format), else as path.jsonl."""
    from lib.common.json_files import write_jsonl
    try:
        import datasets
        datasets.Dataset.from_list(rows).to_parquet(f"{path}.parquet")
    except ImportError:
        write_jsonl(f"{path}.jsonl", rows)


def searchqa_fixtures(folder):
    """Search-R1's train rows (its verl columns), FlashRAG's nq/test and hotpotqa/dev, and the wiki-18 corpus."""
    from lib.common.json_files import write_jsonl
    questions = [(f"What is the capital of {c}?", a) for c, a in COUNTRIES]
    train = [{"id": f"train_{i}", "question": q, "golden_answers": [a], "data_source": ("nq", "hotpotqa")[i % 2],
              "prompt": [{"role": "user", "content": f"Answer the given question. Question: {q}"}],
              "ability": "fact-reasoning", "reward_model": {"style": "rule", "ground_truth": {"target": [a]}},
              "extra_info": {"split": "train", "index": i}, "metadata": None} for i, (q, a) in enumerate(questions)]
    write_rows(f"{folder}/searchqa_train", train)
    for config, split in (("nq", "test"), ("hotpotqa", "dev")):
        os.makedirs(f"{folder}/flashrag/{config}", exist_ok=True)
        write_jsonl(f"{folder}/flashrag/{config}/{split}.jsonl", [
            {"id": f"{split}_{i}", "question": q, "golden_answers": [a], "metadata": {}} for i, (q, a) in enumerate(questions[:6])])
    with gzip.open(f"{folder}/wiki-18.jsonl.gz", "wt") as f:
        for i, (country, capital) in enumerate(COUNTRIES):
            text = f"{country} is a country whose capital is {capital}, on the river Ost."
            f.write(json.dumps({"id": str(i), "contents": f'"{country}"\n{text}'}) + "\n")


def math_fixtures(folder):
    """DAPO-Math-17k (its prompt template, each problem twice as the release repeats them), AIME 2024 and 2025."""
    from lib.paper.paper_data import DAPO_PREFIX, DAPO_SUFFIX
    problems = [(f"A box holds {a} rows of {b} tiles. How many tiles are in the box?", a * b)
                for a, b in ((6, 7), (3, 9), (7, 6), (4, 5), (2, 21), (8, 3), (14, 3), (5, 5))]
    dapo = [{"data_source": "math_dapo", "prompt": [{"content": DAPO_PREFIX + q + DAPO_SUFFIX, "role": "user"}],
             "ability": "MATH", "reward_model": {"ground_truth": str(n), "style": "rule-lighteval/MATH_v2"},
             "extra_info": {"index": f"{i:04d}"}} for i, (q, n) in enumerate(problems)]
    write_rows(f"{folder}/dapo_math_17k", dapo + dapo)
    write_rows(f"{folder}/aime_2024", [{"ID": f"2024-I-{i + 1}", "Problem": q, "Solution": "", "Answer": n}
                                       for i, (q, n) in enumerate(problems[:2])])
    write_rows(f"{folder}/aime_2025", [{"id": i, "problem": q, "answer": str(n), "solution": "", "url": "", "year": 2025}
                                       for i, (q, n) in enumerate(problems[2:4])])


def chess_fixtures(folder, n=60, seed=0):
    """Lichess puzzle CSV rows: a random legal game, a trigger move and a 1-3 ply random legal 'solution'."""
    import chess
    rng, rows = random.Random(seed), []
    while len(rows) < n:
        board = chess.Board()
        for _ in range(rng.randint(4, 24)):
            board.push(rng.choice(list(board.legal_moves)))
        fen, moves = board.fen(), []
        for _ in range(rng.randint(2, 4)):
            if board.is_game_over():
                break
            moves.append(rng.choice(list(board.legal_moves)))
            board.push(moves[-1])
        if len(moves) >= 2:
            rows.append({"PuzzleId": f"dry{len(rows):03d}", "FEN": fen, "Moves": " ".join(m.uci() for m in moves),
                         "Rating": 1500, "RatingDeviation": 80, "Popularity": 90, "NbPlays": 100,
                         "Themes": "middlegame short", "GameUrl": "", "OpeningTags": ""})
    with open(f"{folder}/lichess_db_puzzle.csv", "w") as f:
        f.write(",".join(rows[0]) + "\n")
        f.writelines(",".join(str(v) for v in r.values()) + "\n" for r in rows)


def fixtures(folder):
    for name, write in (("searchqa", searchqa_fixtures), ("math", math_fixtures), ("chess", chess_fixtures)):
        os.makedirs(f"{folder}/{name}", exist_ok=True)
        write(f"{folder}/{name}")


# -----------------------------------------------------------------------------
# the tiny Qwen3.5, taught the official h0s' reply formats (about a minute, once: cached)


def teaching_chats():
    """(messages, tools, reply) under the official searchqa and math h0s' prompts: a tool call, then the answer."""
    import importlib.util
    from lib.paper.paper_data import DAPO_PREFIX, DAPO_SUFFIX
    def h0(path):
        spec = importlib.util.spec_from_file_location("h0", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    sq, ma = (h0(os.path.join(ROOT, "harnesses", "paper", f"{name}.py")) for name in ("searchqa", "math"))
    country, _ = COUNTRIES[0]
    question = f"What is the capital of {country}?"
    search = [{"role": "system", "content": sq.SYSTEM_PROMPT},
              {"role": "user", "content": sq.USER_TEMPLATE.format(question=question)}]
    call = SEARCH_REPLY.format(question=question)
    passage = json.dumps({"result": f'Doc 1 (Title: "{country}")\n{country} is a country whose capital is Quelm.'})
    chats = [(search, sq.TOOLS, call),
             (search + [{"role": "assistant", "content": call}, {"role": "tool", "content": passage}], sq.TOOLS, ANSWER_REPLY)]
    problem = "A box holds 6 rows of 7 tiles. How many tiles are in the box?"
    for question in (problem, DAPO_PREFIX + problem + DAPO_SUFFIX):  # as AIME asks it (test), as DAPO does (train)
        code = [{"role": "user", "content": ma.USER_TEMPLATE.format(question=question)}]
        chats += [(code, ma.TOOLS, CODE_REPLY),
                  (code + [{"role": "assistant", "content": CODE_REPLY}, {"role": "tool", "content": "42\n"}], ma.TOOLS,
                   BOXED_REPLY)]
    return chats


def build_model(folder, steps=200):
    """build_qwen35_tiny, then `steps` full-batch AdamW steps on the teaching chats' replies (prompt tokens masked),
    so that sampled episodes call the tools and some answer right; saved in the hub checkpoint layout."""
    import torch
    from transformers import AutoTokenizer, Qwen3_5ForConditionalGeneration
    from lib.backends.models import chat_ids
    from tests.fixtures.qwen35 import build_qwen35_tiny
    build_qwen35_tiny(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    model = Qwen3_5ForConditionalGeneration.from_pretrained(folder, dtype=torch.float32)
    rows = []
    for messages, tools, reply in teaching_chats():
        prompt = chat_ids(tok, messages, tools, thinking=False)
        target = tok(reply + "<|im_end|>", add_special_tokens=False)["input_ids"]
        rows.append((prompt + target, [-100] * len(prompt) + target))
    width = max(len(ids) for ids, _ in rows)
    ids = torch.tensor([x + [tok.pad_token_id] * (width - len(x)) for x, _ in rows])
    labels = torch.tensor([y + [-100] * (width - len(y)) for _, y in rows])
    mask = (torch.arange(width)[None] < torch.tensor([len(x) for x, _ in rows])[:, None]).long()
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3)
    for _ in range(steps):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    print(f"taught {len(rows)} replies ({width} tokens at most) for {steps} steps: loss {loss.item():.3f}")
    model.save_pretrained(folder)


# -----------------------------------------------------------------------------
# Search-R1's retrieval server, as a stand-in: the same request and response over word overlap


def words(text):
    return set(re.findall(r"\w+", text.lower()))


def retriever(corpus, port_file):
    """A server (not yet serving) answering POST /retrieve {"queries": [...], "topk": k, "return_scores": bool} with
    {"result": [[{"document": {"id", "contents"}, "score": s}, ...] per query]} (without return_scores: the
    documents themselves), as search_r1/search/retrieval_server.py does; it has written its port to port_file and
    logs each query to port_file.queries."""
    with gzip.open(corpus, "rt") as f:
        docs = [(json.loads(line), words(line)) for line in f]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            result = []
            for query in body["queries"]:
                scored = sorted(((len(words(query) & w), d) for d, w in docs), key=lambda x: -x[0])[:body.get("topk", 3)]
                result.append([{"document": d, "score": float(n)} if body.get("return_scores") else d for n, d in scored])
            payload = json.dumps({"result": result}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            with open(f"{port_file}.queries", "a") as f:
                f.writelines(q + "\n" for q in body["queries"])

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    with open(f"{port_file}.tmp", "w") as f:
        f.write(str(server.server_address[1]))
    os.replace(f"{port_file}.tmp", port_file)
    return server


# -----------------------------------------------------------------------------
# a coding agent, as a stand-in: one prompt edit per candidate


def read_json(path):  # not lib.common's: the agent runs in the sandbox, which shows it this file only
    with open(path) as f:
        return json.load(f)


def agent(workdir):
    """Each candidate folder the search left unproposed gets its parent's harness with a sentence added to the
    system prompt (a different one per candidate), and a hypothesis in meta.json."""
    folders = sorted(os.path.join(workdir, "candidates", d) for d in os.listdir(os.path.join(workdir, "candidates")))
    fresh = [d for d in folders if not read_json(os.path.join(d, "meta.json")).get("proposed")]
    for i, folder in enumerate(fresh):
        path = os.path.join(folder, "harness.py")
        sentence = ("Answer briefly.", "Check your answer once.", "Use the tools when they help.")[i % 3]
        with open(path, "a") as f:
            f.write(f"\nSYSTEM_PROMPT = (SYSTEM_PROMPT + ' ' + {sentence!r}).strip()\n")
        meta_path = os.path.join(folder, "meta.json")
        meta = read_json(meta_path)
        meta.update(hypothesis=f"adding {sentence!r} to the system prompt helps", changed="system prompt")
        with open(meta_path, "w") as f:
            json.dump(meta, f)
    with open(os.path.join(workdir, "notes.md"), "a") as f:
        f.write(f"## dry-run agent\nedited {len(fresh)} candidates\n")
    print(f"dry-run agent: edited {len(fresh)} candidates")


# -----------------------------------------------------------------------------
# the check of a finished run


def verify(run_dir, domain, queries=None):
    """'ok DOMAIN ...' when the run went through every phase kind of the gpu preset (start evaluation, weight,
    harness with its re-score and a proposer round, weight, each with a test evaluation) and its RSFT steps
    trained and its test episodes called their tools where the taught model can (searchqa, math); else
    'FAIL DOMAIN why'."""
    from lib.common.json_files import read_jsonl
    evals = [r for r in read_jsonl(f"{run_dir}/metrics.jsonl") if r.get("event") == "eval"]
    steps = read_jsonl(f"{run_dir}/weights/metrics.jsonl")
    archives = sorted(d for d in os.listdir(run_dir) if d.startswith("harness_w"))
    index = read_jsonl(f"{run_dir}/{archives[0]}/summary.jsonl") if archives else []
    kinds = [r["kind"] for r in evals]
    problems = []
    if not os.path.exists(f"{run_dir}/summary.json"):
        problems.append("no summary.json")
    if kinds != ["start", "weight", "harness", "weight"]:
        problems.append(f"phases {kinds}, not start, weight, harness, weight")
    if any(not r.get("test_tasks") for r in evals):
        problems.append("an evaluation without test tasks")
    rescored = [r for r in index if r.get("name") == "h0" and r.get("score") is not None]
    proposed = [r for r in index if r.get("proposer") == "command" and r.get("score") is not None]
    if not rescored or not proposed:
        problems.append(f"archive: h0 re-scored {bool(rescored)}, {len(proposed)} command candidates scored")
    traces = [r for name in sorted(os.listdir(f"{run_dir}/evals")) if name.endswith(".traces.jsonl")
              for r in read_jsonl(f"{run_dir}/evals/{name}")] if os.path.isdir(f"{run_dir}/evals") else []
    tool_calls = sum(len(r.get("tool_calls") or []) for r in traces)
    if domain != "chess" and not tool_calls:
        problems.append(f"no tool call ran in {len(traces)} test episodes")
    if queries is not None:  # the preflight's own probe aside, the run's searches must have reached the server
        from lib.ops.preflight import PROBE_QUERY
        logged = []
        if os.path.exists(queries):
            with open(queries) as f:
                logged = f.read().splitlines()
        if not [q for q in logged if q != PROBE_QUERY]:
            problems.append("no search of the run reached the retrieval server")
    trained = sum(r.get("optimizer_steps") or 0 for r in steps)
    if domain != "chess" and not trained:
        problems.append(f"{len(steps)} RSFT steps and no update (accepted {[r.get('examples') for r in steps]})")
    if problems:
        print(f"FAIL {domain} ({'; '.join(problems)})")
        return 1
    print(f"ok {domain} (phases {', '.join(kinds)}; {tool_calls} tool calls in {len(traces)} test episodes; "
          f"{len(steps)} RSFT steps, {trained} updates, accepted "
          f"{sum(r.get('examples') or 0 for r in steps)} examples; h0 re-scored {rescored[0]['score']:.2f}, "
          f"{len(proposed)} candidates scored; test {evals[-1]['test_tasks']} tasks, mean@k {evals[-1]['mean_at_k']:.2f})")
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("fixtures").add_argument("folder")
    sub.add_parser("model")
    r = sub.add_parser("retriever")
    r.add_argument("corpus")
    r.add_argument("port_file")
    sub.add_parser("agent").add_argument("workdir")
    v = sub.add_parser("verify")
    v.add_argument("run_dir")
    v.add_argument("domain")
    v.add_argument("queries", nargs="?", help="the retrieval server's query log: some must be the run's")
    a = p.parse_args()
    if a.command == "fixtures":
        fixtures(a.folder)
    elif a.command == "model":
        from lib.backends.models import cached
        print(cached(TAUGHT_MODEL, build_model))
    elif a.command == "retriever":
        retriever(a.corpus, a.port_file).serve_forever()
    elif a.command == "agent":
        agent(a.workdir)
    else:
        sys.exit(verify(a.run_dir, a.domain, a.queries))
