"""Response schemas of the telemetry endpoints: import reports, series, targets and the LLDP link check."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from service.api.params import IsoTime

TargetState = Literal["ok", "degraded", "failing", "never_polled"]


class ImportReport(BaseModel):
    """What one import stored and refused; the refusal maps hold at most 100 names each, most frequent first."""

    received: int
    written: int
    duplicates: int = Field(description="samples already stored (a re-import stores nothing new)")
    rejected: int
    skipped_nan: int
    unknown_metrics: dict[str, int] = Field(description="metric name -> samples refused")
    unknown_devices: dict[str, int]
    unknown_ports: dict[str, int]
    invalid: dict[str, int] = Field(description="reason -> samples refused")


class Series(BaseModel):
    labels: dict[str, str | int] = Field(description="device, and port, lane, priority, gpu where set")
    kind: str = Field(description="gauge or counter (counters are served as per-second rates)")
    unit: str
    points: list[tuple[int, float | None]] = Field(description="[Unix ms, value]; null: no value in the bucket")


class SeriesRead(BaseModel):
    metric: str
    start: IsoTime
    end: IsoTime
    step: float | None = Field(description="bucket length in seconds; null: every sample")
    series: list[Series]
    missing_pods: list[str] = Field(description="pods of the shards that did not answer (the "
                                    "X-Fabricwatch-Missing-Pods header); empty when the answer is whole")


class StreamRead(BaseModel):
    """A gNMI target's stream (collectors/gnmi_stream.py)."""

    mode: Literal["stream", "poll"]
    state: Literal["streaming", "reconnecting", "stalled", "fallback-polling", "polling"]
    reason: str | None
    since: datetime | None
    worker: str | None = Field(description="the worker holding the stream's lease")
    last_data_at: datetime | None


CoverageGroup = Literal["state", "counters", "optics", "pfc"]


class GroupCoverage(BaseModel):
    """One expected metric group of a target, as its latest collection found it."""

    samples: int = Field(description="samples of the group ingest accepted in the latest collection of it")
    missing_polls: int = Field(description="collections in a row that brought none (a stream: sample intervals "
                               "overdue beyond the first); 0: it arrived")
    reason: str | None = Field(description="why it is missing, in words, starting with the group")
    assessed_at: datetime | None
    last_arrived_at: datetime | None


class Rejected(BaseModel):
    count: int = Field(description="samples refused for this reason in the latest collection of each poll group")
    examples: list[str] = Field(description="a few of the refused keys (device:port, metric, lane), "
                                "most frequent first")


class BlockedRule(BaseModel):
    """A detection rule that cannot run on some of the device's ports (service/detection/state.py)."""

    rule: str
    reason: str
    ports: int
    examples: list[str]


class CoverageRead(BaseModel):
    """Expected metric groups against what arrived (service/telemetry/coverage.py)."""

    expected: list[CoverageGroup] = Field(description="by device kind, protocol and the inventory's optics")
    arrived: list[CoverageGroup]
    missing: list[CoverageGroup] = Field(description="expected, and absent from the latest collection of it")
    not_collected_yet: list[CoverageGroup] = Field(description="expected, not collected since coverage began")
    groups: dict[CoverageGroup, GroupCoverage]
    rejected: dict[str, Rejected] = Field(description="reason (not in the inventory, unknown metric, invalid lane, "
                                          "invalid, not a number) -> count and examples")
    blind_spots: dict[str, list[str]] = Field(description="the collector's warnings per group (state, counters, "
                                              "optics, pfc, device, ports) of the latest collection of it: partial "
                                              "blind spots, e.g. 'counters: the agent gave no dot3StatsFCSErrors ...'")
    mode: Literal["poll", "stream"]
    last_received: int | None = Field(description="samples the latest collection brought")
    last_accepted: int | None = Field(description="of those, accepted by ingest")
    blocked_rules: list[BlockedRule] | None = Field(
        description="the detector's per-port rules that cannot run on this device for missing inputs; "
                    "null: no detector state yet")


class TargetRead(BaseModel):
    target: str = Field(description="device/protocol")
    device: str
    protocol: str
    address: str
    port: int | None
    pod: str | None
    state: TargetState
    last_attempt: datetime | None
    last_success: datetime | None
    last_error: str | None
    last_error_at: datetime | None
    warnings: list[str]
    duration_s: float | None
    samples: int | None
    consecutive_failures: int
    reason: str | None = Field(default=None, description="why the target is degraded or failing")
    stream: StreamRead | None = Field(default=None, description="gNMI targets: the Subscribe stream")
    coverage: CoverageRead | None = Field(default=None, description="expected metric groups against what arrived; "
                                          "null until the target's first collection")


class TargetsRead(BaseModel):
    targets: list[TargetRead]
    summary: dict[TargetState, int] = Field(description="targets per state")
    missing_pods: list[str] = Field(default_factory=list, description="sharded: pods of the selection whose "
                                    "shard did not answer (the X-Fabricwatch-Missing-Pods header), their "
                                    "targets' blocked_rules null; empty when the answer is whole")


class LinkCheckItem(BaseModel):
    device: str
    port: str
    lldp_device: str
    lldp_port: str
    seen_at: datetime
    expected_device: str | None = Field(description="the inventory's peer; null: the port has no link")
    expected_port: str | None


class LinkCheckRead(BaseModel):
    miscabled: list[LinkCheckItem]
    unknown_neighbors: list[LinkCheckItem] = Field(description="LLDP names a device not in the inventory")
    unexpected: list[LinkCheckItem] = Field(description="a known neighbour on a port with no inventory link")
    ok: list[LinkCheckItem]
