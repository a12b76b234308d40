"""``sudoku4``: a 4 x 4 Sudoku (digits 1-4; every row, column and 2 x 2 box holds each once).

A task is a puzzle of four rows of digits, ``0`` for a blank (6 to 10 blanks), made from a
seeded shuffle of one solved grid (digits relabelled, rows and columns swapped within and
across bands); its reference solution is that grid. The plan role answers the 16 digits of
the filled grid (whitespace ignored). The verifier accepts any grid that keeps the givens
and satisfies every row, column and box (a puzzle may have more than one solution). Partial
credit of a well-formed grid that does not: 0.5 x the fraction of the 12 units it satisfies.
The tool role's code (e.g. a backtracking solver) runs in the sandbox; the expert writes
one, and the planner copies a solving tool output (else answers the reference).
"""

from __future__ import annotations

import random

from mgrpo.envs.worlds.base import WorldTask, register_world
from mgrpo.envs.worlds.tool_plan import ToolPlanWorld, digits

BASE = [[1, 2, 3, 4], [3, 4, 1, 2], [2, 1, 4, 3], [4, 3, 2, 1]]
UNITS = ([[(r, c) for c in range(4)] for r in range(4)]
         + [[(r, c) for r in range(4)] for c in range(4)]
         + [[(br + r, bc + c) for r in range(2) for c in range(2)]
            for br in (0, 2) for bc in (0, 2)])


def satisfied_units(grid: list[list[int]]) -> int:
    return sum(sorted(grid[r][c] for r, c in unit) == [1, 2, 3, 4] for unit in UNITS)


def shuffled_solution(rng: random.Random) -> list[list[int]]:
    relabel = [0, *rng.sample([1, 2, 3, 4], 4)]
    bands = rng.sample([0, 2], 2)
    rows = [b + r for b in bands for r in rng.sample([0, 1], 2)]
    stacks = rng.sample([0, 2], 2)
    cols = [s + c for s in stacks for c in rng.sample([0, 1], 2)]
    grid = [[relabel[BASE[r][c]] for c in cols] for r in rows]
    return [list(row) for row in zip(*grid, strict=True)] if rng.random() < 0.5 else grid


SOLVER_CODE = '''g = {puzzle!r}
cells = [int(ch) for ch in "".join(g)]
def ok(i, v):
    r, c = divmod(i, 4)
    box = [(r // 2 * 2 + a) * 4 + c // 2 * 2 + b for a in range(2) for b in range(2)]
    peers = [r * 4 + k for k in range(4)] + [k * 4 + c for k in range(4)] + box
    return all(cells[p] != v for p in peers)
def solve(i=0):
    if i == 16:
        return True
    if cells[i]:
        return solve(i + 1)
    for v in range(1, 5):
        if ok(i, v):
            cells[i] = v
            if solve(i + 1):
                return True
    cells[i] = 0
    return False
solve()
print(" ".join("".join(map(str, cells[r * 4:r * 4 + 4])) for r in range(4)))'''


@register_world("sudoku4")
class Sudoku4(ToolPlanWorld):
    name = "sudoku4"
    answer_help = "the filled grid (16 digits 1-4, row by row)"

    def __init__(self, min_blanks: int = 6, max_blanks: int = 10, **kw):
        super().__init__(**kw)
        if not 1 <= min_blanks <= max_blanks <= 16:
            raise ValueError(f"sudoku4: blanks {min_blanks}..{max_blanks} must satisfy "
                             "1 <= min_blanks <= max_blanks <= 16")
        self.min_blanks, self.max_blanks = min_blanks, max_blanks

    def draw(self, rng: random.Random) -> tuple[str, WorldTask]:
        solution = shuffled_solution(rng)
        blanks = set(rng.sample(range(16), rng.randint(self.min_blanks, self.max_blanks)))
        puzzle = ["".join("0" if r * 4 + c in blanks else str(solution[r][c])
                          for c in range(4)) for r in range(4)]
        statement = "Sudoku 4x4 (0 = blank; rows, columns, 2x2 boxes hold 1-4):\n" + \
            "\n".join(puzzle)
        answer = " ".join("".join(map(str, row)) for row in solution)
        return "/".join(puzzle), WorldTask("", "", statement, answer, {"puzzle": puzzle})

    def check(self, task: WorldTask, answer: str) -> tuple[float, bool, str]:
        flat = digits(answer)
        if len(flat) != 16 or any(ch not in "1234" for ch in flat):
            return 0.0, False, "not 16 digits 1-4"
        givens = "".join(task.data["puzzle"])
        if any(g != "0" and g != a for g, a in zip(givens, flat, strict=True)):
            return 0.0, False, "changes a given digit"
        grid = [[int(flat[r * 4 + c]) for c in range(4)] for r in range(4)]
        units = satisfied_units(grid)
        if units == len(UNITS):
            return 1.0, True, "solved"
        return 0.5 * units / len(UNITS), False, f"{units}/12 units hold 1-4"

    def expert_code(self, task: WorldTask) -> str:
        return SOLVER_CODE.format(puzzle=task.data["puzzle"])

    def expert_answer(self, task: WorldTask) -> str:
        return str(task.solution)
