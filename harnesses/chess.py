"""Chess h0: show the position (FEN, ASCII board, legal moves in UCI and SAN, moves so far), expect one UCI move.

The move is read from <move>...</move> tags, else [brackets], else a bare UCI word, in that order;
several different moves at the first level found = ambiguous. One retry after an unparseable or
ambiguous reply and one after an illegal move (per episode); at most MAX_TURNS model calls. The
harness never picks a move itself: it only forwards the model's move to tools.move.
h0's values are the paper's; SEARCH_SPACE also holds what else of the public view a small model might
use: the FEN or not, each side's pieces by square (SHOW_PIECES), SAN replies mapped to the listed legal
moves (ACCEPT_SAN), moves the model names that are not legal ignored before the ambiguity check
(LEGAL_ONLY). String knobs are prompt text only (what --prompt-only may change); every other knob is a
bool, number or None.
"""
import re

SYSTEM_PROMPT = ("You solve chess puzzles. Find the best move for the side to play. "
                 "Reply with exactly one move in UCI notation inside move tags, e.g. <move>e2e4</move>.")
UNPARSEABLE_TEMPLATE = ("I could not read one move from that ({why}). Reply with exactly one UCI move, "
                        "e.g. <move>e2e4</move>.")
ILLEGAL_TEMPLATE = "{move} is illegal here. Choose one of the legal moves listed."
ASK_TEMPLATE = "Your move?"
MAX_TURNS = 9
MAX_UNPARSEABLE_RETRIES = 1
MAX_ILLEGAL_RETRIES = 1
MAX_TOKENS = None  # no cap of its own: the run's --max-new-tokens decides
SHOW_FEN = True
SHOW_BOARD = True
SHOW_SAN = True
SHOW_PIECES = False  # True: also list each side's pieces by square ("White: Kg1 Qd1 Pa2 ...")
ACCEPT_SAN = False  # True: a reply with no UCI move may name a listed SAN move instead
LEGAL_ONLY = False  # True: moves named in the reply that are not legal are ignored before the ambiguity check

# literal values only: the offline proposer reads this with ast.literal_eval; in its order of priority (mutate
# tries knobs in this order with --mutate-order listed, by default in an order drawn from --seed): the fixes
# for the failures named above first, prompt wording last
SEARCH_SPACE = {
    "SHOW_PIECES": [False, True],
    "LEGAL_ONLY": [False, True],
    "ACCEPT_SAN": [False, True],
    "SHOW_FEN": [True, False],
    "SHOW_BOARD": [True, False],
    "SHOW_SAN": [True, False],
    "MAX_TURNS": [6, 9, 12, 18],
    "MAX_UNPARSEABLE_RETRIES": [0, 1, 2],
    "MAX_ILLEGAL_RETRIES": [0, 1, 2],
    "MAX_TOKENS": [None, 32, 192],
    "SYSTEM_PROMPT": [
        "You solve chess puzzles. Find the best move for the side to play. "
        "Reply with exactly one move in UCI notation inside move tags, e.g. <move>e2e4</move>.",
        "You solve chess puzzles. Look for checks, captures and threats first. "
        "Reply with one move from the legal UCI list inside move tags, e.g. <move>e2e4</move>.",
        "Find the winning move. Answer with one move from the list of legal UCI moves, written as "
        "<move>e2e4</move>, and nothing else.",
        "You are a chess engine. Play the strongest move for the side to move. "
        "Output exactly one UCI move inside <move></move> tags.",
        "Solve the puzzle: the side to play has a tactic (a mate, a won piece or a fork). Pick it from the "
        "legal moves and reply <move>UCI</move>, e.g. <move>g1f3</move>.",
        "Chess puzzle. Copy one move from the legal UCI list into move tags: <move>e2e4</move>. No explanation.",
        "You play chess puzzles, one move per turn. Weigh every capture among the legal moves, then reply "
        "with the best move as <move>e2e4</move>.",
        "",
    ],
    "UNPARSEABLE_TEMPLATE": [
        "I could not read one move from that ({why}). Reply with exactly one UCI move, e.g. <move>e2e4</move>.",
        "Please answer with one legal move in UCI inside move tags, like <move>e2e4</move> ({why}).",
        "({why}) Copy one move from the legal UCI list and write it as <move>move</move>.",
        "Invalid answer: {why}. Only replies like <move>e2e4</move> are read.",
    ],
    "ILLEGAL_TEMPLATE": [
        "{move} is illegal here. Choose one of the legal moves listed.",
        "{move} is not a legal move in this position. Pick a move from the legal UCI list and reply <move>move</move>.",
        "Illegal move: {move}. Look at the board again and choose a legal move.",
        "{move} cannot be played. The legal moves are listed above; copy one of them.",
    ],
    "ASK_TEMPLATE": ["Your move?", "Your move (one UCI move in <move></move> tags)?",
                     "Which legal move wins? Reply <move>uci</move>.", "Play the best move."],
}

