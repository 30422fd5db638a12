"""The inventory file format (YAML), as pydantic models. docs/inventory.md describes it for people."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, HttpUrl, field_validator, model_validator

NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9._:/@+\-]{0,127}$"
Name = Annotated[str, Field(pattern=NAME_RE)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)


class SecretRef(Strict):
    """A credential by reference: an environment variable or a file. Never the secret itself."""

    env: str | None = None
    file: str | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> SecretRef:
        if (self.env is None) == (self.file is None):
            raise ValueError("a secret reference needs exactly one of 'env' or 'file'")
        return self


class Threshold(Strict):
    """A module's own DOM thresholds for one quantity (from its EEPROM)."""

    high_alarm: float | None = None
    high_warning: float | None = None
    low_warning: float | None = None
    low_alarm: float | None = None

    @model_validator(mode="after")
    def _ordered(self) -> Threshold:
        seq = [self.low_alarm, self.low_warning, self.high_warning, self.high_alarm]
        known = [v for v in seq if v is not None]
        if known != sorted(known):
            raise ValueError("thresholds must satisfy low_alarm <= low_warning <= high_warning <= high_alarm")
        return self


class Thresholds(Strict):
    rx_power_dbm: Threshold | None = None
    tx_power_dbm: Threshold | None = None
    tx_bias_amperes: Threshold | None = None
    temperature_celsius: Threshold | None = None
    voltage_volts: Threshold | None = None


_TYPE_LANES = re.compile(r"(?:(\d+)x)?[A-Z]*?(?:SR|DR|FR|LR|ER|VR|PSM)(\d*)\b", re.IGNORECASE)
_FORM_FACTOR_LANES = {"SFP": 1, "QSFP": 4, "QSFP-DD": 8, "OSFP": 8}


def optic_lanes(optic_type: object, form_factor: object) -> int | None:
    """Optical lanes from a type such as 400G-DR4 (4), 800G-2xFR4 (8) or 10G-SR (1), else from the form
    factor (SFP* 1, QSFP* 4, QSFP-DD and OSFP 8); None when neither says."""
    if isinstance(optic_type, str) and (m := _TYPE_LANES.search(optic_type)):
        return int(m.group(1) or 1) * int(m.group(2) or 1)
    if isinstance(form_factor, str):
        ff = form_factor.upper()
        for prefix in ("QSFP-DD", "OSFP", "QSFP", "SFP"):
            if ff.startswith(prefix):
                return _FORM_FACTOR_LANES[prefix]
    return None


class Optic(Strict):
    vendor: str | None = None
    part_number: str | None = None
    serial: str | None = None
    type: str | None = Field(default=None, description="e.g. 400G-DR4, 800G-2xFR4, AOC, DAC")
    form_factor: str | None = Field(default=None, description="SFP28, QSFP28, QSFP-DD, OSFP")
    lanes: int = Field(default=4, ge=1, le=16, description="optical lanes; unset: from type, else form factor")
    thresholds: Thresholds = Field(default_factory=Thresholds)

    @model_validator(mode="before")
    @classmethod
    def _lanes_from_type(cls, data: object) -> object:
        # an 800G-DR8 left at 4 lanes would have lanes 4-7 refused at import and ignored by detection
        if isinstance(data, dict) and data.get("lanes") is None:
            lanes = optic_lanes(data.get("type"), data.get("form_factor"))
            if lanes is not None:
                return {**data, "lanes": lanes}
        return data


class Port(Strict):
    name: Name
    speed_gbps: float | None = Field(default=None, gt=0)
    rail: int | None = Field(default=None, ge=0)
    gpu: int | None = Field(default=None, ge=0)
    nic: str | None = Field(default=None, description="RDMA device on hosts, e.g. mlx5_0")
    optic: Optic | None = None


class SnmpV3(Strict):
    user: str
    auth_protocol: Literal["sha", "sha224", "sha256", "sha384", "sha512", "md5"] = "sha256"
    auth_key: SecretRef
    priv_protocol: Literal["aes", "aes192", "aes256", "des"] = "aes"
    priv_key: SecretRef


class Tls(Strict):
    enabled: bool = True
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    server_name: str | None = None
    skip_verify: bool = False


