"""``sokoban``: a small Sokoban room (6x6 or 7x7 with its walls, one or two boxes) played by
a ``tool`` agent and a ``plan`` agent.

Board text: ``#`` wall, ``_`` floor, ``.`` target, ``$`` box, ``*`` box on a target, ``@``
the player, ``+`` the player on a target. Moves are ``U D L R`` (or ``up down left right``);
walking into a box pushes it if the cell behind it is free.

Tasks are generated backwards: boxes start on their targets and the player walks and pulls
them away at random, so every task is solvable; a breadth-first search (:func:`solve`) then
finds the shortest solution, which is the task's ``solution``. Tasks already solved or
needing fewer than 3 moves are redrawn.

A team turn: the ``tool`` agent writes Python that runs in the sandbox with ``GRID`` (the
current board, a list of strings) defined (``<tool>code</tool>``, the agent protocol's
marker; a fenced block or the bare code are read too); what it prints is shown to the
``plan`` agent, which then emits moves (``<answer>R R D</answer>`` or the bare moves).
Moves are applied until one is illegal (into a wall, or pushing a box into a wall or a
box); the rest are dropped. The episode ends when every box is on a target (team reward
1.0) or after ``max_turns`` (team reward 0.0).

Local rewards, each in [0, 1]:
- ``tool``: 0.0 if its code fails (error, timeout, limit); 0.2 if it runs; 0.5 if the last line
  it printed is a legal move sequence from the current board; 1.0 if that sequence solves it.
- ``plan``: 0.0 if no moves can be read (a malformed turn); otherwise 0.2 x the fraction of
  its moves that were legal + 0.4 x the fraction of the boxes' distance to the targets it
  removed (sum over boxes of the Manhattan distance to the nearest target), and 1.0 if the
  board is solved.

The scripted expert: the tool runs a short breadth-first search in the sandbox
(:data:`EXPERT_TOOL_CODE`) that prints a shortest solution; the plan agent plays
:func:`solve`'s solution from the current board.
"""

from __future__ import annotations

import random
import re
from typing import Any

from mgrpo import protocol_tokens as T
from mgrpo.envs.worlds.base import Malformed, WorldState, WorldTask, register_world
from mgrpo.envs.worlds.kit import (
    KitWorld,
    clip,
    code_of,
    run_code,
    tagged,
)

DIRS = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
_WORDS = {"up": "U", "down": "D", "left": "L", "right": "R"}
MAX_MOVES = 200  # moves read from one action


def solve(rows: list[str], max_states: int = 300_000) -> str | None:
    """The shortest move string solving the board ``rows``, '' if solved, None if none is
    found within ``max_states`` states."""
    from collections import deque

    dirs = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
    walls, targets, boxes, player = set(), set(), set(), None
    for r, row in enumerate(rows):
        for c, ch in enumerate(row):
            if ch == "#":
                walls.add((r, c))
            if ch in ".*+":
                targets.add((r, c))
            if ch in "$*":
                boxes.add((r, c))
            if ch in "@+":
                player = (r, c)
    if player is None:
        return None
    start = (player, tuple(sorted(boxes)))
    if set(start[1]) <= targets:
        return ""
    seen = {start: None}
    queue = deque([start])
    while queue and len(seen) < max_states:
        state = queue.popleft()
        (pr, pc), bx = state
        for move, (dr, dc) in dirs.items():
            nxt = (pr + dr, pc + dc)
            if nxt in walls:
                continue
            new_boxes = bx
            if nxt in bx:
                beyond = (nxt[0] + dr, nxt[1] + dc)
                if beyond in walls or beyond in bx:
                    continue
                new_boxes = tuple(sorted([b for b in bx if b != nxt] + [beyond]))
            key = (nxt, new_boxes)
            if key in seen:
                continue
            seen[key] = (state, move)
            if set(new_boxes) <= targets:
                path = []
                while seen[key] is not None:
                    key, step = seen[key]
                    path.append(step)
                return "".join(reversed(path))
            queue.append(key)
    return None


# The expert tool's code: the same breadth-first search as :func:`solve`, written short (a
# demonstration a small model can learn to write); it prints a shortest solution of GRID.
EXPERT_TOOL_CODE = """from collections import deque
cells = [(r, c, x) for r, row in enumerate(GRID) for c, x in enumerate(row)]
walls = {(r, c) for r, c, x in cells if x == "#"}
goals = {(r, c) for r, c, x in cells if x in ".*+"}
boxes = frozenset((r, c) for r, c, x in cells if x in "$*")
me = next((r, c) for r, c, x in cells if x in "@+")
steps = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
seen = {(me, boxes): ""}
queue = deque([(me, boxes)])
while queue:
    (r, c), bx = queue.popleft()
    path = seen[((r, c), bx)]
    if bx <= goals:
        print(path)
        break
    for move, (dr, dc) in steps.items():
        nxt, nb = (r + dr, c + dc), bx
        if nxt in walls:
            continue
        if nxt in bx:
            far = (nxt[0] + dr, nxt[1] + dc)
            if far in walls or far in bx:
                continue
            nb = bx - {nxt} | {far}
        if (nxt, nb) not in seen:
            seen[(nxt, nb)] = path + move
            queue.append((nxt, nb))
"""


