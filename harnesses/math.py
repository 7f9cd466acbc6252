"""Math h0: no system prompt; the model may run one Python code block per turn and answers in \\boxed{}.

The first ```python block of a reply is run by tools.python (30 s, 1 GB) and its output is fed
back as the next user message; a reply without code ends the episode and is the answer. At most
MAX_TURNS model calls; the last reply is the answer (the reward reads its last \\boxed{}).
"""
import re

SYSTEM_PROMPT = ""  # h0 has none
USER_TEMPLATE = ("{question}\n\nYou may write Python code in a ```python block; it will be run and its output "
                 "shown to you. Put the final answer in \\boxed{{}}.")
OUTPUT_TEMPLATE = "Output:\n{output}"
MAX_TURNS = 2
MAX_TOKENS = 384
MAX_OUTPUT_CHARS = 1000
BOX_LAST_NUMBER = False  # h0 leaves the reply as it is; True: a reply without \\boxed{} answers with its last number

SEARCH_SPACE = {  # literal values only: the offline proposer reads this with ast.literal_eval
    "SYSTEM_PROMPT": ["", "Solve the math problem. Put the final answer in \\boxed{}."],
    "USER_TEMPLATE": [
        "{question}\n\nYou may write Python code in a ```python block; it will be run and its output "
        "shown to you. Put the final answer in \\boxed{{}}.",
        "{question}\n\nWrite a short ```python block that prints the result. After you see its output, "
        "give the final answer in \\boxed{{}}.",
    ],
    "MAX_TURNS": [1, 2, 3, 4],
    "MAX_TOKENS": [256, 384, 512, 1024],
    "MAX_OUTPUT_CHARS": [300, 1000, 2000],
    "BOX_LAST_NUMBER": [False, True],
}


def first_code_block(text):
    match = re.search(r"```(?:python|py)?[ \t]*\n(.*?)```", text, re.DOTALL)
    return match.group(1) if match else None


def run(task, llm, tools):
    messages = [{"role": "system", "content": SYSTEM_PROMPT}] if SYSTEM_PROMPT else []
    messages.append({"role": "user", "content": USER_TEMPLATE.format(question=task["question"])})
    reply = ""
    for _ in range(MAX_TURNS):
        reply = llm(messages, max_tokens=MAX_TOKENS)
        code = first_code_block(reply)
        if code is None:
            break
        output = tools.python(code)[:MAX_OUTPUT_CHARS]
        messages.append({"role": "assistant", "content": reply})
        messages.append({"role": "user", "content": OUTPUT_TEMPLATE.format(output=output)})
    numbers = re.findall(r"-?\d[\d,]*(?:\.\d+)?", reply)
    if BOX_LAST_NUMBER and "\\boxed{" not in reply and numbers:
        return {"answer": f"\\boxed{{{numbers[-1].rstrip('.,')}}}", "note": "no box: the last number"}
    return {"answer": reply}
