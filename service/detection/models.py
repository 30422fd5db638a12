"""Detection tables: the rolling state per detector, versioned cohort models, and emitted findings."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, DateTime, Float, Index, Integer, LargeBinary, String, UniqueConstraint, func
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from service.db import Base


class DetectorState(Base):
    """One detector's FeatureState (numpy arrays: service/detection/archive.py) and the data-time watermark it
    has read up to."""

    __tablename__ = "detector_state"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    watermark_ms: Mapped[int] = mapped_column(BigInteger)
    last_cycle_ms: Mapped[int | None] = mapped_column(BigInteger)
    ports: Mapped[int] = mapped_column(Integer)
    saved_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    blob: Mapped[bytes] = mapped_column(LargeBinary)
    # the training reservoir stored apart (DetectorReservoir): which one, and how many rows
    reservoir_gen: Mapped[str | None] = mapped_column(String(36))
    reservoir_rows: Mapped[int] = mapped_column(Integer, server_default="0")


class DetectorReservoir(Base):
    """A chunk of a detector's training reservoir: rows first_row.. of generation `gen` (a generation is written
    whole, then appended to, chunk by chunk; service/detection/store.py)."""

    __tablename__ = "detector_reservoir"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    gen: Mapped[str] = mapped_column(String(36), primary_key=True)
    first_row: Mapped[int] = mapped_column(Integer, primary_key=True)
    n_rows: Mapped[int] = mapped_column(Integer)
    n_cols: Mapped[int] = mapped_column(Integer)
    x: Mapped[bytes] = mapped_column(LargeBinary)  # float64 little-endian, row-major
    c: Mapped[bytes] = mapped_column(LargeBinary)  # int64 little-endian cohort numbers


class DetectorModel(Base):
    """A trained cohort model (IsolationForest + robust scaler), versioned per cohort."""

    __tablename__ = "detector_models"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    cohort: Mapped[str] = mapped_column(String(400))
    version: Mapped[int] = mapped_column(Integer)
    trained_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    threshold: Mapped[float] = mapped_column(Float)
    n_rows: Mapped[int] = mapped_column(Integer)
    features: Mapped[list[Any]] = mapped_column(JSONB)
    blob: Mapped[bytes] = mapped_column(LargeBinary)
    __table_args__ = (UniqueConstraint("cohort", "version", name="detector_model_version"),)


class DetectionFinding(Base):
    """Findings of each live cycle, as handed to alerting (Finding.to_dict)."""

    __tablename__ = "detection_findings"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    fingerprint: Mapped[str] = mapped_column(String(512))
    kind: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16))
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB)
    __table_args__ = (Index("detection_findings_at", "at"),
                      UniqueConstraint("at", "fingerprint", name="detection_finding_once"))
