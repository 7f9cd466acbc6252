"""Chess h0 of the official runs (krafton-ai/WHALE environments/chess_puzzle/base_harness.py, as its runner
autoharness_chess_puzzle/runner.py plays it): one conversation for the whole puzzle.

Every model call gets the system prompt, then each earlier reply followed by the verifier's answer to it as a
user turn ("Correct. Opponent replied g8f6 (Nf6). Continue with the next move.", or a retry nudge), then the
current position in USER_PROMPT (the first position is not repeated once play moves on, as the official
runner drops it too). The position: side to move, FEN, the board with rank numbers and file letters, the last
opponent reply and the moves accepted so far (once there are any), the move number, and every legal move as
"- [uci] SAN=..." in UCI order, SAN as the domain writes it (the paper and gpu presets: python-chess's, with
+ and #). After a failed reply the nudge is also appended to the position as "Feedback from verifier".
The move is read from <move>...</move> tags, else [brackets], else a bare UCI word; several different moves
at the first level found are ambiguous. One format retry (no single valid UCI move) and one illegal-move
retry per puzzle; a legal wrong move ends it. At most MAX_TURNS model calls (the runner caps any harness at
18, and each kind of retry at 10). The harness never picks a move: it only forwards the model's move to
tools.move. An empty reply means the episode's tokens or calls are spent: the puzzle ends there.

The official contract (the chess skill's "Harness Contract", C/meta_harness/skills/meta-harness-chess-puzzle/
SKILL.md; run_puzzle_rollout and verify_and_step in C/autoharness_chess_puzzle/runner.py): the runner owns the
loop, the conversation and the verifier's messages; a candidate changes the prompts, the observation, the move
parser, the two retry budgets and MAX_TURNS (the runner caps them at 10 and 18). So the search keeps the names
in RUNNER_OWNS exactly as they are here (lib/contract.py refuses a candidate that changes one).
"""
import re

SYSTEM_PROMPT = ("You solve chess tactics by choosing one legal move at a time.\n"
                 "Use only the board position and legal moves shown in the prompt. Do not claim\n"
                 "hidden engine analysis or external knowledge. Return exactly one move.")
USER_PROMPT = ("Solve the current chess puzzle position.\n\n{observation}\n\n"
               "Return exactly one move as <move>uci</move>, for example <move>e2e4</move>.\n"
               "Do not include explanation.")
FORMAT_RETRY_BUDGET = 1
ILLEGAL_MOVE_RETRY_BUDGET = 1
MAX_TURNS = 9  # model calls, retries included: the longest solution line of the official splits

# the official runner's part of this file: its loop (run, and the builtins and module run calls), the move shape
# it checks and its verifier's messages; a candidate must leave these names as they are
RUNNER_OWNS = ("run", "range", "re", "UCI", "CONTINUE_MESSAGE", "FORMAT_NUDGE", "ILLEGAL_NUDGE")

# the official runner's verifier messages, which the model reads back in the conversation
CONTINUE_MESSAGE = "Correct. Opponent replied {uci} ({san}). Continue with the next move."
FORMAT_NUDGE = ('The verifier could not parse exactly one UCI move from "{parsed}". '
                "Reply with exactly one move, e.g. <move>e2e4</move>, and no explanation.")
ILLEGAL_NUDGE = ('The parsed move "{parsed}" is not legal in the current board. '
                 "Choose one move from the visible legal moves and reply only as <move>uci</move>.")

# literal values only: the offline proposer reads this with ast.literal_eval
SEARCH_SPACE = {
    "MAX_TURNS": [9, 12, 18],
    "FORMAT_RETRY_BUDGET": [1, 2, 0],
    "ILLEGAL_MOVE_RETRY_BUDGET": [1, 2, 0],
}

UCI = r"[a-h][1-8][a-h][1-8][qrbn]?"


def parse_action(reply):
    """One UCI move; else "__ambiguous_multiple_moves__" or "__no_move__" (the official sentinels, which the
    format nudge quotes). Tags, then brackets, then bare moves: the first kind found decides."""
    for pattern in (rf"<move>\s*({UCI})\s*</move>", rf"\[\s*({UCI})\s*\]", rf"\b({UCI})\b"):
        found = list(dict.fromkeys(m.lower() for m in re.findall(pattern, reply, re.IGNORECASE)))
        if len(found) == 1:
            return found[0]
        if found:
            return "__ambiguous_multiple_moves__"
    return "__no_move__"


def board_rows(fen):
    """The board as the official observation draws it: rank 8 first, each row its rank number and one symbol a
    square ('.' when empty), then the file letters."""
    rows = []
    for i, rank in enumerate(fen.split()[0].split("/")):
        squares = "".join("." * int(c) if c.isdigit() else c for c in rank)
        rows.append(f"{8 - i} " + " ".join(squares))
    return "\n".join(rows + ["  a b c d e f g h"])


def observation(view, side, last_reply, accepted):
    rows = ["Task: solve the chess puzzle one move at a time.", f"Side to move: {side}", f"FEN: {view['fen']}",
            "Board:", board_rows(view["fen"])]
    if last_reply:
        rows.append(f"Last opponent reply: {last_reply}")
    if accepted:
        rows.append("Your accepted moves so far: " + ", ".join(accepted))
    rows += [f"Puzzle move number: {len(accepted) + 1}", "Legal moves:"]
    rows += [f"- [{uci}] SAN={san}" for uci, san in sorted(zip(view["legal_uci"], view["legal_san"]))]
    return "\n".join(rows)


def run(task, llm, tools):
    view, side = task, task["side"].capitalize()
    last_reply, accepted = None, []
    history = []  # every earlier reply and the verifier's answer to it
    nudge, format_left, illegal_left = None, FORMAT_RETRY_BUDGET, ILLEGAL_MOVE_RETRY_BUDGET
    move = None
    for _ in range(MAX_TURNS):
        position = observation(view, side, last_reply, accepted)
        if nudge:
            position += "\n\nFeedback from verifier:\n" + nudge
        messages = [{"role": "system", "content": SYSTEM_PROMPT}, *history,
                    {"role": "user", "content": USER_PROMPT.format(observation=position)}]
        reply = llm(messages)
        if not reply:
            return {"answer": move, "note": "no tokens or model calls left"}
        move = parse_action(reply)
        result = tools.move(move) if re.fullmatch(UCI, move) else {"status": "unparseable"}
        status = result["status"]
        if status in ("solved", "wrong", "over"):
            return {"answer": move, "note": status}
        if status == "ok":
            accepted.append(move)
            last_reply, view, nudge = result["opponent_move"], result, None
            answer = CONTINUE_MESSAGE.format(uci=result["opponent_move"], san=result["opponent_san"])
        elif status == "unparseable":  # no single UCI move, or not a valid one (e.g. a1a1)
            if format_left == 0:
                return {"answer": move, "note": "no move read"}
            format_left -= 1
            nudge = answer = FORMAT_NUDGE.format(parsed=move)
        else:  # illegal in this position
            if illegal_left == 0:
                return {"answer": move, "note": "illegal"}
            illegal_left -= 1
            nudge = answer = ILLEGAL_NUDGE.format(parsed=move)
        history += [{"role": "assistant", "content": reply}, {"role": "user", "content": answer}]
    return {"answer": move, "note": "turn budget spent"}
