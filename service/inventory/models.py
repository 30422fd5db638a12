"""Inventory tables: pods, devices, ports, optics, links and collection endpoints."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import CheckConstraint, DateTime, Float, ForeignKey, Integer, String, UniqueConstraint, func
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column, relationship

from service.db import Base


class Pod(Base):
    __tablename__ = "pods"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    description: Mapped[str | None] = mapped_column(String(1024))


class Device(Base):
    __tablename__ = "devices"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    kind: Mapped[str] = mapped_column(String(16))
    role: Mapped[str] = mapped_column(String(16), index=True)
    pod: Mapped[str | None] = mapped_column(String(128), index=True)
    rack: Mapped[str | None] = mapped_column(String(128))
    vendor: Mapped[str | None] = mapped_column(String(128))
    model: Mapped[str | None] = mapped_column(String(128))
    mgmt_address: Mapped[str | None] = mapped_column(String(256))
    gpus: Mapped[int] = mapped_column(Integer, default=0)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now(),
                                                 onupdate=func.now())
    ports: Mapped[list[Port]] = relationship(back_populates="device", cascade="all, delete-orphan",
                                             order_by="Port.id")
    endpoints: Mapped[list[Endpoint]] = relationship(back_populates="device", cascade="all, delete-orphan",
                                                     order_by="Endpoint.id")
    __table_args__ = (
        CheckConstraint("kind in ('switch', 'host')", name="device_kind"),
        CheckConstraint("role in ('leaf', 'spine', 'core', 'host')", name="device_role"),
    )


class Port(Base):
    __tablename__ = "ports"
    id: Mapped[int] = mapped_column(primary_key=True)
    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(128))
    speed_gbps: Mapped[float | None] = mapped_column(Float)
    rail: Mapped[int | None] = mapped_column(Integer)
    gpu: Mapped[int | None] = mapped_column(Integer)
    nic: Mapped[str | None] = mapped_column(String(64))
    device: Mapped[Device] = relationship(back_populates="ports")
    optic: Mapped[Optic | None] = relationship(back_populates="port", cascade="all, delete-orphan",
                                               uselist=False)
    __table_args__ = (UniqueConstraint("device_id", "name", name="port_device_name"),)


class Optic(Base):
    __tablename__ = "optics"
    id: Mapped[int] = mapped_column(primary_key=True)
    port_id: Mapped[int] = mapped_column(ForeignKey("ports.id", ondelete="CASCADE"), unique=True)
    vendor: Mapped[str | None] = mapped_column(String(128))
    part_number: Mapped[str | None] = mapped_column(String(128), index=True)
    serial: Mapped[str | None] = mapped_column(String(128))
    type: Mapped[str | None] = mapped_column(String(64))
    form_factor: Mapped[str | None] = mapped_column(String(32))
    lanes: Mapped[int] = mapped_column(Integer, default=4)
    # The module's own DOM thresholds, keyed like schemas.Thresholds.
    thresholds: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict)
    port: Mapped[Port] = relationship(back_populates="optic")


class Link(Base):
    __tablename__ = "links"
    id: Mapped[int] = mapped_column(primary_key=True)
    a_port_id: Mapped[int] = mapped_column(ForeignKey("ports.id", ondelete="CASCADE"), unique=True)
    b_port_id: Mapped[int] = mapped_column(ForeignKey("ports.id", ondelete="CASCADE"), unique=True)
    cable_type: Mapped[str] = mapped_column(String(16), default="smf")
    length_m: Mapped[float | None] = mapped_column(Float)
    __table_args__ = (CheckConstraint("a_port_id <> b_port_id", name="link_distinct_ends"),)


class Endpoint(Base):
    """A collection endpoint (target). `config` keeps settings and secret references, never secrets."""

    __tablename__ = "endpoints"
    id: Mapped[int] = mapped_column(primary_key=True)
    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id", ondelete="CASCADE"))
    protocol: Mapped[str] = mapped_column(String(16))
    address: Mapped[str] = mapped_column(String(256))
    port: Mapped[int | None] = mapped_column(Integer)
    config: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict)
    device: Mapped[Device] = relationship(back_populates="endpoints")
    __table_args__ = (UniqueConstraint("device_id", "protocol", name="endpoint_device_protocol"),)

    @property
    def target_name(self) -> str:
        return f"{self.device.name}/{self.protocol}"
