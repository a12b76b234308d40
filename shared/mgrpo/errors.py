"""The ground floor's error base: what counts as a transient (infrastructure) failure.

Each room's errors that mean "our infrastructure failed, not the work" derive from
:class:`TransientError` (the sandbox service down, a publish the broker did not confirm).
Failures raised as a third party's exception types (a database driver's) are recognised by a
check their room registers with :func:`register_transient_check` when it is imported; the
bus (``mgrpo.bus.errors.is_transient``) asks :func:`is_transient_here` and so needs neither
the sandbox nor the store.

What this module does NOT do: retry, requeue or sleep (the consumers do), or import any other
first-party module.
"""

from __future__ import annotations

from collections.abc import Callable

TransientCheck = Callable[[BaseException], bool]

_CHECKS: list[TransientCheck] = []


class TransientError(RuntimeError):
    """Infrastructure failed, not the work at hand: retry it later, never dead-letter it."""


def register_transient_check(check: TransientCheck) -> TransientCheck:
    """Also count as transient every exception ``check`` returns True for (a room whose
    failures arrive as a library's exception types, e.g. the store's database errors)."""
    if check not in _CHECKS:
        _CHECKS.append(check)
    return check


def is_transient_here(error: BaseException) -> bool:
    """``error`` itself (not its causes) is a :class:`TransientError` or passes a registered
    check."""
    return isinstance(error, TransientError) or any(check(error) for check in _CHECKS)
