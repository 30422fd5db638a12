"""Celery tasks: the dispatcher that decides which targets are due, and one collection per target.

The dispatcher runs on beat every second or so. For each target and metric group it computes
the current poll slot, `floor((now - offset) / interval)`, where a stable per-target offset
spreads the targets over the interval (jitter without randomness). A slot is claimed with one
atomic UPDATE, so a second beat, or a dispatcher retried after a crash, never dispatches the
same slot twice. Each due target becomes its own task with an expiry of one interval, so a
slow or dead device only ever delays itself.
"""

from __future__ import annotations

import contextlib
import logging
import time
import zlib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from sqlalchemy import Engine, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

import collectors.gnmi
import collectors.gnmi_stream as gnmi_stream
import collectors.host
import collectors.scrape as scrape
import collectors.snmp  # noqa: F401
from collectors.base import CollectResult, Target, get_collector
from collectors.queues import queue_rule
from collectors.spool import PendingStore, default_spool_dir, spool_drain, spool_write
from service.config import Settings, get_settings
from service.db import get_engine
from service.inventory.secrets import SecretError, target_for
from service.models import Endpoint
from service.observability import COLLECT_ERRORS, COLLECT_SECONDS
from service.shards.ingest import shard_spool_for, shard_spools, store_samples, topology_of
from service.telemetry.coverage import record_coverage
from service.telemetry.ingest import Ingestor, IngestReport
from service.telemetry.targets import (
    GROUPS,
    EndpointRow,
    group_of,
    load_endpoints,
    record_link_events,
    record_neighbors,
    record_status,
)
from service.worker import celery_app

log = logging.getLogger(__name__)

_CLAIM_SQL = """
INSERT INTO collection_slots AS c (endpoint_id, grp, last_slot) VALUES (:id, :grp, :slot)
ON CONFLICT (endpoint_id, grp) DO UPDATE SET last_slot = EXCLUDED.last_slot
WHERE c.last_slot < EXCLUDED.last_slot
RETURNING endpoint_id
"""


def interval_s(ep: EndpointRow, group: str, settings: Settings) -> float:
    configured = (ep.config.get("intervals") or {}).get(group)
    if configured:
        return float(configured)
    return {"counters": settings.counters_interval_s, "optics": settings.optics_interval_s,
            "state": settings.state_interval_s}[group]


def slot_of(endpoint_id: int, group: str, interval: float, now_ms: int) -> int:
    """The poll slot `now` falls in, shifted by a stable per-target offset within the interval."""
    period = max(int(interval * 1000), 1)
    offset = zlib.crc32(f"{endpoint_id}:{group}".encode()) % period
    return (now_ms - offset) // period


@celery_app.task(name="fabricwatch.dispatch_collections")
def dispatch_collections(now_ms: int | None = None) -> int:
    """Send one collection task for every target with a group due now; returns how many were sent."""
    settings = get_settings()
    now = now_ms if now_ms is not None else int(time.time() * 1000)
    engine = get_engine(settings.database_url or "")
    due: dict[int, list[str]] = {}
    with engine.begin() as conn:
        endpoints = load_endpoints(conn)
        for ep in endpoints:
            for group in GROUPS:
                slot = slot_of(ep.id, group, interval_s(ep, group, settings), now)
                claimed = conn.execute(text(_CLAIM_SQL), {"id": ep.id, "grp": group, "slot": slot}).first()
                if claimed is not None:
                    due.setdefault(ep.id, []).append(group)
        streaming = gnmi_stream.streaming_now(conn)  # a live stream collects these: no Get poll
        rule = queue_rule(conn, settings.shards)  # with shards: collect.<shard of the device's pod>
    by_id = {ep.id: ep for ep in endpoints}
    for ep_id, groups in due.items():
        if ep_id in streaming:
            continue
        ep = by_id[ep_id]
        expires = min(interval_s(ep, g, settings) for g in groups)
        collect_target.apply_async(args=[ep_id, groups], queue=rule.queue_for(ep.config, ep.pod),
                                    expires=expires)
    return len(due)


def run_collection(endpoint_id: int, groups: list[str], *, settings: Settings | None = None) -> dict[str, Any]:
    """Collect one target now and store it; if the database is away, spool it for a later task."""
    settings = settings or get_settings()
    engine = get_engine(settings.database_url or "")
    spool_dir = Path(settings.spool_dir) if settings.spool_dir else default_spool_dir()
    # sharded: a spool per shard besides this one, so a down shard's backlog holds back only its own
    for directory in [spool_dir, *shard_spools(spool_dir, settings)]:
        with contextlib.suppress(OperationalError):  # still away: the spool waits for the next task
            spool_drain(directory, lambda p: store_collection(engine, p, settings=settings))
    pending = collect_endpoint(engine, endpoint_id, groups)
    if pending is None:
        return {"endpoint_id": endpoint_id, "skipped": "endpoint no longer in the inventory"}
    try:
        report = store_collection(engine, pending, settings=settings)
    except OperationalError as exc:
        path = spool_write(shard_spool_for(spool_dir, engine, settings, pending.device_id), pending)
        log.warning("database unreachable (%s); spooled %d samples of %s to %s", type(exc).__name__,
                    len(pending.result.samples), pending.result.target, path)
        return {"target": pending.result.target, "ok": pending.result.ok, "spooled": str(path)}
    result = pending.result
    return {"target": result.target, "ok": result.ok, "error": result.error, "samples": len(result.samples),
            "written": report.written, "rejected": report.rejected}


