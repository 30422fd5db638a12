"""The CLI's --at/--from/--to: ISO-8601 with a zone or Unix milliseconds, and a typo is refused, not replayed."""

from __future__ import annotations

import pytest
import typer

from service.detection.cli import parse_time_ms


def test_iso_and_milliseconds_name_the_same_instant() -> None:
    assert parse_time_ms("2026-11-30T12:00:00Z") == parse_time_ms("1796040000000") == 1_796_040_000_000
    assert parse_time_ms(" 2026-11-30T13:00:00+01:00 ") == 1_796_040_000_000


@pytest.mark.parametrize(("value", "says"), [
    ("1796040000", "Unix seconds?"),           # seconds where milliseconds were meant: 1970-01-21
    ("0", "Unix seconds?"),
    ("1796040000000000", "outside 2000-01-01"),  # microseconds
    ("1999-12-31T23:59:59Z", "outside 2000-01-01"),
    ("2026-11-30T12:00:00", "no time zone"),
    ("yesterday", "neither ISO-8601 nor Unix milliseconds"),
])
def test_a_time_that_cannot_be_meant_is_refused_with_why(value: str, says: str) -> None:
    with pytest.raises(typer.BadParameter, match=says.replace("?", r"\?")) as exc:
        parse_time_ms(value)
    assert repr(value.strip()) in str(exc.value)
