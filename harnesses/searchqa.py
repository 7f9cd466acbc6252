"""SearchQA h0 (Search-R1 style): the model may search once, reading the top-1 passage, then answers in <answer> tags.

Each turn the model either writes <search>query</search> (only the first query is run; the top
TOP_K passages, each cut to about PASSAGE_WORDS words, come back inside <information> tags) or
<answer>...</answer>, which ends the episode. At most MAX_TURNS model calls.
"""
import re

SYSTEM_PROMPT = ("Answer the question. You may search an encyclopedia by writing <search>query</search>. "
                 "Give the final answer, a few words only, as <answer>answer</answer>.")
USER_TEMPLATE = "Question: {question}"
INFO_TEMPLATE = "<information>{passages}</information>"
MAX_TURNS = 2
TOP_K = 1
PASSAGE_WORDS = 150  # about 200 tokens
MAX_TOKENS = 128
ANSWER_FROM_LAST_LINE = False  # h0 reads answers from tags only; True: a reply without tags answers with its last line

SEARCH_SPACE = {  # literal values only: the offline proposer reads this with ast.literal_eval
    "SYSTEM_PROMPT": [
        "Answer the question. You may search an encyclopedia by writing <search>query</search>. "
        "Give the final answer, a few words only, as <answer>answer</answer>.",
        "Search first: write <search>name</search> with the name the question asks about. "
        "Then reply with only <answer>answer</answer>, the answer being a few words copied from the passage.",
        "Answer questions with the encyclopedia. Example:\nQuestion: Where was Ann Vo born?\n"
        "You: <search>Ann Vo</search>\n<information>Ann Vo: Ann Vo was a poet born in Tarsk.</information>\n"
        "You: <answer>Tarsk</answer>",
    ],
    "INFO_TEMPLATE": ["<information>{passages}</information>",
                      "<information>{passages}</information>\nSearch again or give <answer>answer</answer>."],
    "MAX_TURNS": [2, 3, 4, 6],
    "TOP_K": [1, 2, 3, 5],
    "PASSAGE_WORDS": [60, 150, 300],
    "MAX_TOKENS": [64, 128, 256],
    "ANSWER_FROM_LAST_LINE": [False, True],
}


def first_tag(text, tag):
    match = re.search(rf"<{tag}>(.*?)</{tag}>", text, re.DOTALL)
    return match.group(1).strip() if match else None


def cut_words(text, n):
    words = text.split()
    return " ".join(words[:n]) + (" ..." if len(words) > n else "")


def run(task, llm, tools):
    messages = [{"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": USER_TEMPLATE.format(question=task["question"])}]
    for _ in range(MAX_TURNS):
        reply = llm(messages, max_tokens=MAX_TOKENS)
        answer = first_tag(reply, "answer")
        if answer is not None:
            return {"answer": answer}
        query = first_tag(reply, "search")
        if query is None:
            lines = [line.strip() for line in reply.splitlines() if line.strip()]
            if ANSWER_FROM_LAST_LINE and lines:
                return {"answer": lines[-1], "note": "no tags: the last line"}
            return {"answer": None, "note": "no search and no answer"}
        passages = tools.search(query, TOP_K)
        text = "\n".join(cut_words(p, PASSAGE_WORDS) for p in passages) or "no results"
        # keep the reply only up to its first search call: what follows was not seen by the search
        messages.append({"role": "assistant", "content": reply[:reply.index("</search>") + len("</search>")]})
        messages.append({"role": "user", "content": INFO_TEMPLATE.format(passages=text)})
    return {"answer": None, "note": "turn budget spent"}
