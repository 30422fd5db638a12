"""NCCL tables (migration 0040): runs, their per-size results, and one baseline run per (test, scope)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, DateTime, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint, func
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from service.db import Base


class NcclRunRow(Base):
    """One imported nccl-tests run. `digest` makes re-imports find the same row."""

    __tablename__ = "nccl_runs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    digest: Mapped[str] = mapped_column(String(64), unique=True)
    test: Mapped[str] = mapped_column(String(64))
    scope: Mapped[str] = mapped_column(String(64))            # "<nodes>n<gpus>g", e.g. "2n16g"
    nodes: Mapped[int] = mapped_column(Integer)
    gpus: Mapped[int] = mapped_column(Integer)
    hosts: Mapped[list[str]] = mapped_column(JSONB, default=list)
    gpu_model: Mapped[str | None] = mapped_column(String(128))
    job: Mapped[str | None] = mapped_column(String(256))
    nccl_version: Mapped[str | None] = mapped_column(String(64))
    tests_version: Mapped[str | None] = mapped_column(String(64))
    env: Mapped[dict[str, str]] = mapped_column(JSONB, default=dict)
    header: Mapped[dict[str, str]] = mapped_column(JSONB, default=dict)
    warnings: Mapped[list[str]] = mapped_column(JSONB, default=list)
    avg_busbw: Mapped[float | None] = mapped_column(Float)
    wrong_total: Mapped[int] = mapped_column(BigInteger, default=0)
    oob_status: Mapped[str | None] = mapped_column(String(16))
    source: Mapped[str] = mapped_column(String(512))
    run_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    imported_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    imported_by: Mapped[str] = mapped_column(String(128))
    verdict: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict)
    alert_id: Mapped[int | None] = mapped_column(BigInteger)   # no FK: alerts live on another branch
    linked_alert_ids: Mapped[list[int]] = mapped_column(JSONB, default=list)
    __table_args__ = (Index("nccl_runs_test_scope_at", "test", "scope", "run_at"),)


class NcclResultRow(Base):
    __tablename__ = "nccl_results"
    run_id: Mapped[int] = mapped_column(ForeignKey("nccl_runs.id", ondelete="CASCADE"), primary_key=True)
    size_bytes: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    count: Mapped[int] = mapped_column(BigInteger)
    dtype: Mapped[str] = mapped_column(String(16))
    redop: Mapped[str] = mapped_column(String(16))
    root: Mapped[int | None] = mapped_column(Integer)
    oop_time_us: Mapped[float] = mapped_column(Float)
    oop_algbw: Mapped[float] = mapped_column(Float)
    oop_busbw: Mapped[float] = mapped_column(Float)
    oop_wrong: Mapped[int | None] = mapped_column(BigInteger)
    ip_time_us: Mapped[float] = mapped_column(Float)
    ip_algbw: Mapped[float] = mapped_column(Float)
    ip_busbw: Mapped[float] = mapped_column(Float)
    ip_wrong: Mapped[int | None] = mapped_column(BigInteger)


class NcclBaseline(Base):
    """The reference run for one (test, scope); per-size busbw is compared against its rows."""

    __tablename__ = "nccl_baselines"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    test: Mapped[str] = mapped_column(String(64))
    scope: Mapped[str] = mapped_column(String(64))
    run_id: Mapped[int] = mapped_column(ForeignKey("nccl_runs.id", ondelete="CASCADE"))
    set_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    set_by: Mapped[str] = mapped_column(String(128))
    reason: Mapped[str] = mapped_column(Text, default="")
    __table_args__ = (UniqueConstraint("test", "scope", name="nccl_baseline_test_scope"),)
