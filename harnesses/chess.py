"""Chess h0: show the position (FEN, ASCII board, legal moves in UCI and SAN, moves so far), expect one UCI move.

The move is read from <move>...</move> tags, else [brackets], else a bare UCI word, in that order;
several different moves at the first level found = ambiguous. One retry after an unparseable or
ambiguous reply and one after an illegal move (per episode); at most MAX_TURNS model calls. The
harness never picks a move itself: it only forwards the model's move to tools.move.
"""
import re

SYSTEM_PROMPT = ("You solve chess puzzles. Find the best move for the side to play. "
                 "Reply with exactly one move in UCI notation inside move tags, e.g. <move>e2e4</move>.")
UNPARSEABLE_FEEDBACK = "I could not read one move from that ({why}). Reply with exactly one UCI move, e.g. <move>e2e4</move>."
ILLEGAL_FEEDBACK = "{move} is illegal here. Choose one of the legal moves listed."
MAX_TURNS = 9
MAX_UNPARSEABLE_RETRIES = 1
MAX_ILLEGAL_RETRIES = 1
MAX_TOKENS = 96
SHOW_BOARD = True
SHOW_SAN = True

SEARCH_SPACE = {  # literal values only: the offline proposer reads this with ast.literal_eval
    "SYSTEM_PROMPT": [
        "You solve chess puzzles. Find the best move for the side to play. "
        "Reply with exactly one move in UCI notation inside move tags, e.g. <move>e2e4</move>.",
        "You solve chess puzzles. Look for checks, captures and threats first. "
        "Reply with one move from the legal UCI list inside move tags, e.g. <move>e2e4</move>.",
    ],
    "MAX_TURNS": [6, 9, 12, 18],
    "MAX_UNPARSEABLE_RETRIES": [0, 1, 2, 4],
    "MAX_ILLEGAL_RETRIES": [0, 1, 2, 4],
    "MAX_TOKENS": [32, 64, 96, 192],
    "SHOW_BOARD": [True, False],
    "SHOW_SAN": [True, False],
}

UCI = r"[a-h][1-8][a-h][1-8][qrbn]?"


def parse_move(text):
    """-> (uci, None) or (None, why). Tags, then brackets, then bare moves; different moves = ambiguous."""
    for pattern in (rf"<move>\s*({UCI})\s*</move>", rf"\[\s*({UCI})\s*\]", rf"\b({UCI})\b"):
        found = list(dict.fromkeys(m.lower() for m in re.findall(pattern, text, re.IGNORECASE)))
        if len(found) == 1:
            return found[0], None
        if len(found) > 1:
            return None, "ambiguous: " + ", ".join(found[:5])
    return None, "no UCI move found"


def position_prompt(view, side, history):
    lines = [f"You play {side}. FEN: {view['fen']}"]
    if SHOW_BOARD:
        lines.append(view["board"])
    lines.append("Legal moves (UCI): " + " ".join(view["legal_uci"]))
    if SHOW_SAN:
        lines.append("Legal moves (SAN): " + " ".join(view["legal_san"]))
    lines += ["Moves so far: " + " ".join(history), "Your move?"]
    return "\n".join(lines)


def run(task, llm, tools):
    view, side = task, task["side"]
    history = [f"{task['last_move']} (opponent)"]
    messages = [{"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": position_prompt(view, side, history)}]
    unparseable_left, illegal_left, move = MAX_UNPARSEABLE_RETRIES, MAX_ILLEGAL_RETRIES, None
    for _ in range(MAX_TURNS):
        reply = llm(messages, max_tokens=MAX_TOKENS)
        move, why = parse_move(reply)
        if move is None:
            if unparseable_left == 0:
                return {"answer": None, "note": why}
            unparseable_left -= 1
            messages += [{"role": "assistant", "content": reply},
                         {"role": "user", "content": UNPARSEABLE_FEEDBACK.format(why=why)}]
            continue
        result = tools.move(move)
        if result["status"] in ("solved", "wrong", "over"):
            return {"answer": move, "note": result["status"]}
        if result["status"] in ("illegal", "unparseable"):
            if illegal_left == 0:
                return {"answer": move, "note": result["status"]}
            illegal_left -= 1
            messages += [{"role": "assistant", "content": reply},
                         {"role": "user", "content": ILLEGAL_FEEDBACK.format(move=move)}]
            continue
        history += [move, f"{result['opponent_move']} (opponent)"]
        view = result
        messages = [{"role": "system", "content": SYSTEM_PROMPT},
                    {"role": "user", "content": position_prompt(view, side, history)}]
    return {"answer": move, "note": "turn budget spent"}
