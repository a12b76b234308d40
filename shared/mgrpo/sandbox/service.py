"""What the sandbox service needs beyond LocalSandbox: its settings and a bounded queue.

:class:`ConcurrencyGate` lets ``max_concurrency`` calls run (each in a worker thread, since a
call mostly waits on its child) and ``max_queue`` more wait; the next one is refused at once
with :class:`QueueFull` (HTTP 429), so an overloaded service sheds load instead of piling up
requests that will time out anyway. It does NOT do fairness between clients or priorities.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

T = TypeVar("T")


class SandboxServiceSettings(BaseSettings):
    """``MGRPO_SANDBOX_*`` env vars of ``mgrpo serve sandbox``."""

    model_config = SettingsConfigDict(env_prefix="MGRPO_SANDBOX_", extra="ignore")

    max_concurrency: int = Field(8, ge=1, le=128, description="Calls running at once. Each is "
                                 "one process; more than ~2x the cores only adds contention.")
    max_queue: int = Field(256, ge=0, description="Calls waiting for a slot; beyond -> 429.")
    output_limit_bytes: int = Field(1_000_000, ge=1, description="See SandboxLimits.")
    max_processes: int = Field(16, ge=1, description="See SandboxLimits.")
    max_memory_mb: int = Field(1024, ge=16, le=8192, description="See SandboxLimits: a "
                               "larger memory_mb is refused with 422.")
    max_body_bytes: int = Field(32 * 1024 * 1024, ge=1024, description="Largest request body "
                                "accepted (code is <= 10,000,000 characters); larger -> 413 "
                                "before the body is read.")


class QueueFull(RuntimeError):
    """Every slot is busy and the queue is full. ``retry_after_s``: a hint for the client."""

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ConcurrencyGate:
    """Run blocking calls with at most `max_concurrency` in flight and `max_queue` waiting."""

    def __init__(self, max_concurrency: int, max_queue: int):
        self.max_concurrency = max_concurrency
        self.max_queue = max_queue
        self._slots = asyncio.Semaphore(max_concurrency)
        self._pool = ThreadPoolExecutor(max_workers=max_concurrency,
                                        thread_name_prefix="sandbox")
        self.admitted = 0  # running + waiting
        self.running = 0

    @property
    def waiting(self) -> int:
        return self.admitted - self.running

    async def run(self, fn: Callable[..., T], *args) -> T:
        if self.admitted >= self.max_concurrency + self.max_queue:
            raise QueueFull(
                f"sandbox busy: {self.running} calls running and {self.waiting} queued "
                f"(max_concurrency={self.max_concurrency}, max_queue={self.max_queue}); "
                "retry later or raise MGRPO_SANDBOX_MAX_QUEUE")
        self.admitted += 1
        try:
            async with self._slots:
                self.running += 1
                try:
                    loop = asyncio.get_running_loop()
                    return await loop.run_in_executor(self._pool, fn, *args)
                finally:
                    self.running -= 1
        finally:
            self.admitted -= 1

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
