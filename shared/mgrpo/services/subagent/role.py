"""A turn team's role worker (``mgrpo.services.team`` says how a turn_team round runs
through the services): :class:`RoleWorker` on ``subagent.<role>`` samples each turn call
(``SubAgentCall`` with ``turn``: one role's team turn, K requests per live task) with its
model's newest weights of the round's run and replies with the completions.

What this module does NOT do: apply actions or score them (the coordinator,
``mgrpo.services.planner.team``, holds the world) or send trajectories (the coordinator
sends each model its candidates).
"""

from __future__ import annotations

import logging
import threading

from mgrpo.bus.messages import SubAgentCall, SubAgentResult, TurnCompletion, TurnRequest
from mgrpo.config import Settings
from mgrpo.engines.base import GenerationRequest, SamplingParams
from mgrpo.engines.registry import build_engine
from mgrpo.services.batching import consume_batches
from mgrpo.services.context import (
    Queues,
    agent_engine,
    refresh_weights,
    round_spec,
)
from mgrpo.services.subagent.worker import start_heartbeat
from mgrpo.training.config import RunConfig

log = logging.getLogger(__name__)


def _request(spec: TurnRequest) -> GenerationRequest:
    return GenerationRequest(list(spec.prompt_ids), SamplingParams(
        temperature=spec.temperature, top_p=spec.top_p, top_k=spec.top_k,
        max_new_tokens=spec.max_new_tokens, stop=list(spec.stop),
        stop_token_ids=list(spec.stop_token_ids), seed=spec.seed))


class RoleWorker:
    """One role of a turn team (``name``): samples the turn calls on ``subagent.<name>`` with
    the model ``cfg.agents[name]`` (the round's run's newest weights; before its first
    checkpoint, ``model_path`` or the run config's path) and replies."""

    def __init__(self, settings: Settings, cfg: RunConfig, store, bus, name: str,
                 batch_size: int = 64, heartbeat_s: float = 10.0,
                 model_path: str | None = None) -> None:
        self.settings, self.cfg, self.store, self.bus = settings, cfg, store, bus
        self.name, self.batch_size = name, batch_size
        self.model = cfg.agents[name]
        mcfg = cfg.models[self.model]
        _, self.tokenizer, self.engine = build_engine(
            agent_engine(cfg, name, settings), model_path or mcfg.path, settings.device,
            lora=mcfg.lora)
        refresh_weights(store, self.engine, self.model, cfg.name, cfg)
        self.queues = Queues(settings.queue_prefix)
        self.calls_done, self.heartbeat_s = 0, heartbeat_s
        self._stop = threading.Event()
        self._rounds: dict[str, tuple[str, RunConfig]] = {}  # round id -> (run, config)

    def start(self) -> None:
        self.store.register_agent(self.name, self.model, self.queues.subagent(self.name),
                                  tool="", description=f"turn-team role {self.name}")
        consume_batches(self.bus, self.queues.subagent(self.name), self.handle_batch,
                        consumer=f"role-{self.name}", batch_size=self.batch_size,
                        claims=False, deadline_s=self.settings.handler_deadline_s)
        # alive in the store: the API starts a round only when every role's worker is
        start_heartbeat(self.store, self.name, self._stop, self.heartbeat_s)

    def stop(self) -> None:
        self._stop.set()

    def handle_batch(self, messages: list) -> dict[int, str]:
        refused: dict[int, str] = {}
        replies = []
        for i, call in enumerate(messages):
            if not isinstance(call, SubAgentCall) or call.turn is None \
                    or call.agent != self.name:
                raise TypeError(f"subagent.{self.name} of a turn team takes turn calls for "
                                f"{self.name!r}, got {getattr(call, 'kind', call)!r}")
            run = self._round(call.round_id)
            if run is None:
                refused[i] = f"round {call.round_id!r} of turn call {call.call_id!r} is not " \
                             "in the store"
                continue
            run_id, cfg = run
            refresh_weights(self.store, self.engine, self.model, run_id, cfg)
            done = self.engine.generate([_request(r) for r in call.turn])
            replies.append((call.reply_to, SubAgentResult(
                call_id=call.call_id, attempt=call.attempt, agent=self.name, result="",
                format_ok=True, weights_version=self.engine.version,
                completions=[TurnCompletion(completion_ids=list(c.completion_ids),
                                            logprobs=list(c.logprobs), text=c.text,
                                            finish_reason=c.finish_reason) for c in done])))
        if replies:
            self.bus.publish_many(replies)
        self.calls_done += len(replies)
        return refused

    def _round(self, round_id: str | None) -> tuple[str, RunConfig] | None:
        if round_id is None:
            return None
        if round_id not in self._rounds:
            record = self.store.get_round(round_id)
            if record is None:
                return None
            self._rounds[round_id] = (record.run_id, round_spec(record, self.cfg).run)
        return self._rounds[round_id]
