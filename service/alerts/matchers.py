"""Silence matchers: user-supplied regular expressions run on RE2, never on Python's `re`.

A silence's `=~` / `!~` value is written by any operate-scope token and evaluated against every
alert inside the detection cycle that holds the alert lock. Python's backtracking engine takes
exponential time on patterns like `(.|.)*y`, so one silence could freeze alerting. RE2 (the engine
family of Alertmanager's Go regexp) matches in time linear in the input, and refuses what it cannot
do that way (backreferences, lookaround): such a pattern is refused when the silence is written.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import re2

log = logging.getLogger(__name__)

# Bounded memory per compiled pattern (RE2 falls back to a slower, still linear, matcher past it).
_OPTIONS = re2.Options()
_OPTIONS.log_errors = False
_OPTIONS.max_mem = 8 << 20


class PatternError(ValueError):
    """A pattern RE2 refuses: bad syntax, or a feature with no linear-time match (e.g. backreferences)."""


@functools.lru_cache(maxsize=4096)
def compile_pattern(pattern: str) -> Any:
    """The compiled RE2 pattern; PatternError with RE2's reason when it is refused."""
    try:
        return re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        reason = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise PatternError(f"not a valid RE2 regular expression: {reason}") from None


def fullmatch(pattern: str, value: str) -> bool:
    """Anchored match, as Alertmanager's `=~`."""
    return compile_pattern(pattern).fullmatch(value) is not None


@functools.lru_cache(maxsize=1024)
def _stored(pattern: str) -> Any | None:
    try:
        return compile_pattern(pattern)
    except PatternError as exc:  # logged once per pattern, not once per alert and cycle
        log.warning("silence pattern %r matches nothing: %s", pattern, exc)
        return None


def matcher_hits(m: dict[str, Any], value: str) -> bool:
    """Whether one stored matcher ({name, value, is_regex, is_equal}) accepts a label value.

    A stored pattern RE2 refuses (written before patterns were checked against RE2) matches nothing,
    so its silence mutes nothing rather than stopping the cycle.
    """
    if m.get("is_regex"):
        rx = _stored(m["value"])
        if rx is None:
            return False
        hit = rx.fullmatch(value) is not None
    else:
        hit = value == m["value"]
    return hit if m.get("is_equal", True) else not hit
