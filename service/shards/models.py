"""The stored pod -> shard map (control database; migration 0230)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import DateTime, String, func
from sqlalchemy.orm import Mapped, mapped_column

from service.db import Base


class ShardPod(Base):
    """Which shard holds a pod's telemetry; pod '' stands for devices without a pod."""

    __tablename__ = "shard_pods"
    pod: Mapped[str] = mapped_column(String(128), primary_key=True)
    shard: Mapped[str] = mapped_column(String(40), index=True)
    assigned_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
