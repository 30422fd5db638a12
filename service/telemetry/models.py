"""Telemetry tables: series, the time-partitioned samples, link events and target status."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    ARRAY,
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    PrimaryKeyConstraint,
    SmallInteger,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from service.db import Base


class Series(Base):
    """One time series: a canonical metric on one entity."""

    __tablename__ = "series"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    metric: Mapped[str] = mapped_column(String(96))
    # devices.id and ports.id without foreign keys: per-row checks cost more than storing the rows.
    # Triggers on devices and ports delete their series (migration 0080); ingest locks the parents.
    device_id: Mapped[int] = mapped_column(Integer)
    port_id: Mapped[int | None] = mapped_column(Integer)
    lane: Mapped[int | None] = mapped_column(SmallInteger)
    priority: Mapped[int | None] = mapped_column(SmallInteger)
    gpu: Mapped[int | None] = mapped_column(SmallInteger)
    counter_bits: Mapped[int | None] = mapped_column(SmallInteger)
    saturating: Mapped[bool] = mapped_column(Boolean, default=False)
    __table_args__ = (
        # led by device: new series come device by device, and lookups by device (and metric) use it
        UniqueConstraint("device_id", "metric", "port_id", "lane", "priority", "gpu",
                         name="series_identity", postgresql_nulls_not_distinct=True),
    )


# Narrow rows keyed by (series_id, ts), range-partitioned by day on ts: what polls and pushes
# store. Partitions are created ahead by service.telemetry.partitions and dropped after the
# retention period. Readers use the `samples` view (rows and blocks; migration 0100).
sample_rows = Table(
    "sample_rows",
    Base.metadata,
    Column("series_id", Integer, nullable=False),
    Column("ts", DateTime(timezone=True), nullable=False),
    Column("value", Float(53), nullable=False),
    PrimaryKeyConstraint("series_id", "ts", name="samples_pkey"),
    # small, and enough for time-range scans of a day's partition (migration 0090: summarized as it fills)
    Index("samples_ts_brin", "ts", postgresql_using="brin", postgresql_with={"autosummarize": "on"}),
    postgresql_partition_by="RANGE (ts)",
)

# What a bulk import stores for the series it creates: a series' samples of one day as arrays.
sample_blocks = Table(
    "sample_blocks",
    Base.metadata,
    Column("series_id", Integer, nullable=False),
    Column("first_ts", DateTime(timezone=True), nullable=False),
    Column("last_ts", DateTime(timezone=True), nullable=False),
    Column("ts", ARRAY(DateTime(timezone=True)), nullable=False),
    Column("vals", ARRAY(Float(53)), nullable=False),
    PrimaryKeyConstraint("series_id", "first_ts", name="sample_blocks_pkey"),
    CheckConstraint("first_ts <= last_ts AND cardinality(ts) = cardinality(vals)", name="sample_block_shape"),
    Index("sample_blocks_last_ts", "last_ts"),
)

# Samples past the hot window: one compressed chunk (service/telemetry/chunk_codec.py) per series and
# hour (import blocks: day), partitioned by day on first_ts; the last two samples in plain columns
# for `last_samples` (migration 0200). Read through service/telemetry/store.py.
sample_chunks = Table(
    "sample_chunks",
    Base.metadata,
    Column("series_id", Integer, nullable=False),
    Column("first_ts", DateTime(timezone=True), nullable=False),
    Column("last_ts", DateTime(timezone=True), nullable=False),
    Column("n", Integer, nullable=False),
    Column("last_value", Float(53), nullable=False),
    Column("prev_ts", DateTime(timezone=True)),
    Column("prev_value", Float(53)),
    Column("data", LargeBinary, nullable=False),
    PrimaryKeyConstraint("series_id", "first_ts", name="sample_chunks_pkey"),
    CheckConstraint("first_ts <= last_ts AND n > 0 AND (n = 1) = (prev_ts IS NULL) AND date_trunc('day', "
                    "first_ts AT TIME ZONE 'UTC') = date_trunc('day', last_ts AT TIME ZONE 'UTC')",
                    name="sample_chunk_shape"),
    Index("sample_chunks_first_ts_brin", "first_ts", postgresql_using="brin",
          postgresql_with={"autosummarize": "on"}),
    postgresql_partition_by="RANGE (first_ts)",
)


class LinkEvent(Base):
    __tablename__ = "link_events"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    port_id: Mapped[int] = mapped_column(ForeignKey("ports.id", ondelete="CASCADE"))
    ts: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    state: Mapped[str] = mapped_column(String(8))
    source: Mapped[str] = mapped_column(String(32))
    __table_args__ = (
        UniqueConstraint("port_id", "ts", "state", name="link_event_once"),
        Index("link_events_ts", "ts"),
    )


class TargetStatus(Base):
    """Per-target collection status: errors are data, never a silent gap."""

    __tablename__ = "target_status"
    endpoint_id: Mapped[int] = mapped_column(ForeignKey("endpoints.id", ondelete="CASCADE"), primary_key=True)
    last_attempt: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_success: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_error: Mapped[str | None] = mapped_column(Text)
    last_error_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_warnings: Mapped[str | None] = mapped_column(Text)
    duration_s: Mapped[float | None] = mapped_column(Float)
    samples: Mapped[int] = mapped_column(Integer, default=0)
    consecutive_failures: Mapped[int] = mapped_column(Integer, default=0)
    # expected metric groups against what arrived (service/telemetry/coverage.py; migration 0180)
    coverage: Mapped[dict[str, Any] | None] = mapped_column(JSONB)


class GnmiStreamState(Base):
    """Per gNMI target, its Subscribe stream's state and what path discovery learned (migration 0170);
    written by collectors/gnmi_stream.py and the dispatcher."""

    __tablename__ = "gnmi_stream_state"
    endpoint_id: Mapped[int] = mapped_column(ForeignKey("endpoints.id", ondelete="CASCADE"), primary_key=True)
    state: Mapped[str | None] = mapped_column(String(32))   # streaming | reconnecting | stalled | fallback-polling
    reason: Mapped[str | None] = mapped_column(Text)
    since: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    owner: Mapped[str | None] = mapped_column(String(200))  # the worker holding the stream's lease
    lease_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_data_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    discovery: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=text("now()"))
    __table_args__ = (
        CheckConstraint("state IS NULL OR state IN ('streaming', 'reconnecting', 'stalled', 'fallback-polling')",
                        name="gnmi_stream_state_state"),
    )


class CollectionSlot(Base):
    """The last poll slot dispatched per target and metric group; makes dispatch at-most-once per slot."""

    __tablename__ = "collection_slots"
    endpoint_id: Mapped[int] = mapped_column(ForeignKey("endpoints.id", ondelete="CASCADE"), primary_key=True)
    grp: Mapped[str] = mapped_column(String(16), primary_key=True)
    last_slot: Mapped[int] = mapped_column(BigInteger)


class LldpNeighbor(Base):
    """What a device's LLDP says is on the far side of each port, as last collected."""

    __tablename__ = "lldp_neighbors"
    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id", ondelete="CASCADE"), primary_key=True)
    local_port: Mapped[str] = mapped_column(String(128), primary_key=True)
    remote_device: Mapped[str] = mapped_column(String(256))
    remote_port: Mapped[str] = mapped_column(String(256))
    seen_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


