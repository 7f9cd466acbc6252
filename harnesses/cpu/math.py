"""Math h0 of the cpu preset: the bundled h0 (below) with the fewest SEARCH_SPACE changes under which SmolLM2-135M
earns a small training reward, as the paper's base model does under its h0: one worked example that prints its
result (EXAMPLES) and the number the code printed as the answer (ANSWER_FROM_OUTPUT). Every single change scored
at most 1 % (README, "Calibrating the cpu preset"); docs/cpu-run/paper-regime.md has these two's figures
(scripts/calibrate_cpu_h0.py). SKILL tells the offline proposer (--mutate-order traces) which knobs to try first
for each failure kind.

Math h0: no system prompt; the model may run one Python code block per turn and answers in \\boxed{}.

The first ```python block of a reply is run by tools.python (30 s, 1 GB) and its output is fed
back as the next user message; a reply without code ends the episode and is the answer. At most
MAX_TURNS model calls; the last reply is the answer (the reward reads its last \\boxed{}).
h0's values are the paper's; SEARCH_SPACE also holds what a coding agent would try on a small model:
answer directly (RUN_CODE = False, with a prompt that asks for the number), take the number the code
printed as the answer (ANSWER_FROM_OUTPUT), box the reply's last number (BOX_LAST_NUMBER), worked
examples shown as earlier turns (EXAMPLES: three that print an expression, three that answer directly, or
one; invented problems, worded by hand rather than in data/build.py's sentence templates, none in the
bundled sets). String knobs are prompt text only (what --prompt-only may
change); every other knob is a bool, number, list or None.
"""
import re

SYSTEM_PROMPT = ""  # h0 has none
USER_TEMPLATE = ("{question}\n\nYou may write Python code in a ```python block; it will be run and its output "
                 "shown to you. Put the final answer in \\boxed{{}}.")
OUTPUT_TEMPLATE = "Output:\n{output}"
MAX_TURNS = 2
MAX_TOKENS = None  # no cap of its own: the run's --max-new-tokens decides
MAX_OUTPUT_CHARS = 1000
RUN_CODE = True  # False: code blocks are not run, the first reply is the answer
ANSWER_FROM_OUTPUT = True  # True: the last number the code printed is the answer (no further call)
BOX_LAST_NUMBER = False  # True: a reply without \\boxed{} answers with its last number
# worked examples [question, reply], shown as an earlier user/assistant turn
EXAMPLES = [["A baker made 12 rolls before sunrise and 7 more at noon. By evening 5 of them were sold. "
             "How many rolls were left?", "```python\nrolls = 12 + 7 - 5\nprint(rolls)\n```"]]