def collect_endpoint(engine: Engine, endpoint_id: int, groups: list[str]) -> PendingStore | None:
    """Run the endpoint's collector; every failure becomes part of the result, never an exception."""
    with Session(engine) as session:
        endpoint = session.get(Endpoint, endpoint_id)
        if endpoint is None:
            return None
        device_id, device_name, protocol = endpoint.device_id, endpoint.device.name, endpoint.protocol
        port_names = [p.name for p in endpoint.device.ports]
        nic_ports = {p.nic: p.name for p in endpoint.device.ports if p.nic}
        try:
            target: Target | None = target_for(endpoint)
        except SecretError as exc:
            target, secret_error = None, str(exc)
    started_ms = int(time.time() * 1000)
    if target is None:
        result = CollectResult(target=f"{device_name}/{protocol}", error=secret_error)
    else:
        params = {**target.params, "poll_groups": groups}
        if protocol == "host":
            params.setdefault("interfaces", port_names)
            params.setdefault("nic_ports", nic_ports)
        if protocol == "gnmi":  # what path discovery learned about this target (collectors/gnmi_discovery.py)
            with engine.connect() as conn:
                params["discovery"] = gnmi_stream.load_discovery(conn, endpoint_id)
        target = target.model_copy(update={"params": params})
        t0 = time.perf_counter()
        try:
            result = get_collector(protocol)(target, now_ms=started_ms)
        except SoftTimeLimitExceeded:  # a hung source (service/worker.py): the cut is the target's status
            log.warning("collection of %s cut off at its time limit", target.name)
            result = CollectResult(target=target.name, error=f"collection cut off at its time limit "
                                   f"({collect_target.soft_time_limit:g} s): a source hung")
        except Exception as exc:  # a collector bug must become a status, not a dead task loop
            log.exception("collector %s crashed on %s", protocol, target.name)
            result = CollectResult(target=target.name, error=f"collector crashed: {type(exc).__name__}: {exc}")
        if isinstance(result, scrape.ScrapeResult):  # exporter series -> catalogue, through the inventory
            try:
                scrape.map_scraped(engine, result)
            except OperationalError as exc:
                result.error = f"exporter series not mapped: the database is unreachable ({type(exc).__name__})"
        result.duration_s = result.duration_s or time.perf_counter() - t0
        discovered = getattr(result, "discovery", None)
        if discovered and discovered != params.get("discovery"):
            with contextlib.suppress(OperationalError), engine.begin() as conn:  # relearned next poll if lost
                gnmi_stream.save_discovery(conn, endpoint_id, discovered)
    wanted = set(groups)
    result.samples = [s for s in result.samples if group_of(s.metric) in wanted]
    COLLECT_SECONDS.labels(protocol).observe(result.duration_s)
    if not result.ok:
        COLLECT_ERRORS.labels(protocol).inc()
    return PendingStore(endpoint_id, device_id, protocol, groups, started_ms, result)


def store_collection(engine: Engine, pending: PendingStore, *, settings: Settings) -> IngestReport:
    """Samples, link events, neighbours and status of one collection, in one transaction."""
    result = pending.result
    started = datetime.fromtimestamp(pending.started_ms / 1000, tz=UTC)
    # Sharded, each sample goes to its device's shard (an exporter scrape's may name several; committed first:
    # a retry stores no duplicates) and the status to the control database; unsharded both are this one
    # transaction (service/shards/ingest.py).
    topology = topology_of(settings, engine.url.render_as_string(hide_password=False))
    with engine.begin() as conn:
        if topology is None:
            ingestor = Ingestor(conn, batch_rows=settings.ingest_batch_rows)
            for s in result.samples:
                ingestor.add(s)
            report = ingestor.finish()
        else:
            report = store_samples(conn, topology, result.samples, batch_rows=settings.ingest_batch_rows)
        warnings = list(result.warnings)
        if report.rejected:
            # Samples for entities the inventory lacks are kept visible in the target's status.
            unknown = {**report.unknown_ports, **report.unknown_devices, **report.unknown_metrics}
            warnings.append(f"{report.rejected} samples not stored (not in the inventory or catalogue): "
                            + ", ".join(sorted(unknown)[:10]))
        shown = CollectResult(target=result.target, error=result.error, warnings=warnings,
                              duration_s=result.duration_s)
        record_link_events(conn, device_id=pending.device_id, result=result, source=pending.protocol)
        record_neighbors(conn, device_id=pending.device_id, result=result, at=started)
        record_status(conn, endpoint_id=pending.endpoint_id, result=shown, stored=report.written, at=started)
        # expected metric groups against what arrived, and what was refused (service/telemetry/coverage.py)
        record_coverage(conn, endpoint_id=pending.endpoint_id, protocol=pending.protocol, polled=pending.groups,
                        result=result, report=report, at_ms=pending.started_ms)
    return report


@celery_app.task(name="fabricwatch.collect_target", acks_late=True)
def collect_target(endpoint_id: int, groups: list[str]) -> dict[str, Any]:
    return run_collection(endpoint_id, groups)