def parse_moves(text: str) -> list[str] | None:
    """Moves in ``text`` (inside ``<moves>``/``<answer>`` if present), None if any token is
    not a move: ``R R D``, ``RRD``, ``right, right, down`` all read as ``[R, R, D]``."""
    inside = tagged(text, "moves")
    if inside is None:
        inside = tagged(text, "answer")
    body = (inside if inside is not None else text).strip()
    tokens = [t for t in re.split(r"[\s,;]+", body) if t]
    if not tokens:
        return None
    moves: list[str] = []
    for token in tokens:
        word = token.lower()
        if word in _WORDS:
            moves.append(_WORDS[word])
        elif re.fullmatch(r"[udlr]+", word):
            moves.extend(word.upper())
        else:
            return None
    return moves


class Board:
    """Walls and targets (fixed) with the player and boxes (moving)."""

    def __init__(self, rows: list[str]):
        self.height, self.width = len(rows), len(rows[0])
        self.walls: set[tuple[int, int]] = set()
        self.targets: set[tuple[int, int]] = set()
        self.boxes: set[tuple[int, int]] = set()
        self.player = (0, 0)
        for r, row in enumerate(rows):
            for c, ch in enumerate(row):
                if ch == "#":
                    self.walls.add((r, c))
                if ch in ".*+":
                    self.targets.add((r, c))
                if ch in "$*":
                    self.boxes.add((r, c))
                if ch in "@+":
                    self.player = (r, c)

    def rows(self) -> list[str]:
        out = []
        for r in range(self.height):
            line = []
            for c in range(self.width):
                cell, target = (r, c), (r, c) in self.targets
                if cell in self.walls:
                    line.append("#")
                elif cell in self.boxes:
                    line.append("*" if target else "$")
                elif cell == self.player:
                    line.append("+" if target else "@")
                else:
                    line.append("." if target else "_")
            out.append("".join(line))
        return out

    def solved(self) -> bool:
        return self.boxes <= self.targets

    def distance(self) -> int:
        return sum(min(abs(b[0] - t[0]) + abs(b[1] - t[1]) for t in self.targets)
                   for b in self.boxes)

    def step(self, move: str) -> bool:
        """Apply one move; False (and no change) if it is illegal."""
        dr, dc = DIRS[move]
        nxt = (self.player[0] + dr, self.player[1] + dc)
        if nxt in self.walls:
            return False
        if nxt in self.boxes:
            beyond = (nxt[0] + dr, nxt[1] + dc)
            if beyond in self.walls or beyond in self.boxes:
                return False
            self.boxes.remove(nxt)
            self.boxes.add(beyond)
        self.player = nxt
        return True

    def play(self, moves: list[str]) -> int:
        """Apply ``moves`` until one is illegal; the number applied."""
        for i, move in enumerate(moves):
            if not self.step(move):
                return i
        return len(moves)


def _draw(rng: random.Random):
    size = rng.choice((6, 7))
    inner = [(r, c) for r in range(1, size - 1) for c in range(1, size - 1)]
    walls = {(r, c) for r in range(size) for c in range(size)} - set(inner)
    walls |= set(rng.sample(inner, rng.randint(0, 2)))
    floor = [cell for cell in inner if cell not in walls]
    n_boxes = rng.choice((1, 2))
    targets = rng.sample(floor, n_boxes)
    board = Board(["#" * size] * size)
    board.walls, board.targets, board.boxes = walls, set(targets), set(targets)
    board.player = rng.choice([cell for cell in floor if cell not in board.boxes])
    for _ in range(rng.randint(10, 40)):  # walk backwards, pulling boxes now and then
        move = rng.choice("UDLR")
        dr, dc = DIRS[move]
        nxt = (board.player[0] + dr, board.player[1] + dc)
        if nxt in board.walls or nxt in board.boxes:
            continue
        behind = (board.player[0] - dr, board.player[1] - dc)
        if behind in board.boxes and rng.random() < 0.7:
            board.boxes.remove(behind)
            board.boxes.add(board.player)
        board.player = nxt
    rows = board.rows()
    key = "\n".join(rows)
    return key, lambda: _task(rows, key, n_boxes)


