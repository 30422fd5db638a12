"""Liveness, readiness and the service's own metrics (open), and the fabric's health as metrics (with a token)."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, Field
from sqlalchemy import text
from starlette.concurrency import run_in_threadpool

from service.api.auth import ReadScope
from service.api.deps import EngineDep, SettingsDep
from service.broker import ping_broker

router = APIRouter(tags=["health"])


class Alive(BaseModel):
    status: Literal["ok"]


class Readiness(BaseModel):
    status: Literal["ready", "not ready"]
    checks: dict[str, str] = Field(description="database, broker: 'ok' or 'error: <why>'")


@router.get("/healthz", response_model=Alive)
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", response_model=Readiness, responses={503: {"model": Readiness, "description": "not ready"}})
async def readyz(engine: EngineDep, settings: SettingsDep) -> JSONResponse:
    checks: dict[str, Any] = {}

    def db_check() -> None:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))

    for name, fn in (("database", db_check), ("broker", lambda: ping_broker(settings))):
        try:
            await run_in_threadpool(fn)
            checks[name] = "ok"
        except Exception as exc:  # any failure means not ready; say which and why
            checks[name] = f"error: {type(exc).__name__}: {exc}"[:300]
    ready = all(v == "ok" for v in checks.values())
    return JSONResponse({"status": "ready" if ready else "not ready", "checks": checks},
                        status_code=200 if ready else 503)


@router.get("/metrics", response_class=PlainTextResponse,
            responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                             "description": "Prometheus text exposition"}})
def metrics() -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)


@router.get("/api/v1/metrics", response_class=PlainTextResponse,
            summary="The /metrics series plus the fabric's health: open alerts, faults per port, receivers",
            responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                             "description": "Prometheus text exposition"}})
def fabric_metrics(_: ReadScope) -> Response:
    """What Prometheus scrapes with a read token (docs/alertmanager.md): these series name devices, ports and
    receivers, so they are not on the open /metrics."""
    from service.observability import FABRIC

    return Response(generate_latest() + generate_latest(FABRIC), media_type=CONTENT_TYPE_LATEST)
