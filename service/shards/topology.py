"""The deployment's topology: a control database and N telemetry shards, and which pod lives on which shard.

Settings (`Settings.shards`, FABRICWATCH_SHARDS_<FIELD> or a `shards:` mapping in the config file):

- `urls`: shard name -> PostgreSQL URL (JSON in the environment). Empty, the default: one shard, the control
  database itself (FABRICWATCH_DATABASE_URL, or the embedded server), and nothing here changes any path.
- `pods`: shard name -> the pods it holds. A pod named twice, or under a shard that `urls` lacks, stops
  start-up with the setting named.
- `default`: the shard of devices without a pod and of pods that `pods` does not list (first shard if unset).

The control database (FABRICWATCH_DATABASE_URL) keeps inventory, alerts, incidents, drains, tokens and
notifications, and the stored pod -> shard map (`shard_pods`, migration 0230); see docs/architecture.md#shards.
This module imports nothing of the service, so `service.config` can hold its settings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from service.json_setting import json_setting

# Shard names go into SQL identifiers (foreign servers, partitions): keep them plain.
SHARD_NAME = re.compile(r"^[a-z][a-z0-9_]{0,39}$")
SINGLE = "main"  # the one shard of an unsharded deployment: the control database
NO_POD = ""  # devices without a pod are stored (shard_pods, the fleet tables' pod column) under ''


class ShardSettings(BaseModel):
    """`Settings.shards`: the telemetry shards and their pods (docs/architecture.md#shards)."""

    model_config = ConfigDict(extra="forbid")

    urls: dict[str, str] = Field(default_factory=dict, description="shard name -> PostgreSQL URL; empty: the "
                                 "control database is the only shard")
    pods: dict[str, list[str]] = Field(default_factory=dict, description="shard name -> its pods")
    default: str | None = Field(default=None, description="shard of pod-less devices and unlisted pods "
                                "(default: the first shard)")
    connect_timeout_s: int = Field(default=3, ge=1, le=60, description="how long a shard may take to answer a "
                                   "connection before it counts as down")

    @field_validator("urls", "pods", mode="before")
    @classmethod
    def _json(cls, v: Any) -> Any:
        # The environment gives a string (FABRICWATCH_SHARDS_URLS='{"a": "postgresql://..."}').
        return json_setting(v, expected="not JSON")

    @model_validator(mode="after")
    def _consistent(self) -> ShardSettings:
        for name in self.urls:
            if not SHARD_NAME.match(name):
                raise ValueError(f"FABRICWATCH_SHARDS_URLS: shard name {name!r} must be lower-case letters, digits "
                                 f"and _, starting with a letter, at most 40 characters")
        known = ", ".join(sorted(self.urls)) or "none: FABRICWATCH_SHARDS_URLS is empty"
        seen: dict[str, str] = {}
        for shard, pods in self.pods.items():
            if shard not in self.urls:
                raise ValueError(f"FABRICWATCH_SHARDS_PODS: unknown shard {shard!r} (shards: {known})")
            for pod in pods:
                if pod in seen and seen[pod] != shard:
                    raise ValueError(f"FABRICWATCH_SHARDS_PODS: pod {pod!r} is on two shards, {seen[pod]!r} "
                                     f"and {shard!r}")
                seen[pod] = shard
        if self.default is not None and self.default not in self.urls:
            raise ValueError(f"FABRICWATCH_SHARDS_DEFAULT: unknown shard {self.default!r} (shards: {known})")
        return self


@dataclass(frozen=True)
class Topology:
    """The shards in effect: with no shard configured, one (`main`) that is the control database."""

    control_url: str
    shards: dict[str, str]  # name -> URL
    pod_shard: dict[str, str]  # listed pod -> shard
    default: str
    connect_timeout_s: int = 3

    @classmethod
    def of(cls, control_url: str, settings: ShardSettings) -> Topology:
        if not settings.urls:
            return cls(control_url, {SINGLE: control_url}, {}, SINGLE, settings.connect_timeout_s)
        pod_shard = {pod: shard for shard, pods in settings.pods.items() for pod in pods}
        return cls(control_url, dict(settings.urls), pod_shard, settings.default or next(iter(settings.urls)),
                   settings.connect_timeout_s)

    @property
    def sharded(self) -> bool:
        """Whether shards are configured; unsharded, every path is the single-server one."""
        return self.shards != {SINGLE: self.control_url}

    def shard_of(self, pod: str | None) -> str:
        """The shard a pod's devices store their telemetry on (pod-less devices: the default shard)."""
        return self.pod_shard.get(pod, self.default) if pod else self.default

    def url(self, shard: str) -> str:
        try:
            return self.shards[shard]
        except KeyError:
            raise UnknownShard(f"unknown shard {shard!r} (shards: {', '.join(sorted(self.shards))})") from None


class UnknownShard(LookupError):
    """A shard name that the topology does not have."""


class ShardsUnavailable(RuntimeError):
    """Shards that did not answer; `errors` maps each to libpq's reason, and the message names them all."""

    def __init__(self, errors: dict[str, str]) -> None:
        self.errors = errors
        super().__init__("; ".join(f"shard {name!r} unreachable: {why}" for name, why in sorted(errors.items())))


def probe(topology: Topology, shards: list[str] | None = None) -> dict[str, str | None]:
    """Connect to each shard (all, or these) once: None where it answered, else libpq's reason in one line."""
    import psycopg
    from sqlalchemy import make_url

    from service.db import normalize_url
    from service.migrate import one_line

    out: dict[str, str | None] = {}
    for name in shards if shards is not None else sorted(topology.shards):
        u = make_url(normalize_url(topology.url(name))).set(drivername="postgresql")
        try:
            psycopg.connect(u.render_as_string(hide_password=False), connect_timeout=topology.connect_timeout_s).close()
            out[name] = None
        except psycopg.OperationalError as exc:
            out[name] = one_line(exc) or type(exc).__name__
    return out


def check_reachable(topology: Topology) -> None:
    """At start-up: every shard answers, else ShardsUnavailable naming each one that did not, and why."""
    down = {name: why for name, why in probe(topology).items() if why is not None}
    if down:
        raise ShardsUnavailable(down)
