"""Settings from FABRICWATCH_* environment variables and an optional YAML config file.

Environment variables win over the file (FABRICWATCH_CONFIG names it). A bad value
stops start-up with one line naming the setting, never a traceback.
"""

from __future__ import annotations

import ipaddress
import os
from functools import lru_cache
from typing import Any, Literal

from pydantic import BaseModel, Field, SecretStr, ValidationError, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from service.drains.schemas import DrainSettings
from service.incidents.schemas import IncidentSettings
from service.notify.schemas import AlertmanagerSettings
from service.shards.topology import ShardSettings

ENV_PREFIX = "FABRICWATCH_"

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def networks(spec: str) -> list[Network]:
    """'10.0.0.0/8, 2001:db8::1' as networks; ValueError naming a bad entry."""
    return [ipaddress.ip_network(item, strict=False) for item in (s.strip() for s in spec.split(",")) if item]


class SettingsError(RuntimeError):
    """A setting has a bad value; the message is one line naming it."""


# Nested groups, each set by FABRICWATCH_<GROUP>_<FIELD> (FABRICWATCH_DRAIN_MAX_PER_POD) or a `<group>:` mapping
# in the config file; the environment wins field by field, as everywhere else.
GROUPS: dict[str, type[BaseModel]] = {"drain": DrainSettings, "soak": IncidentSettings,
                                      "alertmanager": AlertmanagerSettings, "shards": ShardSettings}


