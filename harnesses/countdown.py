"""Countdown h0: one call; the model answers with an arithmetic expression in <answer> tags.

The model sees the numbers and the target and writes an expression that uses each number at most once, with
+ - * / and parentheses; the expression inside the first <answer>...</answer> is the answer (the reward checks
it exactly, domains.countdown_value). With MAX_TURNS above 1, a reply whose expression names a number that is
not given (or none at all) gets FEEDBACK_TEMPLATE and one more call: the harness checks the model's expression
against the rules it can see, and never computes or searches for one itself. SEARCH_SPACE holds what a coding
agent would try on a small model: worked examples shown as earlier turns (EXAMPLES: invented puzzles, none in
the bundled sets), reading the answer from the last line (ANSWER_FROM), a retry with feedback (MAX_TURNS), the
prompt's wording. String knobs are prompt text only (what --prompt-only may change); every other knob is a
bool, number, list or None.
"""
import re

SYSTEM_PROMPT = ("Combine the given numbers with + - * / and parentheses to reach the target. Use each number "
                 "at most once. Write the expression inside <answer></answer>.")
USER_TEMPLATE = "Numbers: {numbers}\nTarget: {target}"
FEEDBACK_TEMPLATE = "Use only the numbers {numbers}, each at most once, and write the expression in <answer></answer>."
MAX_TURNS = 1
MAX_TOKENS = 64
ANSWER_FROM = ["tag"]  # where the answer is read, first hit wins: "tag" (<answer>), "last_line"
STOP = ["</answer>"]  # generation ends at the first (kept as the reply's end)
EXAMPLES = []  # worked examples [numbers, target, reply], shown as earlier turns

# literal values only: the offline proposer reads this with ast.literal_eval; in its order of priority (mutate
# tries knobs in this order with --mutate-order listed, by default in an order drawn from --seed)
SEARCH_SPACE = {
    "EXAMPLES": [
        [],
        [[[3, 4, 6], 18, "3 * 6 = 18, so <answer>3 * 6</answer>"]],
        [[[3, 4, 6], 18, "<answer>3 * 6</answer>"], [[2, 7, 9], 23, "<answer>2 * 7 + 9</answer>"]],
        [[[3, 4, 6], 18, "<answer>3 * 6</answer>"], [[2, 5, 8], 21, "<answer>8 * 2 + 5</answer>"],
         [[1, 6, 50], 56, "<answer>50 + 6</answer>"]],
    ],
    "MAX_TURNS": [1, 2, 3],
    "ANSWER_FROM": [["tag"], ["tag", "last_line"], ["last_line"]],
    "MAX_TOKENS": [32, 64, 128],
    "STOP": [["</answer>"], None],
    "SYSTEM_PROMPT": [
        "Combine the given numbers with + - * / and parentheses to reach the target. Use each number at most "
        "once. Write the expression inside <answer></answer>.",
        "You solve number puzzles. Reply with one arithmetic expression inside <answer></answer>.",
        "Reach the target using some of the numbers once each. First think briefly, then give the expression "
        "inside <answer></answer>.",
        "Make the target from the numbers. Each number may be used once; + - * / and brackets are allowed. "
        "Answer like <answer>(3 + 5) * 2</answer>.",
        "Write a calculation that equals the target, using only the given numbers. Put it in <answer></answer>.",
        "",
    ],
    "USER_TEMPLATE": ["Numbers: {numbers}\nTarget: {target}",
                      "Use {numbers} to make {target}.",
                      "Target {target}. Numbers you may use once each: {numbers}.",
                      "Numbers: {numbers}\nTarget: {target}\nExpression:"],
    "FEEDBACK_TEMPLATE": [
        "Use only the numbers {numbers}, each at most once, and write the expression in <answer></answer>.",
        "That expression breaks the rules. Try again with {numbers} only, each once at most.",
        "Not valid. Answer with <answer>expression</answer> using {numbers}.",
    ],
}


def expression_in(reply):
    """The model's expression: the first <answer> tag's content, or the reply's last line, by ANSWER_FROM."""
    for where in ANSWER_FROM:
        if where == "tag":
            match = re.search(r"<answer>(.*?)(?:</answer>|$)", reply, re.DOTALL)
            if match and match.group(1).strip():
                return match.group(1).strip()
        if where == "last_line":
            lines = [line.strip() for line in reply.strip().splitlines() if line.strip()]
            if lines:
                return lines[-1]
    return None


def breaks_the_rules(expression, numbers):
    """Whether the expression is missing or names a number that is not given, or one more often than given."""
    if not expression:
        return True
    used = [int(n) for n in re.findall(r"\d+", expression.split("=")[0])]
    return not used or any(used.count(n) > numbers.count(n) for n in used)


def run(task, llm, tools):
    numbers = ", ".join(str(n) for n in task["numbers"])
    messages = [{"role": "system", "content": SYSTEM_PROMPT}] if SYSTEM_PROMPT else []
    for shown, target, reply in EXAMPLES:
        messages += [{"role": "user", "content": USER_TEMPLATE.format(numbers=", ".join(map(str, shown)),
                                                                     target=target)},
                     {"role": "assistant", "content": reply}]
    messages.append({"role": "user", "content": USER_TEMPLATE.format(numbers=numbers, target=task["target"])})
    expression = None
    for _ in range(MAX_TURNS):
        reply = llm(messages, max_tokens=MAX_TOKENS, **({"stop": STOP} if STOP else {}))
        expression = expression_in(reply)
        if not breaks_the_rules(expression, task["numbers"]):
            break
        messages += [{"role": "assistant", "content": reply},
                     {"role": "user", "content": FEEDBACK_TEMPLATE.format(numbers=numbers)}]
    return {"answer": expression}