UCI = r"[a-h][1-8][a-h][1-8][qrbn]?"


def parse_move(text, view=None):
    """-> (uci, None) or (None, why). Tags, then brackets, then bare moves; different moves = ambiguous.
    `view` (the position shown) is needed only for LEGAL_ONLY and ACCEPT_SAN."""
    legal = view["legal_uci"] if view else []
    for pattern in (rf"<move>\s*({UCI})\s*</move>", rf"\[\s*({UCI})\s*\]", rf"\b({UCI})\b"):
        found = list(dict.fromkeys(m.lower() for m in re.findall(pattern, text, re.IGNORECASE)))
        if LEGAL_ONLY and view:
            found = [m for m in found if m in legal] or found
        if len(found) == 1:
            return found[0], None
        if len(found) > 1:
            return None, "ambiguous: " + ", ".join(found[:5])
    if ACCEPT_SAN and view:
        san = dict(zip(view["legal_san"], legal))
        found = list(dict.fromkeys(san[w] for w in re.findall(r"[A-Za-z0-9=-]+", text) if w in san))
        if len(found) == 1:
            return found[0], None
    return None, "no UCI move found"


def piece_lines(fen):
    """Each side's pieces by square, read from the FEN, e.g. ["White: Kg1 Qd1 Pa2", "Black: ..."]."""
    pieces = {"White": [], "Black": []}
    for rank, row in enumerate(fen.split()[0].split("/")):
        file = 0
        for ch in row:
            if ch.isdigit():
                file += int(ch)
                continue
            pieces["White" if ch.isupper() else "Black"].append(ch.upper() + "abcdefgh"[file] + str(8 - rank))
            file += 1
    return [f"{side}: " + " ".join(sorted(found, key=lambda p: "KQRBNP".index(p[0]))) for side, found in pieces.items()]


def position_prompt(view, side, history):
    lines = [f"You play {side}." + (f" FEN: {view['fen']}" if SHOW_FEN else "")]
    if SHOW_BOARD:
        lines.append(view["board"])
    if SHOW_PIECES:
        lines += piece_lines(view["fen"])
    lines.append("Legal moves (UCI): " + " ".join(view["legal_uci"]))
    if SHOW_SAN:
        lines.append("Legal moves (SAN): " + " ".join(view["legal_san"]))
    lines += ["Moves so far: " + " ".join(history), ASK_TEMPLATE]
    return "\n".join(lines)


def run(task, llm, tools):
    view, side = task, task["side"]
    history = [f"{task['last_move']} (opponent)"]
    system = [{"role": "system", "content": SYSTEM_PROMPT}] if SYSTEM_PROMPT else []
    messages = system + [{"role": "user", "content": position_prompt(view, side, history)}]
    unparseable_left, illegal_left, move = MAX_UNPARSEABLE_RETRIES, MAX_ILLEGAL_RETRIES, None
    for _ in range(MAX_TURNS):
        reply = llm(messages, max_tokens=MAX_TOKENS)
        move, why = parse_move(reply, view)
        if move is None:
            if unparseable_left == 0:
                return {"answer": None, "note": why}
            unparseable_left -= 1
            messages += [{"role": "assistant", "content": reply},
                         {"role": "user", "content": UNPARSEABLE_TEMPLATE.format(why=why)}]
            continue
        result = tools.move(move)
        if result["status"] in ("solved", "wrong", "over"):
            return {"answer": move, "note": result["status"]}
        if result["status"] in ("illegal", "unparseable"):
            if illegal_left == 0:
                return {"answer": move, "note": result["status"]}
            illegal_left -= 1
            messages += [{"role": "assistant", "content": reply},
                         {"role": "user", "content": ILLEGAL_TEMPLATE.format(move=move)}]
            continue
        history += [move, f"{result['opponent_move']} (opponent)"]
        view = result
        messages = system + [{"role": "user", "content": position_prompt(view, side, history)}]
    return {"answer": move, "note": "turn budget spent"}
