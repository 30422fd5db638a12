"""Response schemas of the KPI endpoints (the recovery report's parts are service.py's dataclasses)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from service.api.params import IsoTime
from service.kpis.service import Durations, GroupStats, RankedPort


class _Point(BaseModel):
    group: str = Field(description="the scope's group: link, leaf, rail, pod or 'fabric'")
    t: IsoTime = Field(description="the bucket's start")


class UtilizationPoint(_Point):
    utilization_mean: float | None
    utilization_peak: float | None
    utilization_p95: float | None
    intervals: int


class CongestionPoint(_Point):
    pfc_rx_pause_frames_per_s: float | None
    pfc_tx_pause_frames_per_s: float | None
    pfc_rx_pause_duty: float | None
    pfc_tx_pause_duty: float | None
    ecn_marked_per_s: float | None
    cnp_sent_per_s: float | None


class AvailabilityPoint(_Point):
    availability: float | None = Field(description="share of observed port-time oper up")
    flaps: float | None


class KpiRead(BaseModel):
    scope: str
    start: IsoTime
    end: IsoTime
    step: float
    source: str = Field(description="where intervals were read: samples or a rollup")
    labels: dict[str, str] = Field(description="group -> label (links: both ends)")
    utilization: list[UtilizationPoint]
    congestion: list[CongestionPoint]
    availability: list[AvailabilityPoint]
    worst_ports: dict[str, list[RankedPort]] = Field(description="per congestion KPI, the top ports")
    missing_pods: list[str] = Field(description="pods of the shards that did not answer (the "
                                    "X-Fabricwatch-Missing-Pods header); empty when the answer is whole")


class RecoveryRead(BaseModel):
    start: IsoTime
    end: IsoTime
    mitigation_target_s: float
    overall: GroupStats
    by_cause: dict[str, GroupStats]
    by_pod: dict[str, GroupStats]
    incidents: list[Durations]
