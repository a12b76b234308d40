"""Play a turn-based team on a world with AT-GRPO's tree sampling (Stronger-MAS, Zhao et al.,
arXiv 2510.11062, Algorithm 1), batched across tasks.

The paper's sampling, not K independent episodes: at each team turn t, each role i in the
world's order samples K candidate actions from the SAME state (its observation ``o_{t,i}``,
K requests on one prompt with seeds differing by candidate). Each candidate is applied to
its own copy of the state and scored with the turn reward (``mgrpo.algo.mix_turn_reward``)::

    r_{t,i}^k = alpha * R_team(s_{t+1}^k) + r_local(a_{t,i}^k)

``r_local`` is the world's reward of the action (``Turn.reward``). ``R_team`` is the world's
verdict (``World.score``) on ``s_{t+1}^k``, the team's state at the END of team turn t
reached from candidate k: the roles after i in the world's order each play one action on
the candidate's copy (the lookahead: sampled like the candidates, greedy in greedy play, on
seeds of their own). The last role's candidates end the team turn themselves, so theirs is
the score right after their action. Every role's candidates can thus differ in team reward,
the first role's too (its action only changes the score through the roles after it); a
state the candidate ends (``done``) is scored as it is. The lookahead's actions are not
training samples and do not continue the episode. Cost: for a role with j roles after it,
j extra generations per candidate (two-role worlds: K per task and team turn, the second
role's K again); with one candidate (``k=1``, evaluation) nothing is compared and no
lookahead is played: ``R_team`` is then the score after the candidate's own action.

The episode continues from the best candidate (``mgrpo.algo.greedy_choice``, ties to the
lowest k). Every candidate becomes a training sample - its observation (mask 0) plus its
action (mask 1) - keyed (task, role, team turn), the group of
``mgrpo.algo.at_grpo_advantages``; each role's samples train the model that plays it.
``greedy=True`` plays one greedy action per turn (evaluation).

Sampling seeds are a function of the run's seed, the round (the ``seed`` passed to
:meth:`TeamSampler.run`), task, role, team turn and candidate: never of the run's name or
round id, so two runs that differ only in name (two ablation arms with the same settings)
sample the same tokens.

An episode ends when the world says so (solved or its own limit) or after ``max_turns``
team turns.

What this module does not do: advantages and updates (``mgrpo.training.tree_round``,
``mgrpo.training.team_round``) or the store.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch

from mgrpo import protocol_tokens as T
from mgrpo.algo import greedy_choice, mix_turn_reward
from mgrpo.engines.base import GenerationRequest
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
        """K candidates of ``role`` per live episode, each applied to a copy of its state,
        the team turn finished on it (:meth:`_team_outcomes`) and scored; the best one's
        state continues."""
        runtime = self.runtimes[role]
        k = 1 if greedy else self.k
        prompts = [encode(runtime.tokenizer, self.world.observe(ep.state, role)) for ep in live]
        completions = runtime.engine.generate([
            GenerationRequest(list(prompt), self._params(
                role, mix_seed(seed, ep.task.task_id, role, team_turn, c), greedy))
            for ep, prompt in zip(live, prompts, strict=True) for c in range(k)])
        states, turns = [], []
        for i, ep in enumerate(live):
            for completion in completions[i * k:(i + 1) * k]:
                state = copy.deepcopy(ep.state)
                turns.append(self.world.act(state, role, completion.text))
                states.append(state)
        teams = self._team_outcomes(role, team_turn, live, states, k, seed, greedy)
        for i, (ep, prompt) in enumerate(zip(live, prompts, strict=True)):
            mine = slice(i * k, (i + 1) * k)
            team = teams[mine]
            rewards = [float(mix_turn_reward(r_team, turn.reward, self.alpha))
                       for r_team, turn in zip(team, turns[mine], strict=True)]
            best = int(greedy_choice(torch.tensor(rewards, dtype=torch.float64),
                                     torch.zeros(k, dtype=torch.long))[0])
            for c, (completion, turn) in enumerate(zip(completions[mine], turns[mine],
                                                       strict=True)):
                ids = completion.completion_ids
                ep.generated_tokens += len(ids)
                base = trajectory_id(round_id, ep.task.task_id, c, role, 0)
                ep.candidates.append(Trajectory(
                    traj_id=f"{base}/t{team_turn}", round_id=round_id,
                    query_id=ep.task.task_id, rollout=c, agent=role, model=runtime.model,
                    weights_version=runtime.engine.version, turn=team_turn,
                    input_ids=prompt + ids, response_mask=[0] * len(prompt) + [1] * len(ids),
                    old_logprobs=[0.0] * len(prompt) + list(completion.logprobs),
                    result=turn.feedback[:200], reward=rewards[c],
                    extra={"r_team": team[c], "r_local": turn.reward,
                           "chosen": c == best}))
            ep.state = states[i * k + best]

    def _team_outcomes(self, role: str, team_turn: int, live: list[TeamEpisode],
                       states: list[WorldState], k: int, seed: int, greedy: bool
                       ) -> list[float]:
        """``R_team(s_{t+1}^k)`` of each candidate's state (``states``: K per live episode,
        in order): ``World.score`` once the roles after ``role`` in the world's order have
        each played one action on a copy of it (none after the last role, or with one
        candidate). Their tokens count in the episodes' ``generated_tokens``."""
        order = list(self.world.roles)
        later = order[order.index(role) + 1:] if k > 1 else []
        ahead = [copy.deepcopy(s) for s in states] if later else states
        for next_role in later:
            runtime = self.runtimes[next_role]
            todo = [j for j, s in enumerate(ahead) if not s.done]
            if not todo:
                break
            completions = runtime.engine.generate([GenerationRequest(
                encode(runtime.tokenizer, self.world.observe(ahead[j], next_role)),
                self._params(next_role, mix_seed(seed, "lookahead", live[j // k].task.task_id,
                                                 role, team_turn, j % k, next_role), greedy))
                for j in todo])
            for j, completion in zip(todo, completions, strict=True):
                self.world.act(ahead[j], next_role, completion.text)
                live[j // k].generated_tokens += len(completion.completion_ids)
        return [float(self.world.score(s)) for s in ahead]

    def _params(self, role: str, seed: int, greedy: bool):
        """``role``'s sampling parameters: its stop markers (``World.stops``, default every
        closing marker of the protocol) and EOS."""
        markers = getattr(self.world, "stops", {}).get(role, DEFAULT_STOPS)
        stops = stop_ids(self.runtimes[role].tokenizer, [*markers, T.EOS])
        return sampling_params(self.sampling, stops, seed, greedy=greedy)
