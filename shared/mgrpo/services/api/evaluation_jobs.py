"""Evaluations as background jobs of the planner API: ``POST /v1/evaluations`` starts one and
answers 202 at once; ``GET /v1/evaluations/{id}`` says how far it is and, once done, its
accuracy.

Why: an evaluation plays one episode per held-out question, minutes with a real model; held
in the planner (and an HTTP request) for its whole length, it would leave every query
unanswered until it ended. Its episodes go to the model thread's background lane
(:meth:`~mgrpo.services.api.query_batcher.QueryBatcher.submit_background`): a batch takes
the waiting queries first, keeping a quarter of its slots for the evaluation, so neither
waits for the other to finish; the job itself is an asyncio task that holds no server
thread.

Jobs live in the store (``evaluation_jobs``, ``mgrpo.store.evaluations``): the row is written
when the job starts, its ``played`` count every ``progress_s`` seconds (when it changed) and
its end (result or error) when it ends. ``GET`` answers what the store holds, the running
process too (never a count only its memory has), so any replica of the API answers for any
job, a restart forgets none, and a reading never goes back after a kill.

Who is alive, and one evaluation at a time: the process running a job holds the store lease
``evaluation`` (holder: its ``owner`` id, ``host:pid:random``, new for every process) and
renews it every third of ``lease_s`` (30 s). A second start, in this process or in another
replica, finds the lease held and gets :class:`Busy` (HTTP 429 with ``Retry-After``). When
the API starts, when a job is started and when ``GET`` reads a job running under another
owner, running jobs whose owner does not hold the lease unexpired are marked
``interrupted`` with a one-line reason. So a job of a process that was killed reads
``running`` for at most ``lease_s`` more, then ``interrupted``; a clean shutdown marks its
job ``interrupted`` and releases the lease at once. A process that was declared dead (it
stalled past ``lease_s``) writes nothing more: the store only updates a job that is still
running and still its own.

Queued (``send`` set, ``MGRPO_EVALUATION_QUEUE``): :meth:`EvaluationJobs.start` records the
job ``queued`` and sends the task ``mgrpo.control.evaluate``, holding the lease only while it
checks and sends; a Celery worker in a planner API process plays it with
:meth:`EvaluationJobs.play_queued` under a lease holder id of its own (so its process's own
starts are refused while it plays), on the same lane, with the same writes. A job that is no
longer queued is not played again. A job still queued ``queued_s`` (30 min) after it was
recorded ends ``failed`` at the next sweep (its task was lost: the retries of a task that
waits end in about 7 minutes), so a lost task does not refuse every later start.

What this module does NOT do: resume an interrupted job (start it again), or cancel one.
Its episodes are not stored, only its progress and its result.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from starlette.concurrency import run_in_threadpool

from mgrpo.bus.control import Evaluate
from mgrpo.errors import TransientError
from mgrpo.services.api.query_batcher import Busy
from mgrpo.services.api.schemas import EvaluationIn, EvaluationJobOut, EvaluationOut
from mgrpo.training.episodes import EpisodeJob, mix_seed
from mgrpo.training.scoring import score_episode

log = logging.getLogger(__name__)

LEASE = "evaluation"
LEASE_S = 30.0
PROGRESS_S = 1.0  # how stale a reading of ``played`` may be
ORPHAN_REASON = ("interrupted: the API process that ran it stopped before it ended (its "
                 "lease on 'evaluation' expired or was released); start it again")
SHUTDOWN_REASON = "interrupted: the API process that ran it shut down; start it again"
QUEUED_S = 1800.0  # a job still queued after this: its task is lost (retries end in ~7 min)
STALE_REASON = ("failed: no evaluation worker took it within {s:.0f} s of being queued (its "
                "task was lost); start it again")


def process_owner() -> str:
    """An id of this process, unique across hosts and restarts (a pid is reused)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass
class EvaluationJob:
    """The job this process runs (its row in the store is the shared view)."""

    evaluation_id: str
    request: EvaluationIn
    n_questions: int
    owner: str  # the holder of the lease while it runs, and the row's owner
    played: int = 0
    written: int = 0  # ``played`` as last written to the store
    lost: bool = False  # the store says it is no longer ours (declared dead meanwhile)
    created_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    task: asyncio.Task | None = None
    loop: asyncio.AbstractEventLoop | None = None  # the loop ``task`` runs on


class UnknownEvaluation(LookupError):
    """An evaluate task names an evaluation the store does not hold."""


class EvaluationBusy(TransientError):
    """Another evaluation holds the lease: the queued one waits (its task is retried)."""


