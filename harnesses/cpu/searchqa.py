"""SearchQA h0 of the cpu preset: the bundled h0 (below) with the fewest SEARCH_SPACE changes under which
SmolLM2-135M earns a small training reward, as the paper's base model does under its h0: SEARCH_FIRST = True and
one worked example (EXAMPLES). Every single change scored at most 2 % (README, "Calibrating the cpu preset");
these two give 21.9 % of 64 training rollouts (scripts/calibrate_cpu_h0.py; docs/cpu-run/paper-regime.md).
SKILL tells the offline proposer (--mutate-order traces) which knobs to try first for each failure kind.

SearchQA h0 (Search-R1 style): the model may search once, reading the top-1 passage, then answers in <answer> tags.

Each turn the model either writes <search>query</search> (only the first query is run; the top TOP_K
passages, each cut to PASSAGE_WORDS words, come back inside INFO_TEMPLATE) or <answer>...</answer>, which
ends the episode. At most MAX_TURNS model calls. h0's values are the paper's; SEARCH_SPACE also holds what a
coding agent would try on a small model that never writes the tags: search with the question before the
first call (SEARCH_FIRST), worked examples shown as earlier turns (EXAMPLES), read the answer from the first
or last line (ANSWER_FROM), stop sequences (STOP). String knobs are prompt text only (what --prompt-only may
change); every other knob is a bool, number, list or None.
"""
import re

SYSTEM_PROMPT = ("Answer the question. You may search an encyclopedia by writing <search>query</search>. "
                 "Give the final answer, a few words only, as <answer>answer</answer>.")
USER_TEMPLATE = "Question: {question}"
INFO_TEMPLATE = "<information>{passages}</information>"
MAX_TURNS = 2
TOP_K = 1
PASSAGE_WORDS = 150  # about 200 tokens
MAX_TOKENS = 500  # Search-R1's cap per turn (max_response_length)
SEARCH_FIRST = True  # True: search with the question itself before the first call; its passages open the first turn
# worked examples [question, passage, answer], shown as earlier turns in this harness's own format
EXAMPLES = [["Where was Ann Vo born?",
             "Ann Vo: Ann Vo was a poet born in Tarsk in 1802. Vo is best known for the work The Grey Lanterns.", "Tarsk"]]
ANSWER_FROM = ["tag"]  # where the answer is read, first hit wins: "tag" (<answer>), "first_line", "last_line"
STOP = ["</search>", "</answer>"]  # as Search-R1: generation ends at the first (kept as the reply's end)

# literal values only: the offline proposer reads this with ast.literal_eval; in its order of priority (mutate
# tries knobs in this order with --mutate-order listed, by default in an order drawn from --seed): the fixes
# for the failures named above first, prompt wording last
SEARCH_SPACE = {
    "SEARCH_FIRST": [False, True],
    "EXAMPLES": [
        [],
        [["Where was Ann Vo born?",
          "Ann Vo: Ann Vo was a poet born in Tarsk in 1802. Vo is best known for the work The Grey Lanterns.", "Tarsk"]],
        [["Where was Ann Vo born?",
          "Ann Vo: Ann Vo was a poet born in Tarsk in 1802. Vo is best known for the work The Grey Lanterns.", "Tarsk"],
         ["In what year was the Kelmar Society founded?",
          "The Kelmar Society: The Kelmar Society was founded in 1877 by Ann Vo in the city of Tarsk.", "1877"],
         ["What is the currency of Olberia?",
          "Olberia: Olberia is a country. Its capital is Tarsk. Its currency is the dorin.", "dorin"]],
    ],
    "ANSWER_FROM": [["tag"], ["tag", "first_line"], ["tag", "last_line"], ["first_line"]],
    "STOP": [None, ["</search>", "</answer>"], ["\n"]],
    "TOP_K": [1, 3, 5],
    "PASSAGE_WORDS": [40, 80, 150, 300],
    "MAX_TURNS": [2, 3, 4],
    "MAX_TOKENS": [64, 128, 500],
    "SYSTEM_PROMPT": [
        "Answer the question. You may search an encyclopedia by writing <search>query</search>. "
        "Give the final answer, a few words only, as <answer>answer</answer>.",
        "Search first: write <search>name</search> with the name the question asks about. "
        "Then reply with only <answer>answer</answer>, the answer being a few words copied from the passage.",
        "Answer questions with the encyclopedia. Example:\nQuestion: Where was Ann Vo born?\n"
        "You: <search>Ann Vo</search>\n<information>Ann Vo: Ann Vo was a poet born in Tarsk.</information>\n"
        "You: <answer>Tarsk</answer>",
        "You answer questions about an encyclopedia you cannot see. Step 1: write <search>the name in the "
        "question</search>. Step 2: after the passage, write <answer>the short answer</answer>. Nothing else.",
        "Answer the question in as few words as possible. If you do not know it, search with "
        "<search>query</search>; put the final answer as <answer>answer</answer>.",
        "Answer with words copied from the passage. Use <search>query</search> to get a passage and "
        "<answer>answer</answer> to answer. Do not explain.",
        "Find the answer in the encyclopedia. Search with <search>query</search>, the query being the name of the "
        "person, place or organisation the question is about. Answer with <answer>answer</answer>: one name, word or year.",
        "",
    ],
    "USER_TEMPLATE": ["Question: {question}", "{question}", "Question: {question}\nAnswer in a few words.",
                      "Question: {question}\nFirst search, then answer.", "Q: {question}\nA:",
                      "Question: {question}\nThe answer is a name, a word or a year."],
    "INFO_TEMPLATE": ["<information>{passages}</information>",
                      "<information>{passages}</information>\nSearch again or give <answer>answer</answer>.",
                      "<information>{passages}</information>\nNow give the answer as <answer>answer</answer>, "
                      "copied from the passage.",
                      "Passage: {passages}", "<information>{passages}</information>\nAnswer in a few words.",
                      "Search result:\n{passages}"],
}

