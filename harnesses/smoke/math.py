"""Math h0 of the smoke preset: the model names the operations, the harness does the arithmetic.

The random smoke model never writes a right \\boxed{} number under harnesses/math.py (0 of 32 training rollouts at
the smoke preset's settings: README, "The smoke preset trains"), so no weight step of a smoke run had anything to
learn from. Here it has a choice it can get right by chance: the question's numbers, in the order written, joined
by the first operations (+ - * /) the model's replies name; the harness computes that expression (* and / before
+ and -) and boxes its value. Three in five of the bundled one-step problems (--math-max-steps 1) are two numbers
and one operation; 8 of the preset's 32 training rollouts succeed (scripts/calibrate_cpu_h0.py --preset smoke).
The harness never reads the answer, and without the model (a reply of '') it names no operation and gives no
answer. A reply with too few operations is answered with a nudge, at most MAX_TURNS calls.
"""
import re

SYSTEM_PROMPT = ""
USER_TEMPLATE = "{question}\n\nName the operations to apply to its numbers, in order: + - * or /."
NUDGE_TEMPLATE = "Name the operations: + - * or /."
MAX_TURNS = 2
MAX_TOKENS = None  # no cap of its own: the run's --max-new-tokens decides

# literal values only: the offline proposer reads this with ast.literal_eval
SEARCH_SPACE = {
    "MAX_TURNS": [1, 2, 3],
    "SYSTEM_PROMPT": ["", "You solve word problems by naming the arithmetic they need."],
    "USER_TEMPLATE": ["{question}\n\nName the operations to apply to its numbers, in order: + - * or /.",
                      "{question}\n\nWhich operations, in order?"],
    "NUDGE_TEMPLATE": ["Name the operations: + - * or /.", "Operations?"],
}


def calculate(numbers, operations):
    """The value of numbers[0] op numbers[1] op ...: * and / first, then + and - from the left; None on a division
    by zero."""
    terms, signs = [float(numbers[0])], []
    for op, n in zip(operations, numbers[1:]):
        if op in "+-":
            terms.append(float(n))
            signs.append(op)
        elif op == "*":
            terms[-1] *= float(n)
        elif float(n) == 0:
            return None
        else:
            terms[-1] /= float(n)
    value = terms[0]
    for sign, term in zip(signs, terms[1:]):
        value = value + term if sign == "+" else value - term
    return value


def run(task, llm, tools):
    numbers = re.findall(r"\d+", task["question"])
    if len(numbers) < 2:  # nothing for the model to choose: no answer without it
        return {"answer": None, "note": "fewer than two numbers in the question"}
    messages = [{"role": "system", "content": SYSTEM_PROMPT}] if SYSTEM_PROMPT else []
    messages.append({"role": "user", "content": USER_TEMPLATE.format(question=task["question"])})
    operations = []
    for _ in range(MAX_TURNS):
        reply = llm(messages, max_tokens=MAX_TOKENS)
        operations += re.findall(r"[-+*/]", reply)
        if len(operations) >= len(numbers) - 1:
            break
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": NUDGE_TEMPLATE}]
    if len(operations) < len(numbers) - 1:
        return {"answer": None, "note": f"{len(operations)} operations named, {len(numbers) - 1} needed"}
    value = calculate(numbers, operations)
    if value is None:
        return {"answer": None, "note": "a division by zero"}
    shown = str(int(value)) if value == int(value) else str(round(value, 6))
    expression = numbers[0] + "".join(f" {op} {n}" for op, n in zip(operations, numbers[1:]))
    return {"answer": f"\\boxed{{{shown}}}", "note": f"{expression} = {shown}"}
