"""``python``: run the sub-agent's code through a sandbox executor; observe stdout, terse.

The executor is anything with ``execute(ExecRequest) -> ExecResult``: the in-process
``mgrpo.sandbox.local.LocalSandbox`` or the service's ``mgrpo.sandbox.client.SandboxClient``.
Observation: stripped stdout; on failure one short line (the exception's last line, or the
limit that was hit); always cut to ``max_chars``. Code the sandbox would refuse (not valid
Unicode, e.g. a lone surrogate; longer than ``ExecRequest`` allows) never reaches it: a model
can emit anything, so the refusal is a short ``error: ...`` observation, not an exception.

What it does not do: isolation (the executor's job) or retries. Executor exceptions (the
service is down: ``SandboxUnavailable``) propagate: an infrastructure failure must not look
like a model error, and the message carrying the call must not be consumed as if it ran.
"""

from __future__ import annotations

from typing import Protocol

from pydantic import Field, ValidationError

from mgrpo.sandbox.types import ExecRequest, ExecResult
from mgrpo.tools.registry import register_tool
from mgrpo.validation import StrictModel

NO_OUTPUT = "(no output)"


class Executor(Protocol):
    def execute(self, request: ExecRequest) -> ExecResult: ...


class PythonConfig(StrictModel):
    timeout_s: float = Field(5.0, gt=0, le=120, description="wall-clock limit per call")
    memory_mb: int = Field(256, ge=16, le=8192, description="address-space limit per call")
    max_chars: int = Field(200, ge=16, description="observation length cap")


def _truncate(text: str, cap: int) -> str:
    return text if len(text) <= cap else text[: cap - 3] + "..."


def refusal_of(error: ValidationError) -> str:
    """The observation for code ``ExecRequest`` refuses (one line; never echoes the code)."""
    first = error.errors()[0]
    if first["type"] == "string_unicode":
        return "error: code is not valid unicode text"
    if first["type"] == "string_too_long":
        limit = first.get("ctx", {}).get("max_length")
        return f"error: code too long (limit {limit} characters)"
    return f"error: code refused ({first['msg']})"


def observation_of(result: ExecResult, timeout_s: float) -> str:
    """The terse text a sub-agent sees for one execution."""
    if result.status == "ok":
        return result.stdout.strip() or NO_OUTPUT
    if result.status == "timeout":
        return f"error: timeout after {timeout_s:g}s"
    if result.status == "memory":
        return "error: memory limit"
    if result.status == "output_limit":
        return result.stdout.strip() + " ..."
    lines = [ln.strip() for ln in result.stderr.splitlines() if ln.strip()]
    return lines[-1] if lines else f"error: exit code {result.exit_code}"


@register_tool("python")
class PythonTool:
    name = "python"

    def __init__(self, executor: Executor, timeout_s: float = 5.0, memory_mb: int = 256,
                 max_chars: int = 200):
        self.config = PythonConfig(timeout_s=timeout_s, memory_mb=memory_mb, max_chars=max_chars)
        self.executor = executor

    def run(self, payload: str) -> str:
        try:
            request = ExecRequest(code=payload, timeout_s=self.config.timeout_s,
                                  memory_mb=self.config.memory_mb)
        except ValidationError as error:  # the model's code, not our config (checked above)
            return _truncate(refusal_of(error), self.config.max_chars)
        result = self.executor.execute(request)  # SandboxUnavailable propagates on purpose
        return _truncate(observation_of(result, self.config.timeout_s), self.config.max_chars)
