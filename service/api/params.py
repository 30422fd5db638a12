"""Query parameters shared by several routers: times and time ranges, and a hot route's parameters read as
one model (`read_query`).

A time is RFC 3339 (no zone means UTC) or Unix milliseconds, the unit of import timestamps,
`detect --at` and `backtest`. Both forms must lie in [TIME_MIN, TIME_MAX): that keeps date
arithmetic away from Python's year-1..9999 limits, and a Unix-seconds value (ten digits today)
falls below it and is refused with a hint instead of meaning January 1970.
"""

from __future__ import annotations

import functools
import re
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, TypeVar, get_args, get_origin

from fastapi import Query, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, ValidationError, WithJsonSchema

from service.api.problems import Problem, invalid_param

TIME_MIN = datetime(2000, 1, 1, tzinfo=UTC)
TIME_MAX = datetime(2200, 1, 1, tzinfo=UTC)
MS_MIN, MS_MAX = int(TIME_MIN.timestamp() * 1000), int(TIME_MAX.timestamp() * 1000)
TIME_DOC = (f"RFC 3339 (no zone means UTC) or Unix milliseconds, from {TIME_MIN:%Y-%m-%dT%H:%M:%SZ} ({MS_MIN}) "
            f"to {TIME_MAX:%Y-%m-%dT%H:%M:%SZ} ({MS_MAX}, excluded)")
_NUMBER = re.compile(r"[+-]?[0-9]+(\.[0-9]+)?")

# A time a view has already written with datetime.isoformat() ('+00:00'): served as is, described as a date-time.
IsoTime = Annotated[str, WithJsonSchema({"type": "string", "format": "date-time"})]


def time_query(what: str) -> Any:
    """The Query() of a time parameter, so every endpoint documents the same forms and range."""
    return Query(description=f"{what}; {TIME_DOC}", examples=["2026-01-01T00:00:00Z", "1767225600000"])


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _out_of_range(name: str, shown: str) -> Problem:
    return invalid_param(name, f"{shown} is out of range; allowed: {TIME_DOC}")


def parse_time(v: str, name: str) -> datetime:
    """A time parameter as an aware UTC datetime, or a 422 problem naming the parameter."""
    s = v.strip()
    shown = repr(s[:64]) if len(s) <= 64 else repr(s[:64]) + "..."
    if _NUMBER.fullmatch(s):
        ms = float(s)  # huge numbers become inf, which the range check refuses
        if MS_MIN <= ms < MS_MAX:
            return datetime.fromtimestamp(ms / 1000, tz=UTC)
        if MS_MIN <= ms * 1000 < MS_MAX:
            as_s = _iso(datetime.fromtimestamp(ms, tz=UTC))
            raise invalid_param(name, f"{s} looks like Unix seconds ({as_s}); times are Unix milliseconds "
                                      f"({int(ms * 1000)}) or RFC 3339")
        raise _out_of_range(name, f"{shown} (Unix milliseconds)")
    try:
        t = datetime.fromisoformat(s)
    except ValueError:
        raise invalid_param(name, f"{shown} is neither RFC 3339 (e.g. 2026-01-01T00:00:00Z) "
                                  "nor Unix milliseconds") from None
    t = t if t.tzinfo else t.replace(tzinfo=UTC)
    if not TIME_MIN <= t < TIME_MAX:
        raise _out_of_range(name, shown)
    return t.astimezone(UTC)


def optional_time(v: str | None, name: str) -> datetime | None:
    return None if v is None else parse_time(v, name)


def time_range(start: str | None, end: str | None, default: timedelta) -> tuple[datetime, datetime]:
    """[start, end], defaulting to the last `default` before now; start must not come after end."""
    t_end = parse_time(end, "end") if end is not None else datetime.now(UTC)
    t_start = parse_time(start, "start") if start is not None else t_end - default
    if t_start > t_end:
        raise invalid_param("start", f"{_iso(t_start)} is after end ({_iso(t_end)})")
    return t_start, t_end


class QueryModel(BaseModel):
    """A route's query parameters as one model, read by `read_query`. Unknown parameters are ignored, as
    FastAPI ignores them."""

    model_config = ConfigDict(extra="ignore")


Q = TypeVar("Q", bound=QueryModel)


@functools.cache
def _list_fields(model: type[QueryModel]) -> frozenset[str]:
    """Fields that take every value given (`?state=a&state=b`); the others take the last, as in FastAPI."""
    def is_list(annotation: Any) -> bool:
        return get_origin(annotation) is list or any(is_list(a) for a in get_args(annotation))

    return frozenset(name for name, f in model.model_fields.items() if is_list(f.annotation))


def read_query(request: Request, model: type[Q]) -> Q:
    """The request's query parameters validated by `model` in one pydantic-core call (~10 us) rather than by
    FastAPI's solving of each declared parameter (~150 us of CPU a request for `/alerts`' nine, more than the
    cached page's own work: docs/benchmarks.md, "Reads at 500 req/s"). A bad value is FastAPI's 422, its
    errors located at ("query", name, ...). The route declares no query parameters; its OpenAPI operation
    comes from a documentation twin that declares `Annotated[model, Query()]` (service/alerts/views.py)."""
    params = request.query_params
    lists = _list_fields(model)
    data = {k: params.getlist(k) if k in lists else v for k, v in params.items()}
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise RequestValidationError([{**e, "loc": ("query", *e["loc"])} for e in exc.errors(include_url=False)]
                                     ) from None
