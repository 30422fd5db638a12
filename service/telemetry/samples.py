"""The unit of telemetry that every collector and importer produces."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Sample:
    """One canonical reading.

    `ts_ms` is the sample's own time in Unix milliseconds (data time, not arrival).
    `counter_bits` is 32 or 64 when the source says how wide a counter is (SNMP
    Counter32, IB 32-bit PMA counters); rates then treat a drop as a wrap when it
    fits one. `saturating` marks counters that stick at their maximum instead of
    wrapping (IB PortXmitWait and friends).
    """

    metric: str
    value: float
    ts_ms: int
    device: str
    port: str | None = None
    lane: int | None = None
    priority: int | None = None
    gpu: int | None = None
    counter_bits: int | None = None
    saturating: bool = False