def _rollup_table(name: str) -> Table:
    """Per-series summary of one bucket; `increase`/`covered_s` are set for counters only."""
    return Table(
        name,
        Base.metadata,
        Column("series_id", Integer, nullable=False),
        Column("bucket", DateTime(timezone=True), nullable=False),
        Column("n", Integer, nullable=False),
        Column("min", Float(53), nullable=False),
        Column("max", Float(53), nullable=False),
        Column("avg", Float(53), nullable=False),
        Column("last", Float(53), nullable=False),
        Column("first_ts", DateTime(timezone=True), nullable=False),
        Column("last_ts", DateTime(timezone=True), nullable=False),
        # Reset/wrap-aware increase of the steps that END in this bucket (the step from the
        # previous bucket's last sample included), and the seconds those steps span.
        Column("increase", Float(53)),
        Column("covered_s", Float(53)),
        PrimaryKeyConstraint("series_id", "bucket", name=f"{name}_pkey"),
        postgresql_partition_by="RANGE (bucket)",
    )


# Rollups of `samples`, partitioned on bucket like samples on ts; kept longer than raw.
rollup_5m = _rollup_table("rollup_5m")
rollup_1h = _rollup_table("rollup_1h")


class ChunkWatermark(Base):
    """Every hour before `done_until` has been compressed into `sample_chunks` (a single row)."""

    __tablename__ = "chunk_watermark"
    id: Mapped[bool] = mapped_column(Boolean, primary_key=True, server_default=text("true"))
    done_until: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    compacted_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))  # one chunk per day before
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=text("now()"))
    __table_args__ = (CheckConstraint("id", name="chunk_watermark_id_check"),)


class RollupWatermark(Base):
    """Per rollup level: every bucket before `done_until` is computed (closed buckets only)."""

    __tablename__ = "rollup_watermarks"
    level: Mapped[str] = mapped_column(String(8), primary_key=True)
    done_until: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=text("now()"))
    # when rows before done_until were last computed again (a back-filled hour): a cache of rollup rows
    # behind the watermark is stale if it was filled before this
    revised_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class RollupBackfill(Base):
    """Hours of a level to compute again (written behind its watermark): a row per writer and hour."""

    __tablename__ = "rollup_backfill"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True,
                                    server_default=text("nextval('rollup_backfill_seq'::regclass)"))
    level: Mapped[str] = mapped_column(String(8))
    hour: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    lo: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))  # earliest sample written; NULL: all
    marked_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=text("now()"))
    __table_args__ = (Index("rollup_backfill_hour", "level", "hour"),)
