"""Detection tables: the rolling state per detector, versioned cohort models, and emitted findings."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, DateTime, Float, Index, Integer, LargeBinary, String, UniqueConstraint, func
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from service.db import Base


class DetectorState(Base):
    """One detector's FeatureState (numpy arrays, npz) and the data-time watermark it has read up to."""

    __tablename__ = "detector_state"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    watermark_ms: Mapped[int] = mapped_column(BigInteger)
    last_cycle_ms: Mapped[int | None] = mapped_column(BigInteger)
    ports: Mapped[int] = mapped_column(Integer)
    saved_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    blob: Mapped[bytes] = mapped_column(LargeBinary)


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
