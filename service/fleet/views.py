"""Fleet endpoints: GET /api/v1/topology and GET /api/v1/summary (router `router`)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from service.api.auth import ReadScope
from service.api.deps import EngineDep
from service.fleet import service
from service.fleet.schemas import Summary, Topology

router = APIRouter(prefix="/api/v1", tags=["fleet"])


@router.get("/topology", summary="The fabric as a graph: devices and links with health", response_model=Topology)
def get_topology(engine: EngineDep, _: ReadScope, pod: str | None = None,
                 hosts: Annotated[bool, Query(description="include GPU hosts and their links")] = True
                 ) -> dict[str, Any]:
    with engine.connect() as conn:
        return service.topology(conn, pod=pod, hosts=hosts)


@router.get("/summary", summary="Fleet summary: counts, targets, alerts, drains, incidents, worst links",
            response_model=Summary)
def get_summary(engine: EngineDep, _: ReadScope,
                worst: Annotated[int, Query(ge=0, le=100, description="how many worst links")] = 10
                ) -> dict[str, Any]:
    with engine.connect() as conn:
        return service.summary(conn, worst_n=worst)
