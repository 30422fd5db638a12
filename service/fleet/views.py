"""Fleet endpoints: GET /api/v1/topology and GET /api/v1/summary (router `router`)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Response

from service.api.auth import ReadScope
from service.api.deps import EngineDep, SettingsDep
from service.fleet import service
from service.fleet.schemas import Summary, Topology
from service.shards.views import fleet_topology, say_missing

router = APIRouter(prefix="/api/v1", tags=["fleet"])


@router.get("/topology", summary="The fabric as a graph: devices and links with health", response_model=Topology)
def get_topology(engine: EngineDep, settings: SettingsDep, response: Response, _: ReadScope, pod: str | None = None,
                 hosts: Annotated[bool, Query(description="include GPU hosts and their links")] = True
                 ) -> dict[str, Any]:
    shards = fleet_topology(engine, settings)
    with engine.connect() as conn:
        if shards is None:
            return say_missing(response, service.topology(conn, pod=pod, hosts=hosts), [])
        from service.shards.fleet import read_fleet

        # one pod asked: only its shard counts
        body, seen = read_fleet(conn, shards, lambda pods, _: service.topology(conn, pod=pod, hosts=hosts,
                                                                             fleet_pods=pods),
                                asked=None if pod is None else {pod})
    return say_missing(response, body, seen.missing_shown)


@router.get("/summary", summary="Fleet summary: counts, targets, alerts, drains, incidents, worst links",
            response_model=Summary)
def get_summary(engine: EngineDep, settings: SettingsDep, response: Response, _: ReadScope,
                worst: Annotated[int, Query(ge=0, le=100, description="how many worst links")] = 10
                ) -> dict[str, Any]:
    shards = fleet_topology(engine, settings)
    with engine.connect() as conn:
        if shards is None:
            return say_missing(response, service.summary(conn, worst_n=worst), [])
        from service.shards.fleet import read_fleet

        body, seen = read_fleet(conn, shards, lambda pods, _: service.summary(conn, worst_n=worst, fleet_pods=pods))
    return say_missing(response, body, seen.missing_shown)
