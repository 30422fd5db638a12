"""RFC 9457 problem+json errors, for every 4xx and 5xx the API returns."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

PROBLEM_TYPE = "application/problem+json"


class Problem(Exception):
    """Raise to answer with a problem document. `extra` adds members (e.g. line, report); `headers`
    response headers (Retry-After, WWW-Authenticate)."""

    def __init__(self, status: int, title: str, detail: str | None = None, *,
                 headers: dict[str, str] | None = None, **extra: Any) -> None:
        self.status, self.title, self.detail, self.extra = status, title, detail, extra
        self.headers = headers or {}
        super().__init__(detail or title)


def problem_response(status: int, title: str, detail: str | None = None, *,
                     headers: dict[str, str] | None = None, **extra: Any) -> JSONResponse:
    body: dict[str, Any] = {"type": "about:blank", "title": title, "status": status}
    if detail:
        body["detail"] = detail
    body.update(extra)
    return JSONResponse(body, status_code=status, media_type=PROBLEM_TYPE, headers=headers)


def problem_response_for(exc: Problem) -> JSONResponse:
    return problem_response(exc.status, exc.title, exc.detail, headers=exc.headers, **exc.extra)


def invalid_param(name: str, msg: str, where: str = "query") -> Problem:
    """A 422 for one bad parameter, in the same form as FastAPI's own validation errors below."""
    return Problem(422, "Invalid request", f"{where}.{name}: {msg}", errors=[{"loc": [where, name], "msg": msg}])


def database_unavailable() -> JSONResponse:
    # The database restarting or unreachable: nothing was written; the client should retry.
    return problem_response(503, "Database unavailable", "retry shortly; nothing was written",
                            headers={"Retry-After": "5"})


def install(app: FastAPI) -> None:
    @app.exception_handler(Problem)
    async def _problem(_: Request, exc: Problem) -> JSONResponse:
        return problem_response_for(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        # A subclass may name its title (limits.BodyTooLarge); Starlette's own carry only a detail.
        title = getattr(exc, "title", None)
        if title:
            return problem_response(exc.status_code, title, str(exc.detail), headers=exc.headers)
        return problem_response(exc.status_code, str(exc.detail) if exc.detail else "error", headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"loc": list(e["loc"]), "msg": e["msg"]} for e in exc.errors()]
        first = errors[0] if errors else {"loc": [], "msg": "invalid request"}
        detail = f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"
        return problem_response(422, "Invalid request", detail, errors=errors)

    @app.exception_handler(DataError)
    async def _data(_: Request, exc: DataError) -> JSONResponse:
        # A value PostgreSQL cannot hold (an id past int32, a NUL byte) is the client's mistake.
        reason = str(exc.orig).splitlines()[0] if exc.orig else type(exc).__name__
        return problem_response(400, "Invalid value", reason[:300])

    @app.exception_handler(OperationalError)
    async def _database_away(_: Request, exc: OperationalError) -> JSONResponse:
        return database_unavailable()

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        return problem_response(500, "Internal error", type(exc).__name__)
