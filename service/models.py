"""Every table, imported in one place so Alembic and create-time code see the whole schema."""

from service.auth.models import ApiToken
from service.db import Base
from service.drains.models import DrainBreaker, DrainRecommendation
from service.incidents.models import Incident, IncidentEvent
from service.inventory.models import Device, Endpoint, Link, Optic, Pod, Port
from service.telemetry.models import CollectionSlot, LinkEvent, LldpNeighbor, Series, TargetStatus, samples

__all__ = ["ApiToken", "Base", "CollectionSlot", "Device", "DrainBreaker", "DrainRecommendation", "Incident",
           "IncidentEvent", "Endpoint", "Link", "LinkEvent", "LldpNeighbor",
           "Optic", "Pod", "Port", "Series", "TargetStatus", "samples"]