def _task(rows: list[str], key: str, n_boxes: int) -> WorldTask | None:
    solution = solve(rows)
    if solution is None or len(solution) < 3:
        return None
    statement = ("Sokoban. Push every box onto a target.\nLegend: # wall, _ floor, . target, "
                 "$ box, * box on target, @ you, + you on a target.\nMoves: U D L R (walking "
                 "into a box pushes it if the cell behind it is free).\nBoard:\n" + key)
    return WorldTask(task_id="", split="", statement=statement, solution=solution,
                     data={"grid": rows, "boxes": n_boxes})


@register_world("sokoban")
class SokobanWorld(KitWorld):
    name = "sokoban"
    roles = ("tool", "plan")
    stops = {"tool": (T.TOOL_CLOSE,), "plan": (T.ANSWER_CLOSE,)}  # where a turn ends

    draw = staticmethod(_draw)

    def __init__(self, sandbox: Any = None, max_turns: int = 3, timeout_s: float = 2.0):
        super().__init__(sandbox, max_turns, timeout_s)

    def reset(self, task: WorldTask) -> WorldState:
        return WorldState(task=task, data={"team_turn": 0, "grid": list(task.data["grid"]),
                                           "tool_output": ""})

    def observe(self, state: WorldState, role: str) -> str:
        self._check_role(role)
        board = "\n".join(state.data["grid"])
        parts = [state.task.statement.split("\nBoard:\n")[0], f"Current board:\n{board}",
                 f"Team turn {state.team_turn + 1} of {self.max_turns}."]
        for turn in state.turns[-2 * 2:]:
            parts.append(f"[{turn.role}] {clip(turn.action, 300)}\n-> {turn.feedback}")
        if role == "tool":
            parts.append("You are the tool agent. Write Python code; it runs with GRID (the "
                         "current board, a list of strings) defined. Its printed output is "
                         "shown to the plan agent; print the moves on the last line. Answer as "
                         "<tool>code</tool>.")
        else:
            parts.append(f"Tool output: {state.data['tool_output'] or '(none)'}\nYou are the "
                         "plan agent. Answer with the moves, e.g. <answer>R R D</answer>.")
        return "\n\n".join(parts)

    def play(self, state: WorldState, role: str, action: str) -> tuple[float, str]:
        if role == "tool":
            return self._tool(state, action)
        return self._plan(state, action)

    def solved(self, state: WorldState) -> bool:
        return Board(state.data["grid"]).solved()

    def _tool(self, state: WorldState, action: str) -> tuple[float, str]:
        code = f"GRID = {state.data['grid']!r}\n" + code_of(action)
        run = run_code(self.sandbox, code, self.timeout_s)
        state.data["tool_output"] = run.output if run.ok else run.error
        if not run.ok:
            return 0.0, run.error
        lines = [ln for ln in run.output.splitlines() if ln.strip()]
        moves = parse_moves(lines[-1]) if lines else None
        if not moves:
            return 0.2, f"ran; output: {run.output or '(none)'}"
        board = Board(state.data["grid"])
        applied = board.play(moves[:MAX_MOVES])
        if applied == len(moves) and board.solved():
            return 1.0, f"ran; its moves solve the board: {run.output}"
        if applied == len(moves):
            return 0.5, f"ran; its moves are legal but leave the board unsolved: {run.output}"
        return 0.2, f"ran; move {applied + 1} of its output is illegal: {run.output}"

    def _plan(self, state: WorldState, action: str) -> tuple[float, str]:
        moves = parse_moves(action)
        if moves is None:
            return 0.0, Malformed("could not read moves: answer with U D L R only, e.g. "
                                  "<answer>R R D</answer>")
        moves = moves[:MAX_MOVES]
        board = Board(state.data["grid"])
        before = board.distance()
        applied = board.play(moves)
        state.data["grid"] = board.rows()
        if board.solved():
            return 1.0, f"solved after {applied} moves"
        progress = max(0.0, (before - board.distance()) / before) if before else 0.0
        reward = round(0.2 * applied / len(moves) + 0.4 * progress, 4)
        stop = "" if applied == len(moves) else f"; move {applied + 1} ({moves[applied]}) is " \
            "illegal, the rest were dropped"
        return reward, f"applied {applied} of {len(moves)} moves{stop}; not solved yet"

    def score(self, state: WorldState) -> float:
        return 1.0 if Board(state.data["grid"]).solved() else 0.0

    def expert_action(self, state: WorldState, role: str) -> str:
        self._check_role(role)
        if role == "tool":
            return f"{T.TOOL_OPEN}{EXPERT_TOOL_CODE}{T.TOOL_CLOSE}"
        return f"{T.ANSWER_OPEN}{' '.join(solve(state.data['grid']) or '')}{T.ANSWER_CLOSE}"
