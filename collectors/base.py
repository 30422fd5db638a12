"""The small interface every collector implements: a target in, canonical samples and a status out."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from service.telemetry.samples import Sample

Protocol_ = Literal["snmp", "gnmi", "host", "scrape"]


class Target(BaseModel):
    """One thing to poll: a device's collection endpoint, with its secrets already resolved.

    `params` holds protocol settings (SNMP version, v3 user and protocols, gNMI TLS, path
    set, host agent options). `secrets` holds resolved credentials; it is excluded from
    repr and serialisation so it never reaches a log line or an API response.
    """

    model_config = ConfigDict(frozen=True)

    name: str
    device: str
    protocol: Protocol_
    address: str = "127.0.0.1"
    port: int | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    secrets: dict[str, str] = Field(default_factory=dict, repr=False, exclude=True)
    timeout_s: float = 5.0
    retries: int = 1


class CollectError(Exception):
    """A device answered badly or not at all. The message says what, where and why."""


class ParseError(ValueError):
    """Malformed device output. Names the source, the line (when known) and the reason."""

    def __init__(self, source: str, reason: str, line: int | None = None) -> None:
        self.source, self.reason, self.line = source, reason, line
        where = f"{source}:{line}" if line is not None else source
        super().__init__(f"{where}: {reason}")


@dataclass(frozen=True, slots=True)
class Neighbor:
    """An LLDP neighbour seen on a local port."""

    local_port: str
    remote_device: str
    remote_port: str


@dataclass(slots=True)
class CollectResult:
    target: str
    samples: list[Sample] = field(default_factory=list)
    error: str | None = None
    warnings: list[str] = field(default_factory=list)
    neighbors: list[Neighbor] = field(default_factory=list)
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None


class Collector(Protocol):
    def __call__(self, target: Target, *, now_ms: int) -> CollectResult: ...


_REGISTRY: dict[str, Collector] = {}


def register(name: str) -> Callable[[Collector], Collector]:
    """Register a collector under a protocol name (`snmp`, `gnmi`, `host`, `scrape`)."""

    def wrap(fn: Collector) -> Collector:
        _REGISTRY[name] = fn
        return fn

    return wrap


def get_collector(name: str) -> Collector:
    if name not in _REGISTRY:
        raise KeyError(f"no collector registered for protocol {name!r}; known: {sorted(_REGISTRY)}")
    return _REGISTRY[name]


def now_ms() -> int:
    return int(time.time() * 1000)
