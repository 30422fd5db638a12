"""Query parameters shared by several routers: times and time ranges."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from service.api.problems import Problem


def parse_time(v: str | None, default: datetime, name: str) -> datetime:
    """RFC 3339 (naive means UTC) or Unix seconds; a 400 problem naming the parameter otherwise."""
    if v is None:
        return default
    try:
        if v.replace(".", "", 1).isdigit():
            return datetime.fromtimestamp(float(v), tz=UTC)
        t = datetime.fromisoformat(v)
    except ValueError:
        raise Problem(400, "Bad parameter", f"{name}={v!r} is neither RFC 3339 nor Unix seconds") from None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def time_range(start: str | None, end: str | None, default: timedelta) -> tuple[datetime, datetime]:
    """[start, end], defaulting to the last `default` before now; start must come first."""
    t_end = parse_time(end, datetime.now(UTC), "end")
    t_start = parse_time(start, t_end - default, "start")
    if t_start > t_end:
        raise Problem(400, "Bad parameter", "start must not be after end")
    return t_start, t_end
