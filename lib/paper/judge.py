"""SearchQA's LLM judge, the official rule through any OpenAI-compatible chat endpoint (lib/paper/web.py).

    judge = Judge("https://api.openai.com/v1", "gpt-5.4-mini", key, cache_path="run/judge_cache.jsonl")
    judge.verdict(question, gold_answers, prediction, fallback=exact_match)   # 1 or 0

As the official judge (krafton-ai/WHALE, domains/chess_puzzles/verl/utils/reward_score/llm_judge.py, the only
copy): one user message, temperature 0, at most 256 completion tokens, 3 attempts with a backoff of 1 s then
2 s, a reply whose first word is neither CORRECT nor INCORRECT counts as a failed attempt, and when every attempt
fails the caller's exact match decides.

The prompt (PROMPT) is the project's own wording, not the official "V11" text, which is not copied here. It
keeps every rule of V11, in V11's order (docs/fidelity.md, "searchqa's judge"): CORRECT for (1) surface
variation (case, articles, punctuation), (2) an alias, abbreviation or short / full form, (3) a qualifier
added or removed, (4) a less specific date or place contained in the reference, (5) another number or unit
form, (6) another framing of the same place or feature, (7) a self-correcting answer that commits to a match;
INCORRECT for (a) a different person, place, work, team, organisation or year, (b) a number or date where
neither contains the other, (c) a contradiction or opposite meaning, (d) another entity type, (e) no
commitment (only explanation or disclaimer), (f) several candidates listed, even with the right one among
them, (g) a pasted passage or document holding the answer; then the question, the reference answers joined by
" | ", the prediction, and a one-word reply. What the wording can change: V11's examples ('Pete' = 'Peter',
'Gulf of California' = 'between Baja California and Sonora', "Doc N (Title: ...)" passages) are not ours, and
a judge model reads any two wordings a little differently, so a few borderline verdicts, and with them
searchqa's scores, can differ from the official judge's. To run another prompt, the official text included,
pass --judge-prompt FILE: a text file with the fields {question}, {gold} and {prediction}.

Each verdict is kept per (question, answer) in memory and, with cache_path, in a JSON Lines file under the
judge's model and prompt, so a resumed run asks nothing twice; a fallback is not kept, so the judge is asked
again next time.
"""
import hashlib
import json
import os
import re
import threading
import time

from lib.paper import web

ATTEMPTS = 3
BACKOFF_S = (1.0, 2.0)  # before the second and the third attempt
MAX_TOKENS = 256  # room for a reasoning model's hidden tokens before its one word
TIMEOUT_S = 60.0

PROMPT = """You judge answers to factual questions.

Say CORRECT when the predicted answer names the same entity, value or fact as any one of the reference answers.
These are still CORRECT:
- a difference in case, articles or punctuation;
- an alias, an abbreviation, a short or a full form of the same name;
- a qualifier added or left out ("the singer X" for "X");
- a less specific date or place that the reference contains ("1969" for "July 20, 1969", "Lyon" for
  "Lyon, France");
- another way to write the same number or unit ("twelve" for "12", "3 km" for "3 kilometres");
- another description of the same place or feature;
- an answer that weighs alternatives but settles on one that matches.

Say INCORRECT when:
- it names a different person, place, work, team, organisation or year;
- a number or date differs and neither contains the other;
- it contradicts the reference or means the opposite;
- it is an entity of another type, even a related one (a country for its capital, a film for its director);
- it commits to no answer (only an explanation or a disclaimer);
- it lists several candidates (joined by "/", "|", commas or "or"), even when one of them matches;
- it is a passage or a quoted document that contains the reference rather than a short answer.

Question: {question}
Reference answer(s): {gold}
Predicted answer: {prediction}

Reply with one word: CORRECT or INCORRECT."""


def parse_verdict(text):
    """1 for CORRECT, 0 for INCORRECT (the reply's first word), None for anything else."""
    word = re.search(r"[A-Za-z]+", text or "")
    return {"CORRECT": 1, "INCORRECT": 0}.get(word.group(0).upper()) if word else None


def chat_url(url):
    """The chat completions endpoint of a base URL (".../v1") or of the endpoint itself."""
    url = url.rstrip("/")
    return url if url.endswith("/chat/completions") else url + "/chat/completions"


def read_prompt(path):
    """--judge-prompt's text, checked: a readable file with each of {question}, {gold} and {prediction}."""
    try:
        text = open(path, encoding="utf-8").read()
    except OSError as e:
        raise ValueError(f"--judge-prompt {path}: cannot read it ({e.strerror}): pass a text file") from None
    missing = [field for field in ("{question}", "{gold}", "{prediction}") if field not in text]
    if missing:
        raise ValueError(f"--judge-prompt {path}: no {', '.join(missing)} in it: the judge's prompt needs the fields "
                         "{question}, {gold} and {prediction} (other braces doubled: {{ }})")
    try:
        text.format(question="", gold="", prediction="")
    except (KeyError, IndexError, ValueError) as e:
        raise ValueError(f"--judge-prompt {path}: braces other than the three fields ({e}): double them, "
                         "{{ }}") from None
    return text


