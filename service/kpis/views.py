"""KPI endpoints: fabric health per link, leaf, rail, pod or fabric, and fault recovery times."""

from __future__ import annotations

from dataclasses import asdict
from datetime import timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Query, Response

from service.api.auth import ReadScope
from service.api.deps import EngineDep, SettingsDep
from service.api.params import time_query, time_range
from service.api.problems import Problem
from service.kpis import service
from service.kpis.schemas import KpiRead, RecoveryRead
from service.kpis.service import Scope
from service.shards.views import fleet_topology, say_missing

router = APIRouter(prefix="/api/v1/kpis", tags=["kpis"])

_MAX_BUCKETS = 10_000  # a year at 1 h: beyond this the answer is too big to be useful


def _points(points: list[service.KpiPoint]) -> list[dict[str, Any]]:
    return [{"group": p.group, "t": p.bucket.isoformat(), **p.values} for p in points]


@router.get("", summary="Utilization, PFC/ECN/CNP and availability KPIs per scope and step", response_model=KpiRead)
def get_kpis(
    engine: EngineDep, settings: SettingsDep, response: Response, _: ReadScope,
    scope: Scope = Scope.FABRIC,
    start: Annotated[str | None, time_query("from (default: end minus 1 day)")] = None,
    end: Annotated[str | None, time_query("to (default: now)")] = None,
    step: Annotated[float, Query(gt=0, le=86400 * 31, description="bucket length in seconds")] = 3600,
    top: Annotated[int, Query(ge=1, le=100)] = 10,
) -> dict[str, Any]:
    t_start, t_end = time_range(start, end, timedelta(days=1))
    if (t_end - t_start).total_seconds() / step > _MAX_BUCKETS:
        raise Problem(400, "Bad parameter", f"more than {_MAX_BUCKETS} buckets: use a larger step")
    with engine.connect() as conn:
        rep = service.fabric_kpis(conn=conn, scope=scope, start=t_start, end=t_end, step_s=step, top=top,
                                  topology=fleet_topology(engine, settings))
    return say_missing(response, {
        "scope": rep.scope, "start": t_start.isoformat(), "end": t_end.isoformat(), "step": step,
        "source": rep.source, "labels": rep.labels,
        "utilization": _points(rep.utilization), "congestion": _points(rep.congestion),
        "availability": _points(rep.availability),
        "worst_ports": {k: [asdict(p) for p in v] for k, v in rep.worst_ports.items()},
    }, rep.missing_pods)


@router.get("/recovery", summary="Time to detect, mitigate and restore, with percentiles per cause and pod",
            response_model=RecoveryRead)
def get_recovery(
    engine: EngineDep, _: ReadScope,
    start: Annotated[str | None, time_query("from (default: end minus 30 days)")] = None,
    end: Annotated[str | None, time_query("to (default: now)")] = None,
    target: Annotated[float, Query(gt=0, description="mitigation target in seconds")] =
    service.DEFAULT_MITIGATION_TARGET_S,
) -> dict[str, Any]:
    t_start, t_end = time_range(start, end, timedelta(days=30))
    with engine.connect() as conn:
        timelines = service.load_timelines(conn=conn, start=t_start, end=t_end)
    rep = service.recovery_times(timelines, mitigation_target_s=target)
    return {"start": t_start.isoformat(), "end": t_end.isoformat(), **asdict(rep)}