class _GroupEnvSource(PydanticBaseSettingsSource):
    """The environment's FABRICWATCH_<GROUP>_<FIELD> variables as nested values of their group."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # __call__ reads every group at once

    def __call__(self) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for group, model in GROUPS.items():
            values = {f: os.environ[name] for f in model.model_fields
                      if (name := f"{ENV_PREFIX}{group.upper()}_{f.upper()}") in os.environ}
            if values:
                found[group] = values
        return found


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", validate_default=True)

    database_url: str | None = Field(default=None, description="PostgreSQL URL; unset = embedded")
    redis_url: str | None = Field(default=None, description="Celery broker URL; unset = embedded")
    api_host: str = "127.0.0.1"
    api_port: int = Field(default=8080, ge=1, le=65535)
    auth_required: bool = True
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    data_dir: str | None = Field(default=None, description="embedded PostgreSQL data directory")
    retention_days: int = Field(default=30, ge=1, le=3650)
    partition_days_ahead: int = Field(default=3, ge=1, le=60)
    ingest_batch_rows: int = Field(default=50_000, ge=100, le=5_000_000)
    max_body_bytes: int = Field(default=256 * 1024 * 1024, ge=1024,
                                description="largest import body (JSON endpoints take 1 MiB; service/api/limits.py)")
    trusted_proxies: str = Field(default="", description="CIDRs of reverse proxies whose X-Forwarded-For names the "
                                 "client (keys the bad-token throttle); empty: the peer is the client")
    auth_cache_s: float = Field(default=0.0, ge=0, le=3600,
                                description="seconds an API process trusts a token it verified without looking it "
                                            "up again (a revoked token works that much longer); 0 (the default): "
                                            "every request looks it up")
    api_db_threads: int = Field(default=15, ge=1, le=200,
                                description="per API process: route calls that may use the database at once "
                                            "(the thread pool), and the connections it keeps (docs/operations.md)")
    counters_interval_s: float = Field(default=10.0, gt=0)
    optics_interval_s: float = Field(default=60.0, gt=0)
    state_interval_s: float = Field(default=30.0, gt=0)
    alert_clear_cycles: int = Field(default=3, ge=1, le=1000, description="absent cycles before auto-resolve")
    telemetry_gap_polls: int = Field(default=3, ge=1, le=1000, description="collections in a row without an expected "
                                     "metric group (or failing) before a telemetry_gap alert (docs/alerts.md)")
    webhook_allow: str = Field(default="", description="CIDRs/hosts webhooks may reach despite the private-range rule")
    webhook_deny: str = Field(default="", description="CIDRs/hosts webhooks may never reach")
    webhook_timeout_s: float = Field(default=10.0, gt=0, le=300)
    webhook_max_attempts: int = Field(default=20, ge=1, le=1000)
    webhook_backoff_base_s: float = Field(default=5.0, gt=0)
    webhook_backoff_max_s: float = Field(default=3600.0, gt=0)
    webhook_max_redirects: int = Field(default=3, ge=0, le=10)
    webhook_poll_s: float = Field(default=5.0, gt=0, le=300, description="how often the outbox is delivered")
    public_url: str | None = Field(default=None, description="base URL for links in notifications")
    secrets_key: SecretStr | None = Field(default=None, description="Fernet key(s) sealing webhook secrets; "
                                          "comma-separated, the first seals, all open (docs/operations.md)")
    secrets_key_file: str | None = Field(default=None, description="file with the secrets key(s), one per line")
    spool_dir: str | None = Field(default=None, description="where collections wait while the database is away")
    detect_interval_s: float = Field(default=30.0, gt=0, le=3600, description="detection cycle period")
    dispatch_interval_s: float = Field(default=1.0, gt=0, le=60)
    task_time_limits: dict[str, tuple[float, float]] = Field(
        default_factory=dict, description='(soft, hard) seconds per task kind over service/worker.py\'s TIME_LIMITS, '
        'e.g. {"run_detection": [300, 360]}')
    rollup_5m_retention_days: int = Field(default=90, ge=1, le=3650, description="days of 5-minute rollups kept")
    rollup_1h_retention_days: int = Field(default=400, ge=1, le=3650, description="days of 1-hour rollups kept")
    rollup_interval_s: float = Field(default=60.0, gt=0, le=3600, description="how often rollups catch up")
    compress_after_s: float = Field(default=3600.0, ge=0, le=30 * 86400, description="hot window: samples stay "
                                    "rows this long, then move into compressed chunks (whole hours)")
    compress_interval_s: float = Field(default=300.0, gt=0, le=86400, description="how often compression runs")
    compress_batch_series: int = Field(default=2000, ge=1, le=1_000_000, description="series per compression "
                                       "transaction for an hour (a day takes 1/24 as many): bounds its memory")
    compress_max_batches: int = Field(default=2000, ge=1, le=1_000_000, description="transactions per compression "
                                      "run; a backlog is caught up over successive runs")
    rollup_lag_s: float = Field(default=60.0, ge=0, le=3600,
                                description="a bucket is closed this long after its end (late samples)")
    rollup_max_gap_s: float = Field(default=900.0, gt=0, le=86400,
                                    description="counter steps longer than this give no increase in rollups")
    rollup_max_chunks: int = Field(default=24, ge=1, le=10_000, description="chunks (1 h of 5m, 1 d of 1h) per run")
    series_5m_after_s: float = Field(default=6 * 3600.0, gt=0, description="ranges longer than this read 5m rollups")
    series_1h_after_s: float = Field(default=7 * 86400.0, gt=0, description="ranges longer than this read 1h rollups")
    drain: DrainSettings = Field(default_factory=DrainSettings,
                                 description="drain safety limits and executors (FABRICWATCH_DRAIN_<FIELD>)")
    soak: IncidentSettings = Field(default_factory=IncidentSettings,
                                   description="repair verification soak (FABRICWATCH_SOAK_<FIELD>)")
    alertmanager: AlertmanagerSettings = Field(
        default_factory=AlertmanagerSettings,
        description="pushing alerts to Alertmanagers (FABRICWATCH_ALERTMANAGER_<FIELD>; docs/alertmanager.md)")
    shards: ShardSettings = Field(default_factory=ShardSettings, description="telemetry shards and their pods "
                                  "(FABRICWATCH_SHARDS_<FIELD>; docs/architecture.md#shards); unset: one server")

    @field_validator("trusted_proxies")
    @classmethod
    def _cidrs(cls, v: str) -> str:
        networks(v)  # a bad entry stops start-up, named
        return v

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings, _GroupEnvSource(settings_cls)]
        path = os.environ.get(ENV_PREFIX + "CONFIG")
        if path:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=path))
        return tuple(sources)


def _one_line(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = [str(p) for p in err["loc"]]
    # a group's field is named as its variable: ("drain", "max_per_pod") is FABRICWATCH_DRAIN_MAX_PER_POD
    field = "_".join(loc[:2]) if len(loc) > 1 and loc[0] in GROUPS else ".".join(loc) or "?"
    got = err.get("input")
    shown = "" if isinstance(got, dict) else f" (got {got!r})"
    return f"setting {ENV_PREFIX}{field.upper()}: {err['msg']}{shown}"


def load_settings(**overrides: object) -> Settings:
    """Read and validate settings; raise SettingsError with one clear line on a bad value."""
    path = os.environ.get(ENV_PREFIX + "CONFIG")
    if path and not os.path.isfile(path):
        raise SettingsError(f"setting {ENV_PREFIX}CONFIG: file {path!r} does not exist")
    try:
        settings = Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        raise SettingsError(_one_line(exc)) from None
    _check_drain_templates(settings)
    return settings


def _check_drain_templates(settings: Settings) -> None:
    """Every drain command template rendered with sample values: an unknown placeholder fails at start-up,
    in one line naming the setting, not mid-cycle."""
    from service.drains.executors import TemplateError, check_settings

    try:
        check_settings(settings.drain)
    except TemplateError as exc:  # already one line naming the setting
        raise SettingsError(str(exc)) from None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return load_settings()
