"""Acme's turn-based team, as a user writes it: a world (``acme_spell``: a writer spells a
word backwards, a reviewer says whether the writer got it right) and a workflow
(``acme_pair``: a turn team that always plays ``acme_spell``), registered from this package.
mgrpo never names them: a run config imports this module through ``plugins:``
(tests/user_task/team.yaml)."""

from __future__ import annotations

import random

from mgrpo.envs.worlds import Turn, WorldState, WorldTask, register_world
from mgrpo.workflows import TurnTeam, register_workflow

WORDS = ["ostra", "kelvar", "mirn", "tabet", "quill", "sorrel", "vanta", "plume", "brisk",
         "cairn", "dune", "ember", "fjord", "glint", "haze", "inlet", "jolt", "knoll"]


def _inside(text: str) -> str | None:
    start, end = text.find("<answer>"), text.find("</answer>")
    if start < 0:
        return None
    return text[start + 8:end if end > start else None].strip().lower()


@register_world("acme_spell")
class AcmeSpell:
    name = "acme_spell"
    roles = ("writer", "reviewer")
    stops = {"writer": ("</answer>",), "reviewer": ("</answer>",)}

    def __init__(self, max_turns: int = 2):
        self.max_turns = max_turns

    def tasks(self, split: str, n: int, seed: int) -> list[WorldTask]:
        words = [w for i, w in enumerate(WORDS) if (i % 6 == 0) == (split == "test")]
        rng = random.Random(f"{split}/{seed}")
        return [WorldTask(f"acme-{split}-{seed}-{i}", split, f"Spell backwards: {w}",
                          w[::-1]) for i, w in enumerate(rng.choices(words, k=n))]

    def reset(self, task: WorldTask) -> WorldState:
        return WorldState(task, data={"team_turn": 0, "written": "", "right": False})

    def observe(self, state: WorldState, role: str) -> str:
        if role == "writer":
            return f"{state.task.statement}\nAnswer as <answer>...</answer>\n"
        return (f"{state.task.statement}\nThe writer wrote: {state.data['written']}\n"
                "Is it right? <answer>yes</answer> or <answer>no</answer>\n")

    def act(self, state: WorldState, role: str, action: str) -> Turn:
        gold = state.task.solution
        if role == "writer":
            written = _inside(action) or ""
            state.data.update(written=written, right=written == gold)
            # local: the share of the word's letters the text holds (graded, even for noise)
            reward = sum(ch in action.lower() for ch in gold) / len(gold)
        else:
            verdict = _inside(action)
            reward = float(verdict == ("yes" if state.data["right"] else "no"))
        turn = Turn(state.team_turn, role, self.observe(state, role), action, reward)
        state.turns.append(turn)
        if role == "reviewer":
            state.data["team_turn"] = state.team_turn + 1
        state.done = state.data["right"] or state.team_turn >= self.max_turns
        return turn

    def score(self, state: WorldState) -> float:
        return float(state.data["right"])

    def expert_action(self, state: WorldState, role: str) -> str:
        if role == "writer":
            return f"<answer>{state.task.solution}</answer>"
        return "<answer>yes</answer>" if state.data["right"] else "<answer>no</answer>"


class AcmePair(TurnTeam):
    """A turn team whose world is always ``acme_spell``."""

    name = "acme_pair"
    description = "Acme's writer and reviewer take turns on acme_spell"

    def prepare(self, data: dict) -> dict:
        flow = data["workflow"]
        if flow.get("world", "acme_spell") != "acme_spell":
            raise ValueError("workflow acme_pair plays the world acme_spell only")
        return super().prepare({**data, "workflow": {**flow, "world": "acme_spell"}})


register_workflow(AcmePair())
