"""Every table, imported in one place so Alembic and create-time code see the whole schema."""

from service.auth.models import ApiToken
from service.db import Base
from service.inventory.models import Device, Endpoint, Link, Optic, Pod, Port
from service.telemetry.models import CollectionSlot, LinkEvent, LldpNeighbor, Series, TargetStatus, samples

__all__ = ["ApiToken", "Base", "CollectionSlot", "Device", "Endpoint", "Link", "LinkEvent", "LldpNeighbor",
           "Optic", "Pod", "Port", "Series", "TargetStatus", "samples"]
