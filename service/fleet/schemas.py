"""Response schemas of the fleet endpoints: the topology graph and the NOC summary."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

# Worst last; service.HEALTH holds the same names in the same order (a test checks).
Health = Literal["unknown", "ok", "info", "warning", "down", "critical"]
HealthSource = Literal["alerts", "telemetry"]


class TopologyNode(BaseModel):
    id: str = Field(description="the device name")
    kind: str
    role: str
    pod: str | None
    rack: str | None
    rail: int | None = Field(description="a leaf's rail: the rail most of its host links are on")
    health: Health
    alerts: int = Field(description="open alerts on the device")
    reasons: list[str]


class _LinkHealth(BaseModel):
    id: int
    source: str
    source_port: str
    target: str
    target_port: str
    rail: int | None
    health: Health
    reasons: list[str]
    alerts: list[int] = Field(description="ids of the open alerts on either end")


class TopologyEdge(_LinkHealth):
    speed_gbps: float | None
    cable_type: str


class PodHealth(BaseModel):
    pod: str = Field(description="'(shared)' for devices without a pod (spines)")
    health: Health
    devices: dict[Health, int] = Field(description="devices per health")


class Topology(BaseModel):
    health_source: HealthSource
    nodes: list[TopologyNode]
    edges: list[TopologyEdge]
    pods: list[PodHealth]
    missing_pods: list[str] = Field(description="pods of the shards that did not answer (the "
                                    "X-Fabricwatch-Missing-Pods header); empty when the answer is whole")


class DeviceCounts(BaseModel):
    total: int
    by_role: dict[str, int]


class TargetCounts(BaseModel):
    ok: int
    failing: int
    never_polled: int


class AlertCounts(BaseModel):
    available: bool = Field(description="false before the alerts table exists")
    open_by_severity: dict[str, int]
    by_state: dict[str, int]


class DrainCounts(BaseModel):
    available: bool
    by_status: dict[str, int]
    pending: int
    blocked: int


class IncidentCounts(BaseModel):
    available: bool
    open: int


class WorstLink(_LinkHealth):
    rx_margin_db: float | None = Field(description="smallest Rx power margin to low-warning at either end")


class Summary(BaseModel):
    devices: DeviceCounts
    pods: int
    ports: int
    links: int
    optics: int
    targets: TargetCounts
    alerts: AlertCounts
    drains: DrainCounts
    incidents: IncidentCounts
    health_source: HealthSource
    device_health: dict[Health, int]
    link_health: dict[Health, int]
    worst_links: list[WorstLink]
    missing_pods: list[str] = Field(description="pods of the shards that did not answer (the "
                                    "X-Fabricwatch-Missing-Pods header); empty when the answer is whole")
