"""Play a turn-based team on a world with AT-GRPO's tree sampling (Stronger-MAS, Zhao et al.,
arXiv 2510.11062, Algorithm 1), batched across tasks.

The paper's sampling, not K independent episodes: at each team turn t, each role i in the
world's order samples K candidate actions from the SAME state (its observation ``o_{t,i}``,
K requests on one prompt with seeds differing by candidate). Each candidate is applied to
its own copy of the state and scored with the turn reward ``r = alpha * r_team + r_local``
(``mgrpo.algo.mix_turn_reward``): ``r_local`` is the world's reward of the action
(``Turn.reward``), ``r_team`` the world's verdict on the team's state right after it
(``World.score``: team progress known at branch time, before the rest of the episode is
played; only the chosen candidate is continued, so a final outcome exists for one candidate
per group, not all K). The episode continues from the best candidate
(``mgrpo.algo.greedy_choice``, ties to the lowest k). Every candidate becomes a training
sample - its observation (mask 0) plus its action (mask 1) - keyed (task, role, team turn),
the group of ``mgrpo.algo.at_grpo_advantages``; each role's samples train the model that
plays it. ``greedy=True`` plays one greedy action per turn (evaluation).

An episode ends when the world says so (solved or its own limit) or after ``max_turns``
team turns.

What this module does not do: advantages and updates (``mgrpo.training.tree_round``,
``mgrpo.training.team_round``) or the store.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch

from mgrpo.algo import greedy_choice, mix_turn_reward
from mgrpo.engines.base import GenerationRequest
from mgrpo.envs import protocol_tokens as T
from mgrpo.envs.worlds.base import World, WorldState, WorldTask
from mgrpo.training.config import SamplingConfig
from mgrpo.training.episodes import AgentRuntime, encode, mix_seed, sampling_params, stop_ids
from mgrpo.types import Trajectory, trajectory_id

# Where a turn's generation ends when the world names no stops of its own (``World.stops``).
DEFAULT_STOPS = (T.TOOL_CLOSE, T.ANSWER_CLOSE, T.RETURN_CLOSE, T.CALL_CLOSE)


@dataclass
class TeamEpisode:
    """One task's tree: the state the chosen candidates led to, and every candidate."""

    task: WorldTask
    state: WorldState
    candidates: list[Trajectory] = field(default_factory=list)
    generated_tokens: int = 0


class TeamSampler:
    """Plays a world's team with one :class:`AgentRuntime` per role (runtimes of one shared
    model, or of one model per role)."""

    def __init__(self, world: World, runtimes: dict[str, AgentRuntime],
                 sampling: SamplingConfig, k: int, alpha: float, max_turns: int):
        missing = [r for r in world.roles if r not in runtimes]
        if missing:
            raise ValueError(f"world {world.name!r}: no model plays roles {missing}")
        self.world, self.runtimes, self.sampling = world, runtimes, sampling
        self.k, self.alpha, self.max_turns = k, alpha, max_turns

    def run(self, round_id: str, tasks: list[WorldTask], seed: int,
            greedy: bool = False) -> list[TeamEpisode]:
        episodes = [TeamEpisode(t, self.world.reset(t)) for t in tasks]
        for team_turn in range(self.max_turns):
            for role in self.world.roles:
                live = [ep for ep in episodes if not ep.state.done]
                if not live:
                    return episodes
                self._branch(role, team_turn, live, round_id, seed, greedy)
        return episodes

    def _branch(self, role: str, team_turn: int, live: list[TeamEpisode], round_id: str,
                seed: int, greedy: bool) -> None:
        """K candidates of ``role`` per live episode, scored on copies of its state; the
        best one's state continues."""
        runtime = self.runtimes[role]
        tok = runtime.tokenizer
        k = 1 if greedy else self.k
        markers = getattr(self.world, "stops", {}).get(role, DEFAULT_STOPS)
        stops = stop_ids(tok, [*markers, T.EOS])
        prompts = [encode(tok, self.world.observe(ep.state, role)) for ep in live]
        requests = [GenerationRequest(list(prompt), sampling_params(
            self.sampling, stops, mix_seed(seed, round_id, ep.task.task_id, role, team_turn, c),
            greedy=greedy)) for ep, prompt in zip(live, prompts, strict=True) for c in range(k)]
        completions = runtime.engine.generate(requests)
        for i, (ep, prompt) in enumerate(zip(live, prompts, strict=True)):
            tried = []
            for completion in completions[i * k:(i + 1) * k]:
                state = copy.deepcopy(ep.state)
                turn = self.world.act(state, role, completion.text)
                tried.append((completion, state, turn, float(self.world.score(state))))
            rewards = [float(mix_turn_reward(team, turn.reward, self.alpha))
                       for _, _, turn, team in tried]
            best = int(greedy_choice(torch.tensor(rewards, dtype=torch.float64),
                                     torch.zeros(k, dtype=torch.long))[0])
            for c, ((completion, _, turn, team), reward) in enumerate(
                    zip(tried, rewards, strict=True)):
                ids = completion.completion_ids
                ep.generated_tokens += len(ids)
                base = trajectory_id(round_id, ep.task.task_id, c, role, 0)
                ep.candidates.append(Trajectory(
                    traj_id=f"{base}/t{team_turn}", round_id=round_id,
                    query_id=ep.task.task_id, rollout=c, agent=role, model=runtime.model,
                    weights_version=runtime.engine.version, turn=team_turn,
                    input_ids=prompt + ids, response_mask=[0] * len(prompt) + [1] * len(ids),
                    old_logprobs=[0.0] * len(prompt) + list(completion.logprobs),
                    result=turn.feedback[:200], reward=reward,
                    extra={"r_team": team, "r_local": turn.reward, "chosen": c == best}))
            ep.state = tried[best][1]
