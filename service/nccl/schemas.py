"""Response schemas of the NCCL endpoints (comparisons are service.py's dataclasses)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from service.nccl.service import Comparison


class NcclImportRead(BaseModel):
    run_id: int
    created: bool = Field(description="false: the same output was imported before; nothing else happened")
    baseline_set: bool
    alert_id: int | None
    linked_alert_ids: list[int]
    comparison: Comparison
    warnings: list[str]


class NcclRunRead(BaseModel):
    id: int
    digest: str
    test: str
    scope: str = Field(description="<nodes>n<gpus>g, e.g. 2n16g")
    nodes: int
    gpus: int
    hosts: list[str]
    gpu_model: str | None
    job: str | None
    nccl_version: str | None
    tests_version: str | None
    env: dict[str, str]
    header: dict[str, str]
    warnings: list[str]
    avg_busbw: float | None
    wrong_total: int
    oob_status: str | None
    source: str
    run_at: datetime
    imported_at: datetime
    imported_by: str
    verdict: Comparison
    alert_id: int | None
    linked_alert_ids: list[int]


class NcclResult(BaseModel):
    size_bytes: int
    count: int
    dtype: str
    redop: str
    root: int | None
    oop_time_us: float
    oop_algbw: float
    oop_busbw: float
    oop_wrong: int | None
    ip_time_us: float
    ip_algbw: float
    ip_busbw: float
    ip_wrong: int | None


class NcclRunDetail(NcclRunRead):
    results: list[NcclResult]


class NcclRuns(BaseModel):
    items: list[NcclRunRead]


class NcclBaselineRead(BaseModel):
    id: int
    test: str
    scope: str
    run_id: int
    set_at: datetime
    set_by: str
    reason: str


class NcclBaselineItem(NcclBaselineRead):
    nccl_version: str | None
    hosts: list[str]
    avg_busbw: float | None
    run_at: datetime


class NcclBaselines(BaseModel):
    items: list[NcclBaselineItem]