def prompt_id(prompt):
    """A prompt's short sha256: what the verdict cache files each verdict under."""
    return hashlib.sha256(prompt.encode()).hexdigest()[:16]


class Judge:
    def __init__(self, url, model, key=None, cache_path=None, timeout=TIMEOUT_S, prompt=PROMPT):
        self.url, self.model, self.key, self.timeout = chat_url(url), model, key, timeout
        self.prompt, self.prompt_id = prompt, prompt_id(prompt)
        self.cache_path = cache_path
        self.cache = {}  # (question, prediction) -> 0 or 1
        self.lock = threading.Lock()
        self.requests = 0  # HTTP requests sent, attempts included
        self.fallbacks = 0  # verdicts that fell back to exact match
        if cache_path and os.path.exists(cache_path):
            with open(cache_path, encoding="utf-8") as f:
                for line in f:
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError:
                        continue  # a line cut by a kill: that verdict is asked again
                    # another model's or prompt's verdicts are not ours (a row without a prompt: PROMPT's)
                    if (isinstance(row, dict) and row.get("model") == model
                            and row.get("prompt", prompt_id(PROMPT)) == self.prompt_id):
                        self.cache[(row["question"], row["answer"])] = int(row["verdict"])

    def verdict(self, question, gold, prediction, fallback):
        """1 or 0 for a prediction against the gold answers; `fallback` (exact match) when the judge fails."""
        key = (str(question), str(prediction).strip())
        with self.lock:
            if key in self.cache:
                return self.cache[key]
        found = self.ask(self.prompt.format(question=key[0], gold=" | ".join(map(str, gold)), prediction=key[1]))
        if found is None:
            with self.lock:
                self.fallbacks += 1
                if self.fallbacks == 1 or self.fallbacks % 100 == 0:
                    print(f"judge: {self.url} failed {ATTEMPTS} times ({self.fallbacks} so far): exact match used")
            return int(fallback)
        with self.lock:
            self.cache[key] = found
            if self.cache_path:
                os.makedirs(os.path.dirname(os.path.abspath(self.cache_path)), exist_ok=True)
                with open(self.cache_path, "a", encoding="utf-8") as f:
                    f.write(json.dumps({"model": self.model, "prompt": self.prompt_id, "question": key[0],
                                        "answer": key[1], "verdict": found}) + "\n")
        return found

    def ask(self, prompt):
        """The verdict of up to ATTEMPTS requests, or None when none gives one."""
        for attempt in range(ATTEMPTS):
            if attempt:
                time.sleep(BACKOFF_S[attempt - 1])
            try:
                found = parse_verdict(self.post(prompt))
            except Exception:  # any failure (HTTP, network, a malformed reply) is a failed attempt, never a crash
                found = None
            if found is not None:
                return found
        return None

    def post(self, prompt):
        body = {"model": self.model, "messages": [{"role": "user", "content": prompt}], "temperature": 0.0,
                "max_completion_tokens": MAX_TOKENS}
        with self.lock:
            self.requests += 1
        return web.request_json(self.url, body, key=self.key, timeout=self.timeout)["choices"][0]["message"]["content"]


JUDGE_GROUP = ("searchqa's LLM judge (the official docs' verifier; off by default, as in the official code: exact "
               "match)")
# as (flag, argparse keywords): domains.add_args adds them
FLAGS = [
    ("--judge-url", dict(default=None, help="searchqa: an OpenAI-compatible endpoint, e.g. "
                         "https://api.openai.com/v1, for the LLM judge the official docs name (its rules in "
                         "the project's wording: lib/paper/judge.py; default: exact match)")),
    ("--judge-model", dict(default="gpt-5.4-mini", help="the judge's model (the official default)")),
    ("--judge-key-env", dict(default="OPENAI_API_KEY", help="environment variable holding the judge's key")),
    ("--judge-prompt", dict(default=None, help="the judge's prompt from this text file, with the fields {question}, "
                            "{gold} and {prediction} (default: lib/paper/judge.py PROMPT, the project's wording of the "
                            "official rules)")),
]


def judge_from_flags(flags, out=None):
    """The judge of --judge-url/--judge-model/--judge-key-env, caching under the run folder `out`; None without
    --judge-url."""
    if not getattr(flags, "judge_url", None):
        return None
    key = os.environ.get(flags.judge_key_env) if flags.judge_key_env else None
    if flags.judge_key_env and not key:
        print(f"judge: ${flags.judge_key_env} is not set: requests to {flags.judge_url} go without a key")
    prompt = read_prompt(flags.judge_prompt) if flags.judge_prompt else PROMPT
    return Judge(flags.judge_url, flags.judge_model, key, os.path.join(out, "judge_cache.jsonl") if out else None,
                 prompt=prompt)
