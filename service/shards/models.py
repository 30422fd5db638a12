"""The stored pod -> shard map (control database; migration 0230)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import DateTime, Integer, String, func
from sqlalchemy.orm import Mapped, mapped_column

from service.db import Base


class ShardPod(Base):
    """Which shard holds a pod's telemetry; pod '' stands for devices without a pod."""

    __tablename__ = "shard_pods"
    pod: Mapped[str] = mapped_column(String(128), primary_key=True)
    shard: Mapped[str] = mapped_column(String(40), index=True)
    assigned_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    # a move between shards (service/shards/rebalance.py, migration 0280)
    move_to: Mapped[str | None] = mapped_column(String(40))  # copying there; writes go there first, then `shard`
    move_cursor: Mapped[int | None] = mapped_column(Integer)  # old shard's series ids copied up to this one
    leftover: Mapped[str | None] = mapped_column(String(40))  # a shard whose copy of the pod is still to delete
    moved_from: Mapped[str | None] = mapped_column(String(40))  # the last finished move came from here
    moved_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
