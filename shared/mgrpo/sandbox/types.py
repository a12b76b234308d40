"""Request and result of one sandboxed code execution (the sandbox service's JSON too)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

ExecStatus = Literal["ok", "timeout", "memory", "output_limit", "error"]


class ExecRequest(BaseModel):
    code: str = Field(max_length=10_000_000)
    timeout_s: float = Field(5.0, gt=0, le=120)
    memory_mb: int = Field(256, ge=16, le=8192)


class ExecResult(BaseModel):
    status: ExecStatus
    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    duration_s: float = 0.0