# literal values only: the offline proposer reads this with ast.literal_eval; in its order of priority (mutate
# tries knobs in this order with --mutate-order listed, by default in an order drawn from --seed): the fixes
# for the failures named above first, prompt wording last
SEARCH_SPACE = {
    "EXAMPLES": [
        [],
        [["A jar on the shelf held 12 shells. After a walk on the beach, Lena dropped in the 7 she had found. "
          "How many shells are in the jar?", "```python\nprint(12 + 7)\n```"],
         ["Tom took 30 marbles to school and lost 8 of them at break. On the way home he bought 2 bags of "
          "marbles, 5 to a bag. How many marbles did he end the day with?",
          "```python\nprint(30 - 8 + 2 * 5)\n```"],
         ["Ada deals a pile of 18 cards out evenly to 3 friends. How many cards does each friend get?",
          "```python\nprint(18 // 3)\n```"]],
        [["A jar on the shelf held 12 shells. After a walk on the beach, Lena dropped in the 7 she had found. "
          "How many shells are in the jar?", "12 + 7 = 19. The answer is \\boxed{19}."],
         ["Tom took 30 marbles to school and lost 8 of them at break. On the way home he bought 2 bags of "
          "marbles, 5 to a bag. How many marbles did he end the day with?",
          "30 - 8 = 22 and 22 + 2 * 5 = 32. The answer is \\boxed{32}."],
         ["Ada deals a pile of 18 cards out evenly to 3 friends. How many cards does each friend get?",
          "18 / 3 = 6. The answer is \\boxed{6}."]],
        [["A baker made 12 rolls before sunrise and 7 more at noon. By evening 5 of them were sold. "
          "How many rolls were left?", "```python\nrolls = 12 + 7 - 5\nprint(rolls)\n```"]],
    ],
    "ANSWER_FROM_OUTPUT": [False, True],
    "MAX_TURNS": [1, 2, 3, 4],
    "BOX_LAST_NUMBER": [False, True],
    "RUN_CODE": [True, False],
    "MAX_TOKENS": [None, 128, 512],
    "MAX_OUTPUT_CHARS": [300, 1000, 2000],
    "SYSTEM_PROMPT": ["", "Solve the math problem. Put the final answer in \\boxed{}.",
                      "You are a careful math tutor. Work step by step, then give the final number in \\boxed{}.",
                      "Solve the problem with a short calculation. End with \\boxed{answer}, the answer being a number.",
                      "You solve word problems. Track the running count after every sentence, then box the final count "
                      "like \\boxed{42}."],
    "USER_TEMPLATE": [
        "{question}\n\nYou may write Python code in a ```python block; it will be run and its output "
        "shown to you. Put the final answer in \\boxed{{}}.",
        "{question}\n\nWrite a short ```python block that prints the result. After you see its output, "
        "give the final answer in \\boxed{{}}.",
        "{question}\n\nAnswer with the number only, in \\boxed{{}}.",
        "{question}\n\nWork it out step by step, one sentence at a time, then write the final number in \\boxed{{}}.",
        "Question: {question}\nGive only the final number, like \\boxed{{7}}.",
        "{question}\n\nWrite Python that prints the answer, in a ```python block.",
        "{question}\n\nWrite one line of Python that prints the answer as a single expression, in a ```python block.",
    ],
    "OUTPUT_TEMPLATE": ["Output:\n{output}", "The code printed:\n{output}\nNow give the final answer in \\boxed{{}}.",
                        "```output\n{output}\n```", "Result: {output}\nAnswer in \\boxed{{}}."],
}

# failure kind (lib/failures.py) -> the knobs a harness author would change first for it; the offline proposer
# (--mutate-order traces) tries those of the kind most frequent in a candidate's harness-set traces first
SKILL = {
    "erred": ["RUN_CODE", "MAX_OUTPUT_CHARS", "MAX_TURNS"],
    "cut": ["EXAMPLES", "USER_TEMPLATE", "BOX_LAST_NUMBER", "RUN_CODE"],
    "no_answer": ["BOX_LAST_NUMBER", "OUTPUT_TEMPLATE", "MAX_TURNS", "USER_TEMPLATE"],
    "no_tool": ["ANSWER_FROM_OUTPUT", "EXAMPLES", "USER_TEMPLATE", "SYSTEM_PROMPT"],
    "wrong": ["EXAMPLES", "SYSTEM_PROMPT", "USER_TEMPLATE", "MAX_TURNS"],
}


def first_code_block(text):
    match = re.search(r"```(?:python|py)?[ \t]*\n(.*?)```", text, re.DOTALL)
    return match.group(1) if match else None


def last_number(text):
    numbers = re.findall(r"-?\d[\d,]*(?:\.\d+)?", text)
    return numbers[-1].rstrip(".,") if numbers else None


def run(task, llm, tools):
    messages = [{"role": "system", "content": SYSTEM_PROMPT}] if SYSTEM_PROMPT else []
    for question, reply in EXAMPLES:
        messages += [{"role": "user", "content": USER_TEMPLATE.format(question=question)},
                     {"role": "assistant", "content": reply}]
    messages.append({"role": "user", "content": USER_TEMPLATE.format(question=task["question"])})
    reply = ""
    for _ in range(MAX_TURNS):
        reply = llm(messages, max_tokens=MAX_TOKENS)
        code = first_code_block(reply) if RUN_CODE else None
        if code is None:
            break
        output = tools.python(code)[:MAX_OUTPUT_CHARS]
        if ANSWER_FROM_OUTPUT and last_number(output) is not None:
            return {"answer": f"\\boxed{{{last_number(output)}}}", "note": "the number the code printed"}
        messages.append({"role": "assistant", "content": reply})
        messages.append({"role": "user", "content": OUTPUT_TEMPLATE.format(output=output)})
    if BOX_LAST_NUMBER and "\\boxed{" not in reply and last_number(reply) is not None:
        return {"answer": f"\\boxed{{{last_number(reply)}}}", "note": "no box: the last number"}
    return {"answer": reply}