class EvaluationJobs:
    """Evaluations in the store; this process's running one in ``_jobs`` (written on the
    event loop, or by the evaluation worker's thread for a queued job).

    ``send``: None, each evaluation runs in this process as an asyncio job (:meth:`start`);
    set (``mgrpo.services.api.evaluation_worker``), :meth:`start` records it queued and
    sends it as the ``mgrpo.control.evaluate`` task, which an evaluation worker plays with
    :meth:`play_queued`."""

    def __init__(self, store, owner: str | None = None, lease_s: float = LEASE_S,
                 progress_s: float = PROGRESS_S, keep: int = 20, lease: str = LEASE,
                 send: Callable[[Evaluate], None] | None = None,
                 queued_s: float = QUEUED_S) -> None:
        self.store, self.owner = store, owner or process_owner()
        self.lease_s, self.progress_s, self.keep, self.lease = lease_s, progress_s, keep, lease
        self.send, self.queued_s = send, queued_s
        self._jobs: dict[str, EvaluationJob] = {}
        self._starting: asyncio.Lock | None = None

    def running(self) -> EvaluationJob | None:
        return next(iter(self._jobs.values()), None)

    def recover(self) -> list[str]:
        """Mark interrupted the running jobs whose owner is gone; their ids (logged)."""
        if self.store is None:
            return []
        swept = self.store.interrupt_orphaned_evaluations(self.lease, ORPHAN_REASON)
        if swept:
            log.warning("evaluations %s were running in an API process that is gone: marked "
                        "interrupted", ", ".join(swept))
        if stale := self.store.expire_queued_evaluations(
                self.queued_s, STALE_REASON.format(s=self.queued_s)):
            log.warning("evaluations %s were queued for over %.0f s: marked failed",
                        ", ".join(stale), self.queued_s)
        return swept

    def on_startup(self) -> None:
        """:meth:`recover` when the API starts; a store that is not reachable yet is not
        fatal: the next start or ``GET`` sweeps again."""
        try:
            self.recover()
        except Exception as error:  # noqa: BLE001 - logged; swept later
            log.warning("evaluations: cannot sweep interrupted jobs at start (%s)", error)

    def get(self, evaluation_id: str) -> EvaluationJobOut | None:
        record = self.store.get_evaluation(evaluation_id)
        if (record is not None and record.status == "running" and record.owner != self.owner
                and evaluation_id in self.recover()):  # its owner is gone: say so now
            record = self.store.get_evaluation(evaluation_id)
        return None if record is None else self._out(record)

    def list(self) -> list[EvaluationJobOut]:
        return [self._out(record) for record in self.store.list_evaluations(self.keep)]

    def _out(self, record) -> EvaluationJobOut:
        request = EvaluationIn.model_validate(record.request)
        return EvaluationJobOut(
            evaluation_id=record.evaluation_id, status=record.status, split=request.split,
            greedy=request.greedy, n_questions=record.n_questions, played=record.played,
            result=EvaluationOut.model_validate(record.result) if record.result else None,
            error=record.error, created_at=record.created_at, finished_at=record.finished_at)

    async def start(self, state, body: EvaluationIn) -> EvaluationJobOut:
        """Start one in the background (or queue it, with ``send``); :class:`Busy` while
        one runs (or waits in the queue) here or elsewhere."""
        self._starting = self._starting or asyncio.Lock()
        async with self._starting:  # two starts at once in this process: one job
            if (running := self.running()) is not None:
                raise self._busy(state, running.evaluation_id, running.n_questions,
                                 running.played)
            await run_in_threadpool(self.recover)
            if not await run_in_threadpool(self.store.acquire_lease, self.lease, self.owner,
                                           self.lease_s):
                raise await run_in_threadpool(self._held, state)
            if self.send is not None:
                return await self._enqueue(state, body)
            job = EvaluationJob(uuid.uuid4().hex, body, body.n_questions, self.owner)
            try:
                record = await run_in_threadpool(
                    self.store.create_evaluation, job.evaluation_id, self.owner,
                    body.model_dump(mode="json"), body.n_questions)
            except BaseException:
                await run_in_threadpool(self.store.release_lease, self.lease, self.owner)
                raise
            self._jobs[job.evaluation_id] = job
            job.loop = asyncio.get_running_loop()
            job.task = job.loop.create_task(self._run(state, job))
            return self._out(record)

    def _held(self, state) -> Busy:
        """Why the lease could not be taken: the job that holds it, or the holder."""
        for status in ("running", "queued"):
            if other := self.store.list_evaluations(1, status):
                return self._busy(state, other[0].evaluation_id, other[0].n_questions,
                                  other[0].played, where="in another API process"
                                  if status == "running" else "(queued)")
        holder = self.store.get_lease(self.lease)
        left_s = (holder.expires_at - datetime.now(UTC)).total_seconds() if holder else 1
        return Busy(f"another API process holds the evaluation lease ({self.lease!r}) while "
                    "it starts or ends one; one at a time: retry shortly",
                    retry_after_s=max(1, math.ceil(left_s)))

    async def _enqueue(self, state, body: EvaluationIn) -> EvaluationJobOut:
        """Record a queued job and send its task; the lease (taken by :meth:`start`) is
        released once it is sent, so a worker can take it to play the job."""
        try:
            if queued := await run_in_threadpool(self.store.list_evaluations, 1, "queued"):
                raise self._busy(state, queued[0].evaluation_id, queued[0].n_questions, 0,
                                 where="(queued)")
            command = Evaluate(evaluation_id=uuid.uuid4().hex, **body.model_dump())
            record = await run_in_threadpool(
                self.store.create_evaluation, command.evaluation_id, "",
                body.model_dump(mode="json"), body.n_questions, "queued")
            try:
                await run_in_threadpool(self.send, command)
            except Exception as error:
                await run_in_threadpool(self.store.fail_queued_evaluation,
                                        command.evaluation_id, f"not sent to the evaluation "
                                        f"workers: {type(error).__name__}: {error}")
                raise
            return self._out(record)
        finally:
            await run_in_threadpool(self.store.release_lease, self.lease, self.owner)

    def play_queued(self, state, command: Evaluate) -> str:
        """Play the queued job ``command`` names, here, to its end (an evaluation worker's
        thread; blocks). ``skipped`` when it is no longer queued (a redelivered task: it
        runs once), ``interrupted`` when this process shut down meanwhile, else ``ended``.
        :class:`UnknownEvaluation` when it does not exist; :class:`EvaluationBusy` while
        another evaluation holds the lease."""
        record = self.store.get_evaluation(command.evaluation_id)
        if record is None:
            raise UnknownEvaluation(f"evaluation {command.evaluation_id!r} does not exist; "
                                    "POST /v1/evaluations records it before sending it")
        if record.status != "queued":
            log.info("evaluation %s is %s already: not played again", command.evaluation_id,
                     record.status)
            return "skipped"
        owner = process_owner()  # its own holder: this process's starts stay refused
        self.recover()
        if not self.store.acquire_lease(self.lease, owner, self.lease_s):
            raise EvaluationBusy(f"evaluation {command.evaluation_id} waits: another one "
                                 f"holds the lease {self.lease!r}")
        if not self.store.claim_evaluation(command.evaluation_id, owner):
            self.store.release_lease(self.lease, owner)
            log.info("evaluation %s was taken meanwhile: not played here",
                     command.evaluation_id)
            return "skipped"
        request = EvaluationIn.model_validate(record.request)
        job = EvaluationJob(command.evaluation_id, request, record.n_questions, owner)
        self._jobs[job.evaluation_id] = job

        async def play() -> None:
            job.loop, job.task = asyncio.get_running_loop(), asyncio.current_task()
            await self._run(state, job)

        try:
            asyncio.run(play())
        except asyncio.CancelledError:  # shut down: ``shutdown`` marked it interrupted
            self._jobs.pop(job.evaluation_id, None)
            return "interrupted"
        return "ended"

    def _busy(self, state, evaluation_id: str, n_questions: int, played: int,
              where: str = "") -> Busy:
        left = max(n_questions - played, 1)
        batcher = state.batcher
        per_batch = batcher.last_batch_s / batcher.max_batch if batcher else 1.0
        return Busy(f"evaluation {evaluation_id} is still running{' ' + where if where else ''}"
                    f" ({played}/{n_questions} played); one at a time: poll GET "
                    f"/v1/evaluations/{evaluation_id} and retry when it is done",
                    retry_after_s=max(1, math.ceil(left * per_batch)))

    async def _run(self, state, job: EvaluationJob) -> None:
        body = job.request
        keeper = asyncio.get_running_loop().create_task(self._keep(job))
        try:
            bench = await run_in_threadpool(state.benchmark)  # disk: off the event loop
            questions = bench.questions(body.split)[: body.n_questions]
            if len(questions) != job.n_questions:
                job.n_questions = len(questions)
                await self._write(job, n_questions=job.n_questions)
            # a fresh id per evaluation: sub-agents drop a call id they have answered before,
            # so a second evaluation of the same questions with the same ids would wait out
            # every delegation
            run = job.evaluation_id[:8]
            episodes_jobs = [EpisodeJob(q, f"query-eval{run}-{q.id}", 0, mix_seed("eval", q.id))
                             for q in questions]
            futures = state.query_batcher().submit_background(episodes_jobs, body.greedy)
            for future in futures:  # a cancelled episode (shutdown) was not played
                future.add_done_callback(lambda done: done.cancelled() or setattr(
                    job, "played", job.played + 1))
            episodes = await asyncio.gather(*futures, return_exceptions=True)
            failed = next((e for e in episodes if isinstance(e, BaseException)), None)
            if failed is not None:
                raise failed
            end = {"status": "done", "result": score(state, episodes).model_dump()}
        except Exception as error:  # the job says why; the server goes on
            log.exception("evaluation %s failed", job.evaluation_id)
            end = {"status": "failed", "error": f"{type(error).__name__}: {error}"}
        finally:  # also when cancelled (the loop is going away): ``shutdown`` writes that
            keeper.cancel()
        await self._end(job, played=job.played, **end)

    async def _keep(self, job: EvaluationJob) -> None:
        """Write ``played`` every ``progress_s`` s when it changed; renew the lease."""
        renew_s = self.lease_s / 3
        renewed = time.monotonic()
        while True:
            await asyncio.sleep(min(self.progress_s, renew_s))
            try:
                if job.played != job.written:
                    await self._write(job, played=job.played)
                if time.monotonic() - renewed >= renew_s:
                    held = await run_in_threadpool(self.store.acquire_lease, self.lease,
                                                   job.owner, self.lease_s)
                    renewed = time.monotonic()
                    if not held and not job.lost:
                        job.lost = True
                        log.error("evaluation %s: lease %r is held by another process: this "
                                  "one was taken for dead; nothing more is written",
                                  job.evaluation_id, self.lease)
            except Exception as error:  # noqa: BLE001 - the store is down: next period
                log.warning("evaluation %s: cannot write its progress (%s); retrying",
                            job.evaluation_id, error)

    async def _write(self, job: EvaluationJob, **values) -> bool:
        played = values.get("played")
        ours = await run_in_threadpool(self.store.update_evaluation, job.evaluation_id,
                                       job.owner, **values)
        if ours and played is not None:
            job.written = played
        if not ours and not job.lost:
            job.lost = True
            log.error("evaluation %s was marked interrupted meanwhile (this process %s was "
                      "taken for dead): its episodes play out, nothing more is written",
                      job.evaluation_id, job.owner)
        return ours

    async def _end(self, job: EvaluationJob, **end) -> None:
        for attempt in range(3):  # the end is what users wait for: a store hiccup is retried
            try:
                await self._write(job, **end)
                break
            except Exception as error:  # noqa: BLE001 - retried, then given up (logged)
                log.warning("evaluation %s: cannot write its end (%s), try %d/3",
                            job.evaluation_id, error, attempt + 1)
                await asyncio.sleep(1.0)
        self._jobs.pop(job.evaluation_id, None)
        try:  # without it the job's row stays running until another process sweeps it
            await run_in_threadpool(self.store.release_lease, self.lease, job.owner)
        except Exception as error:  # noqa: BLE001 - it expires by itself
            log.warning("evaluation lease: release failed (%s); it expires in %.0f s", error,
                        self.lease_s)

    def shutdown(self) -> None:
        """The process stops: its running job is marked interrupted, the lease released."""
        for job in list(self._jobs.values()):
            try:
                self.store.update_evaluation(job.evaluation_id, job.owner, played=job.played,
                                             status="interrupted", error=SHUTDOWN_REASON)
            except Exception as error:  # noqa: BLE001 - swept once the lease expires
                log.warning("evaluation %s: cannot mark it interrupted (%s)",
                            job.evaluation_id, error)
            if job.task is not None and job.loop is not None:  # then stop it (its loop may
                with contextlib.suppress(RuntimeError):  # be the worker's; closed: it ended)
                    job.loop.call_soon_threadsafe(job.task.cancel)
            self._jobs.pop(job.evaluation_id, None)
            try:
                self.store.release_lease(self.lease, job.owner)
            except Exception as error:  # noqa: BLE001 - it expires by itself
                log.warning("evaluation lease: release failed (%s)", error)


def score(state, episodes: list) -> EvaluationOut:
    """Accuracy under the run's verifier (``verifier:``, the planner's reward weights) and
    format validity."""
    verifier, weights = state.planner_runtime().verifier(state.cfg), state.cfg.rewards.planner
    correct = [score_episode(ep.answer, ep.format_ok, ep.job.question.answer, verifier,
                             weights, question=ep.job.question.question)[0]
               for ep in episodes]
    n = max(len(episodes), 1)
    return EvaluationOut(n=len(episodes), accuracy=sum(correct) / n,
                         format_valid=sum(ep.format_ok for ep in episodes) / n,
                         weights_version=max((ep.planner.weights_version for ep in episodes),
                                             default=0))
