"""``plan_path``: an N x N grid with obstacles; the team must move from S to G.

A task is a grid of rows (``S`` start, ``G`` goal, ``#`` wall, ``.`` free) with at least one
path; its reference solution is a shortest path. The plan role answers a move string over
``U D L R`` (whitespace and commas ignored). The verifier walks it from S: every move must
stay on the grid and off walls, and the walk must end on G. Partial credit of a well-formed
answer that does not solve the task: 0.5 x the fraction of the shortest distance to G it
closed before stopping (a bad move stops the walk). The tool role's code (e.g. a BFS) runs
in the sandbox; its output is what the plan role sees. The expert writes that BFS, and the
planner copies a solving tool output (else answers its own BFS path).

``grid_input`` (default off): the tool is a code interpreter that holds the environment's
state. The world runs ``grid = [...]`` (the task's rows as a list of strings, written with
``repr``) before the tool's program, in the same interpreter, and the tool's observation says
so; the expert's BFS reads ``grid``, is the same text for every task, and prints the moves
space-separated (``U U R``: one token per move in our tokenizers, so the planner copying
that output copies tokens; written together, ``UUR`` is cut into different tokens after a
space and after ``<answer>``). Off: the program runs as written and the expert's BFS spells
the grid out as a literal (``g = [...]``) and prints the moves together.
"""

from __future__ import annotations

import random
from collections import deque

from mgrpo.envs.worlds.base import WorldTask, register_world
from mgrpo.envs.worlds.tool_plan import ToolPlanWorld

MOVES = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}


def find(grid: list[str], mark: str) -> tuple[int, int]:
    return next((r, row.index(mark)) for r, row in enumerate(grid) if mark in row)


def distances(grid: list[str]) -> dict[tuple[int, int], int]:
    """BFS distance to G of every reachable cell."""
    goal, n = find(grid, "G"), len(grid)
    dist = {goal: 0}
    queue = deque([goal])
    while queue:
        r, c = queue.popleft()
        for dr, dc in MOVES.values():
            nr, nc = r + dr, c + dc
            if 0 <= nr < n and 0 <= nc < n and grid[nr][nc] != "#" and (nr, nc) not in dist:
                dist[(nr, nc)] = dist[(r, c)] + 1
                queue.append((nr, nc))
    return dist


def shortest_path(grid: list[str]) -> str | None:
    dist = distances(grid)
    pos = find(grid, "S")
    if pos not in dist:
        return None
    path = []
    while dist[pos]:
        for move, (dr, dc) in MOVES.items():  # the first move that gets one step closer
            nxt = (pos[0] + dr, pos[1] + dc)
            if dist.get(nxt) == dist[pos] - 1:
                path.append(move)
                pos = nxt
                break
    return "".join(path)


def walk(grid: list[str], moves: str) -> tuple[tuple[int, int], bool]:
    """Where ``moves`` lead from S, and whether every move was valid (a bad one stops)."""
    n, (r, c) = len(grid), find(grid, "S")
    for move in moves:
        dr, dc = MOVES[move]
        nr, nc = r + dr, c + dc
        if not (0 <= nr < n and 0 <= nc < n) or grid[nr][nc] == "#":
            return (r, c), False
        r, c = nr, nc
    return (r, c), True


BFS_CODE = '''from collections import deque
g = {grid}
n = len(g)
s = next((r, row.index("S")) for r, row in enumerate(g) if "S" in row)
prev = {{s: None}}
q = deque([s])
while q:
    r, c = q.popleft()
    if g[r][c] == "G":
        break
    for m, dr, dc in (("U", -1, 0), ("D", 1, 0), ("L", 0, -1), ("R", 0, 1)):
        p = (r + dr, c + dc)
        if 0 <= p[0] < n and 0 <= p[1] < n and g[p[0]][p[1]] != "#" and p not in prev:
            prev[p] = ((r, c), m)
            q.append(p)
path, p = [], (r, c)
while prev[p] is not None:
    p, m = prev[p]
    path.append(m)
print("{sep}".join(reversed(path)))'''


@register_world("plan_path")
class PlanPath(ToolPlanWorld):
    name = "plan_path"
    answer_help = "the moves from S to G (U D L R)"

    def __init__(self, size: int = 5, walls: float = 0.25, grid_input: bool = False, **kw):
        super().__init__(**kw)
        if not 3 <= size <= 12:
            raise ValueError(f"plan_path: size={size} must be in 3..12")
        if not 0 <= walls < 0.6:
            raise ValueError(f"plan_path: walls={walls} must be in [0, 0.6)")
        if not isinstance(grid_input, bool):
            raise ValueError(f"plan_path: grid_input={grid_input!r} must be true or false")
        self.size, self.walls, self.grid_input = size, walls, grid_input

    def draw(self, rng: random.Random) -> tuple[str, WorldTask]:
        n = self.size
        while True:
            cells = [["#" if rng.random() < self.walls else "." for _ in range(n)]
                     for _ in range(n)]
            start, goal = rng.sample(range(n * n), 2)
            cells[start // n][start % n], cells[goal // n][goal % n] = "S", "G"
            grid = ["".join(row) for row in cells]
            path = shortest_path(grid)
            if path is not None and len(path) >= 2:
                key = "/".join(grid)
                statement = (f"Grid {n}x{n} (S start, G goal, # wall; moves U D L R):\n"
                             + "\n".join(grid))
                return key, WorldTask("", "", statement, path, {"grid": grid})

    def check(self, task: WorldTask, answer: str) -> tuple[float, bool, str]:
        moves = "".join(ch for ch in answer.upper() if ch not in " ,\n\t")
        if not moves or any(ch not in MOVES for ch in moves):
            return 0.0, False, "not a move string over U D L R"
        grid = task.data["grid"]
        (r, c), valid = walk(grid, moves)
        if valid and grid[r][c] == "G":
            return 1.0, True, "reached G"
        dist = distances(grid)
        start = dist[find(grid, "S")]
        closed = (start - dist.get((r, c), start)) / start
        why = "hit a wall or the edge" if not valid else "did not end on G"
        return 0.5 * max(0.0, closed), False, why

    def preamble(self, task: WorldTask) -> str:
        return f"grid = {list(task.data['grid'])!r}\n" if self.grid_input else ""

    def tool_note(self) -> str:
        return ("Your program starts with `grid` defined: the rows above as a list of "
                "strings.") if self.grid_input else ""

    def expert_code(self, task: WorldTask) -> str:
        if self.grid_input:
            return BFS_CODE.format(grid="grid", sep=" ")
        return BFS_CODE.format(grid=repr(task.data["grid"]), sep="")

    def expert_answer(self, task: WorldTask) -> str:
        return str(task.solution)