# failure kind (lib/failures.py) -> the knobs a harness author would change first for it; the offline proposer
# (--mutate-order traces) tries those of the kind most frequent in a candidate's harness-set traces first
SKILL = {
    "erred": ["MAX_TURNS", "MAX_TOKENS"],
    "cut": ["STOP", "ANSWER_FROM", "EXAMPLES", "MAX_TOKENS"],
    "no_answer": ["ANSWER_FROM", "STOP", "EXAMPLES", "SYSTEM_PROMPT", "USER_TEMPLATE"],
    "no_tool": ["SEARCH_FIRST", "EXAMPLES", "INFO_TEMPLATE", "TOP_K", "SYSTEM_PROMPT"],
    "wrong": ["TOP_K", "PASSAGE_WORDS", "INFO_TEMPLATE", "MAX_TURNS", "EXAMPLES"],
}


def first_tag(text, tag):
    match = re.search(rf"<{tag}>(.*?)</{tag}>", text, re.DOTALL)
    return match.group(1).strip() if match else None


def cut_words(text, n):
    words = text.split()
    return " ".join(words[:n]) + (" ..." if len(words) > n else "")


def read_answer(reply):
    """The answer from the first reader of ANSWER_FROM that finds one, else None (lines lose tags and "Answer:")."""
    lines = [re.sub(r"</?\w+>", "", line).strip() for line in reply.splitlines()]
    lines = [re.sub(r"^answer\s*:\s*", "", line, flags=re.IGNORECASE) for line in lines if line]
    found = {"tag": first_tag(reply, "answer"), "first_line": lines[0] if lines else None,
             "last_line": lines[-1] if lines else None}
    return next((found[where] for where in ANSWER_FROM if found.get(where)), None)


def information(passages):
    return INFO_TEMPLATE.format(passages="\n".join(cut_words(p, PASSAGE_WORDS) for p in passages) or "no results")


def example_turns(question, passage, answer):
    """One worked example as the turns this harness itself would produce."""
    reply = f"<answer>{answer}</answer>" if ANSWER_FROM[0] == "tag" else answer
    if SEARCH_FIRST:
        return [{"role": "user", "content": information([passage]) + "\n" + USER_TEMPLATE.format(question=question)},
                {"role": "assistant", "content": reply}]
    return [{"role": "user", "content": USER_TEMPLATE.format(question=question)},
            {"role": "assistant", "content": f"<search>{passage.split(':')[0]}</search>"},
            {"role": "user", "content": information([passage])},
            {"role": "assistant", "content": reply}]


def ask(llm, messages):
    # stop= only when set: the runner's llm() takes it once stop sequences land
    return llm(messages, max_tokens=MAX_TOKENS, **({"stop": STOP} if STOP else {}))


def run(task, llm, tools):
    question = USER_TEMPLATE.format(question=task["question"])
    if SEARCH_FIRST:
        question = information(tools.search(task["question"], TOP_K)) + "\n" + question
    messages = [{"role": "system", "content": SYSTEM_PROMPT}] if SYSTEM_PROMPT else []
    for example in EXAMPLES:
        messages += example_turns(*example)
    messages.append({"role": "user", "content": question})
    for _ in range(MAX_TURNS):
        reply = ask(llm, messages)
        answer = first_tag(reply, "answer") if "tag" in ANSWER_FROM else None
        if answer is not None:
            return {"answer": answer}
        query = first_tag(reply, "search")
        if query is None:
            answer = read_answer(reply)
            return {"answer": answer} if answer else {"answer": None, "note": "no search and no answer"}
        # keep the reply only up to its first search call: what follows was not seen by the search
        messages.append({"role": "assistant", "content": reply[:reply.index("</search>") + len("</search>")]})
        messages.append({"role": "user", "content": information(tools.search(query, TOP_K))})
    return {"answer": None, "note": "turn budget spent"}
