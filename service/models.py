"""Every table, imported in one place so Alembic and create-time code see the whole schema."""

from service.alerts.models import Alert, AlertEvent, MaintenanceWindow, Silence
from service.auth.models import ApiToken
from service.db import Base
from service.detection.models import DetectionFinding, DetectorModel, DetectorState
from service.drains.models import DrainBreaker, DrainRecommendation
from service.incidents.models import Incident, IncidentEvent
from service.inventory.models import Device, Endpoint, Link, Optic, Pod, Port
from service.nccl.models import NcclBaseline, NcclResultRow, NcclRunRow
from service.notify.models import OutboxMessage, WebhookDelivery, WebhookSubscription
from service.shards.models import ShardPod
from service.telemetry.models import (
    ChunkWatermark,
    CollectionSlot,
    GnmiStreamState,
    LinkEvent,
    LldpNeighbor,
    Series,
    TargetStatus,
    sample_blocks,
    sample_chunks,
    sample_rows,
)

__all__ = [
    "Alert",
    "AlertEvent",
    "ApiToken",
    "Base",
    "ChunkWatermark",
    "CollectionSlot",
    "DetectionFinding",
    "DetectorModel",
    "DetectorState",
    "Device",
    "DrainBreaker",
    "DrainRecommendation",
    "Endpoint",
    "GnmiStreamState",
    "Incident",
    "IncidentEvent",
    "Link",
    "LinkEvent",
    "LldpNeighbor",
    "MaintenanceWindow",
    "NcclBaseline",
    "NcclResultRow",
    "NcclRunRow",
    "Optic",
    "OutboxMessage",
    "Pod",
    "Port",
    "sample_blocks",
    "sample_chunks",
    "sample_rows",
    "Series",
    "ShardPod",
    "Silence",
    "TargetStatus",
    "WebhookDelivery",
    "WebhookSubscription",
]
