"""Delegations over the bus: a :data:`~mgrpo.training.episodes.Dispatch` that sends each
:class:`~mgrpo.training.episodes.SubagentCall` as a ``SubAgentCall`` message to
``subagent.<role>`` and waits for the ``SubAgentResult`` replies on this worker's own reply
queue. The episode runner cannot tell it from the in-process pool.

A call to a role that is not registered (no sub-agent deployment), or one that gets no reply
within ``timeout_s``, comes back as ``FAILED_RESULT`` with no trajectory, exactly as the
in-process pool answers an unknown agent: the planner sees "none" and goes on.

What this module does NOT do: run sub-agents (``subagent.worker``) or keep trajectories: a
sub-agent's trajectory goes from the sub-agent worker straight to its own model's trainer.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable

from mgrpo.bus.messages import MAX_SUBTASK_CHARS, SubAgentCall, SubAgentResult
from mgrpo.envs import protocol as P
from mgrpo.training.config import RunConfig
from mgrpo.training.episodes import SubagentCall, SubagentOutcome
from mgrpo.training.subagents import FAILED_RESULT
from mgrpo.types import trajectory_id
from mgrpo.workflows.hierarchy import delegation_tree

log = logging.getLogger(__name__)


def worker_id() -> str:
    """Stable enough for a reply-queue name: host and pid (a pod name in Kubernetes)."""
    raw = f"{socket.gethostname()}-{os.getpid()}".lower()
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in raw)[:40]


def new_reply_suffix() -> str:
    """A suffix that keeps apart the reply queues of several dispatches in one process."""
    return "-" + uuid.uuid4().hex[:6]


def call_id_of(call: SubagentCall) -> str:
    """The sub-agent trajectory's id; calls outside a round (REST queries) get a fresh one."""
    round_id, query_id, rollout = call.key
    return trajectory_id(round_id, query_id, rollout, call.role, call.invocation)


class BusDispatch:
    """Send calls, wait for replies. ``queue_of(role)`` names a role's queue, or None when no
    such sub-agent is registered."""

    def __init__(self, bus, reply_queue: str, queue_of: Callable[[str], str | None],
                 timeout_s: float = 300.0, weights_version: int = 0) -> None:
        self.bus, self.reply_queue, self.queue_of = bus, reply_queue, queue_of
        self.timeout_s, self.weights_version = timeout_s, weights_version
        self._lock = threading.Lock()
        self._waiting: dict[str, SubAgentResult | None] = {}
        self._arrived = threading.Condition(self._lock)
        # no store claims per reply (two round trips each, on the delegation's critical
        # path): _on_reply is idempotent (a duplicate sets the same result or is dropped)
        bus.consume(reply_queue, self._on_reply, consumer=reply_queue, dedupe=False)

    def _on_reply(self, message) -> None:
        if not isinstance(message, SubAgentResult):
            raise TypeError(f"{self.reply_queue} takes subagent_result messages, got "
                            f"{message.kind!r}; send it to its own queue")
        key = f"{message.call_id}/{message.attempt}"
        with self._arrived:
            if key in self._waiting:  # a late reply to a call we gave up on is dropped
                self._waiting[key] = message
                self._arrived.notify_all()

    def __call__(self, calls: list[SubagentCall]) -> list[SubagentOutcome]:
        sent: list[tuple[int, str]] = []
        outcomes: list[SubagentOutcome | None] = [None] * len(calls)
        queues = {role: self.queue_of(role) for role in dict.fromkeys(c.role for c in calls)}
        # one send per role: its worker may start once it holds every call of the turn
        turn = uuid.uuid4().hex[:12]
        sizes = {role: sum(c.role == role for c in calls) for role in queues}
        sends = []  # the whole turn in one publish_many: one wait for the broker's confirms
        for i, call in enumerate(calls):
            queue = queues[call.role]
            if queue is None:
                outcomes[i] = _failed(call, "unknown agent")
                continue
            round_id, query_id, rollout = call.key
            in_round = not round_id.startswith("query-")
            call_id = call_id_of(call)
            message = SubAgentCall(
                call_id=call_id, round_id=round_id if in_round else None,
                query_id=query_id if in_round else None, rollout=rollout, attempt=call.attempt,
                agent=call.role, invocation=call.invocation,
                subtask=call.task[:MAX_SUBTASK_CHARS],  # a runaway task: its head
                reply_to=self.reply_queue, weights_version=self.weights_version,
                group=f"{self.reply_queue}/{turn}/{call.role}", group_size=sizes[call.role],
                seed=call.seed)
            key = f"{call_id}/{call.attempt}"
            with self._lock:
                self._waiting[key] = None
            sends.append((queue, message))
            sent.append((i, key))
        self._send(sends, [key for _, key in sent])
        for i, key in sent:
            reply = self._wait(key)
            outcomes[i] = (_failed(calls[i], f"no reply within {self.timeout_s:.0f} s")
                           if reply is None else
                           SubagentOutcome(result=reply.result, trajectory=None,
                                           trace=list(reply.trace)))
        return outcomes  # type: ignore[return-value]

    def request(self, sends: list[tuple[str, SubAgentCall]]) -> list[SubAgentResult | None]:
        """Publish each (queue, call) and wait for the replies (None: none within
        ``timeout_s``); for calls the runner does not make (AT-GRPO trees)."""
        keys = [f"{message.call_id}/{message.attempt}" for _, message in sends]
        with self._lock:
            self._waiting.update(dict.fromkeys(keys))
        self._send(list(sends), keys)
        return [self._wait(key) for key in keys]

    def _send(self, sends: list, keys: list[str]) -> None:
        """Publish the calls (one confirm wait); if that raises, stop waiting for them."""
        try:
            self.bus.publish_many(sends)
        except BaseException:
            with self._lock:
                for key in keys:
                    self._waiting.pop(key, None)
            raise

    def _wait(self, key: str) -> SubAgentResult | None:
        with self._arrived:
            self._arrived.wait_for(lambda: self._waiting.get(key) is not None,
                                   timeout=self.timeout_s)
            return self._waiting.pop(key, None)


def query_key(query_id: str | None = None) -> tuple[str, str, int]:
    """Episode key of a REST query (not part of any round)."""
    return (f"query-{uuid.uuid4().hex[:12]}", query_id or "q", 0)


def _failed(call: SubagentCall, why: str) -> SubagentOutcome:
    log.warning("delegation to %r failed: %s", call.role, why)
    return SubagentOutcome(result=FAILED_RESULT, trajectory=None,
                           trace=[{"agent": call.role, "task": call.task, "error": why}])


def registered_queue(store, role: str) -> str | None:
    """The queue a registered sub-agent listens on; None: no such sub-agent (the call fails
    fast instead of waiting on a queue nobody reads)."""
    return next((a.queue for a in store.list_agents() if a.name == role), None)


def agent_cards(store, cfg: RunConfig, alive_within_s: float | None = None) -> list:
    """The planner's header lists the REGISTERED sub-agents it may call (docs/services.md,
    'One round (distributed)', step 2): its
    callees in the delegation tree (every sub-agent of a flat hierarchy) in the order of the
    run config, then any other registered ones the run config does not name."""
    registered = {a.name: a for a in store.list_agents(alive_within_s=alive_within_s)}
    callees = delegation_tree(cfg.agents, cfg.delegation)["planner"]
    order = [r for r in cfg.agents if r in callees] + sorted(
        r for r in registered if r not in cfg.agents)
    return [P.AgentCard(name=name, description=registered[name].description or name)
            for name in dict.fromkeys(order) if name in registered]