class Intervals(Strict):
    """Poll interval in seconds per metric group; unset groups use the service defaults."""

    counters: float | None = Field(default=None, gt=0)
    optics: float | None = Field(default=None, gt=0)
    state: float | None = Field(default=None, gt=0)


EndpointProtocol = Literal["snmp", "gnmi", "host", "scrape"]
DeviceKind = Literal["switch", "host"]
DeviceRole = Literal["leaf", "spine", "core", "host"]


class Endpoint(Strict):
    protocol: EndpointProtocol
    address: str = "127.0.0.1"
    port: int | None = Field(default=None, ge=1, le=65535)
    timeout_s: float = Field(default=5.0, gt=0, le=120)
    retries: int = Field(default=1, ge=0, le=10)
    intervals: Intervals = Field(default_factory=Intervals)
    queue: str | None = Field(default=None, description="Celery queue of its collections; default: "
                              "`fabricwatch`, or with telemetry shards `collect.<shard>` of the device's pod")
    # SNMP
    version: Literal["2c", "3"] | None = None
    community: SecretRef | None = None
    v3: SnmpV3 | None = None
    max_repetitions: int | None = Field(default=None, ge=1, le=255)
    management_ports: list[Name] | None = Field(
        default=None, description="interfaces that are management ports, not fabric ports: left out without a warning")
    # gNMI
    username: str | None = None
    password: SecretRef | None = None
    tls: Tls | None = None
    path_set: str | None = Field(default=None, description="openconfig, arista, nokia, juniper, ...")
    mode: Literal["stream", "poll"] | None = Field(
        default=None, description="gNMI collection: stream (Subscribe, the default) or poll (Get each interval)")
    # host agent
    sysfs_root: str | None = None
    ethtool: str | None = Field(default=None, description="ethtool command to run (path or wrapper); default 'ethtool'")
    dcgm_url: str | None = None
    # scrape (an exporter's /metrics: collectors/scrape.py)
    scrape_urls: list[HttpUrl] | None = Field(
        default=None, min_length=1, description="exporter pages to scrape; default http://address:port/metrics "
                                                "(port 9100, node_exporter's)")

    @model_validator(mode="after")
    def _protocol_fields(self) -> Endpoint:
        if self.protocol == "snmp":
            version = self.version or "2c"
            if version == "2c" and self.community is None:
                raise ValueError("snmp v2c endpoint needs 'community' (a secret reference)")
            if version == "3" and self.v3 is None:
                raise ValueError("snmp v3 endpoint needs a 'v3' block")
        return self


class Device(Strict):
    name: Name
    kind: DeviceKind
    role: DeviceRole
    pod: str | None = None
    rack: str | None = None
    vendor: str | None = None
    model: str | None = None
    mgmt_address: str | None = None
    gpus: int = Field(default=0, ge=0, le=64)
    ports: list[Port] = Field(default_factory=list)
    endpoints: list[Endpoint] = Field(default_factory=list)

    @model_validator(mode="after")
    def _role_matches_kind(self) -> Device:
        if (self.kind == "host") != (self.role == "host"):
            raise ValueError(f"role {self.role!r} does not fit kind {self.kind!r}")
        names = [p.name for p in self.ports]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"port names repeat on this device: {', '.join(dup)}")
        return self


PORT_REF_RE = re.compile(r"^(?P<device>[^:\s]+):(?P<port>\S+)$")


class Cable(Strict):
    type: Literal["smf", "mmf", "aoc", "dac", "acc"] = "smf"
    length_m: float | None = Field(default=None, gt=0)


class Link(Strict):
    a: str = Field(description="device:port")
    b: str = Field(description="device:port")
    cable: Cable = Field(default_factory=Cable)

    @field_validator("a", "b")
    @classmethod
    def _port_ref(cls, v: str) -> str:
        if not PORT_REF_RE.match(v):
            raise ValueError(f"{v!r} is not a 'device:port' reference")
        return v


class Pod(Strict):
    name: Name
    description: str | None = None


class Inventory(Strict):
    version: Literal[1] = 1
    pods: list[Pod] = Field(default_factory=list)
    devices: list[Device] = Field(default_factory=list)
    links: list[Link] = Field(default_factory=list)
