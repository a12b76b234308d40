"""The team reward reaches every role of a turn team (``mgrpo.training.team_play``): a
candidate's team reward is the world's score at the end of the team turn it starts, the
roles after it each playing one action on its state, so the first role's K candidates can
differ in team reward and alpha moves their group-relative advantages.

Scripted engines over a character tokenizer play the roles: the first role writes the
world's expert action for candidates 0, 2 and 3 and nothing readable for candidate 1; the
role after it plays its expert action on the state the first role's expert action leads to
when its request's seed is even (nothing readable otherwise), so two expert candidates of
one task can lead to different team outcomes."""

from __future__ import annotations

import pytest
import torch

from mgrpo.algo import at_grpo_advantages
from mgrpo.engines.base import Completion
from mgrpo.envs.worlds import build_world
from mgrpo.training.config import SamplingConfig
from mgrpo.training.episodes import AgentRuntime
from mgrpo.training.team_play import TeamSampler

K = 4
WORLDS = ["plan_path", "sudoku4", "sokoban", "coder_tester", "math_team"]
NOTHING = "nothing"


class CharTokenizer:
    """One id per character; every marker is id 0."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(ch) for ch in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(map(chr, ids))

    def convert_tokens_to_ids(self, token: str) -> int:
        return 0


class ScriptedEngine:
    """Writes ``turn(prompt text, index of the request in its call, seed)``."""

    def __init__(self, turn) -> None:
        self.turn, self.version, self.tok = turn, 0, CharTokenizer()

    def generate(self, requests) -> list[Completion]:
        out = []
        for i, req in enumerate(requests):
            text = self.turn(self.tok.decode(req.prompt_ids), i, req.params.seed)
            ids = self.tok.encode(text)
            out.append(Completion(list(req.prompt_ids), ids, [-1.0] * len(ids), text, "stop"))
        return out

    def load_weights(self, source, version: int) -> None:
        self.version = version


def play(world, tasks, runtimes, alpha: float, max_turns: int = 1):
    sampler = TeamSampler(world, runtimes, SamplingConfig(), K, alpha, max_turns)
    return sampler.run("r0", tasks, seed=7)


def first_role_groups(episodes, role: str) -> list[tuple[list[float], list[float]]]:
    """(turn rewards, team rewards) of ``role``'s K candidates of team turn 0, per task."""
    out = []
    for ep in episodes:
        cands = sorted((t for t in ep.candidates if t.agent == role and t.turn == 0),
                       key=lambda t: t.rollout)
        out.append(([t.reward for t in cands], [t.extra["r_team"] for t in cands]))
    return out


def advantages(rewards: list[float]) -> torch.Tensor:
    n = len(rewards)
    zeros = torch.zeros(n, dtype=torch.long)
    return at_grpo_advantages(torch.tensor(rewards), zeros, zeros, zeros).advantages


def expert_runtimes(world, tasks):
    first, second = world.roles
    starts = {world.observe(world.reset(t), first): t for t in tasks}
    after_expert = {}
    for task in tasks:
        state = world.reset(task)
        world.act(state, first, world.expert_action(state, first))
        after_expert[world.observe(state, second)] = world.expert_action(state, second)

    def first_turn(prompt: str, i: int, seed: int) -> str:
        task = starts[prompt]
        return NOTHING if i % K == 1 else world.expert_action(world.reset(task), first)

    def second_turn(prompt: str, i: int, seed: int) -> str:
        return after_expert.get(prompt, NOTHING) if seed % 2 == 0 else NOTHING

    tok = CharTokenizer()
    return {first: AgentRuntime(first, "a", ScriptedEngine(first_turn), tok),
            second: AgentRuntime(second, "b", ScriptedEngine(second_turn), tok)}


@pytest.mark.parametrize("name", WORLDS)
def test_first_role_advantages_move_with_alpha(name):
    world = build_world(name)
    first = world.roles[0]
    tasks = world.tasks("train", 3, 0)
    runtimes = expert_runtimes(world, tasks)
    by_alpha = {alpha: first_role_groups(play(world, tasks, runtimes, alpha), first)
                for alpha in (0.0, 1.0)}
    teams = [team for _, team in by_alpha[1.0]]
    assert any(len(set(team)) > 1 for team in teams), f"{name}: {first}'s candidates " \
        f"all lead to one team outcome: {teams}"
    assert teams == [team for _, team in by_alpha[0.0]]  # the same lookahead at every alpha
    moved = [not torch.allclose(advantages(r0), advantages(r1), atol=1e-4)
             for (r0, _), (r1, _) in zip(by_alpha[0.0], by_alpha[1.0], strict=True)]
    assert any(moved), f"{name}: {first}'s advantages are the same at alpha 0 and 1"


def test_hand_computed_plan_path_tool_group():
    """One Plan-Path task, K = 4 tool candidates: the expert's BFS (prints the path: local
    1.0), nothing readable (0.0), and twice ``print("U")`` (ran, wrong: 0.2). The planner
    copies the tool's output, so only the BFS leads to a solved grid: r_team = [1, 0, 0, 0].

    alpha 0: r = [1, 0, 0.2, 0.2], mean 0.35, population std sqrt(0.1475) = 0.38406:
    A = [1.6924, -0.9113, -0.3906, -0.3906].
    alpha 1: r = [2, 0, 0.2, 0.2], mean 0.6, std sqrt(0.66) = 0.81240:
    A = [1.7233, -0.7386, -0.4924, -0.4924]."""
    world = build_world("plan_path")
    task = world.tasks("train", 1, 0)[0]
    tool_actions = [world.expert_action(world.reset(task), "tool"), NOTHING,
                    '<tool>print("U")</tool>', '<tool>print("U")</tool>']

    def tool(prompt: str, i: int, seed: int) -> str:
        return tool_actions[i % K]

    def plan(prompt: str, i: int, seed: int) -> str:
        shown = prompt.split("Tool output: ", 1)[1].split("\n", 1)[0]
        return f"<answer>{shown}</answer>"

    tok = CharTokenizer()
    runtimes = {"tool": AgentRuntime("tool", "a", ScriptedEngine(tool), tok),
                "plan": AgentRuntime("plan", "b", ScriptedEngine(plan), tok)}
    expected = {0.0: ([1.0, 0.0, 0.2, 0.2], [1.6924, -0.9113, -0.3906, -0.3906]),
                1.0: ([2.0, 0.0, 0.2, 0.2], [1.7233, -0.7386, -0.4924, -0.4924])}
    for alpha, (rewards, adv) in expected.items():
        [(got, team)] = first_role_groups(play(world, [task], runtimes, alpha), "tool")
        assert team == [1.0, 0.0, 0.0, 0.0]
        assert got == pytest.approx(rewards)
        assert advantages(got).tolist() == pytest.approx(adv, abs=1e-4)
