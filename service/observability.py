"""The service's own Prometheus metrics (served at /metrics)."""

import logging
from collections import Counter as Tally
from collections.abc import Iterator
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram

log = logging.getLogger(__name__)

INGESTED_ROWS = Counter("fabricwatch_ingested_samples_total", "Samples written to storage.")
INGEST_ERRORS = Counter("fabricwatch_ingest_errors_total", "Rejected ingest requests.", ["reason"])
REQUEST_SECONDS = Histogram("fabricwatch_http_request_seconds", "HTTP request latency.",
                            ["method", "route", "status"])
COLLECT_SECONDS = Histogram("fabricwatch_collect_seconds", "Collection duration per target.", ["protocol"])
COLLECT_ERRORS = Counter("fabricwatch_collect_errors_total", "Failed collections.", ["protocol"])


class TargetCoverageMetrics:
    """Collection coverage as gauges, read from the database at scrape time (the targets are polled by
    workers, not by this process), with bounded labels: targets per state, degraded targets per protocol,
    targets missing each metric group, refused samples per reason. Never per target or port."""

    def __init__(self) -> None:
        self.engine: Any = None

    def describe(self) -> list[Any]:
        return []   # collected only once an engine is set (the API app sets it): no probe at registration

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        if self.engine is None:
            return
        from service.telemetry.coverage import COVERAGE_GROUPS
        from service.telemetry.targets import list_targets

        try:
            with self.engine.connect() as conn:
                targets = list_targets(conn, rules=False)
        except Exception:  # a scrape must still answer with the process's own metrics
            log.warning("coverage gauges: cannot read the targets", exc_info=True)
            return
        states = GaugeMetricFamily("fabricwatch_targets", "Collection targets per state.", labels=["state"])
        degraded = GaugeMetricFamily("fabricwatch_target_degraded",
                                     "Targets that answered but stored nothing or miss an expected metric group.",
                                     labels=["protocol"])
        missing = GaugeMetricFamily("fabricwatch_target_missing_groups",
                                    "Targets whose latest collection of an expected metric group brought none.",
                                    labels=["group"])
        blind = GaugeMetricFamily("fabricwatch_targets_not_ok",
                                  "Targets that are not ok, per protocol and why: collection_failing, never_polled, "
                                  "nothing_stored (answered, stored nothing), group_missing (an expected metric group "
                                  "missing).", labels=["protocol", "reason"])
        refused = GaugeMetricFamily("fabricwatch_target_rejected_samples",
                                    "Samples refused in the targets' latest collections, per reason.",
                                    labels=["reason"])
        by_state: Tally[str] = Tally({s: 0 for s in ("ok", "degraded", "failing", "never_polled")})
        by_proto: Tally[str] = Tally({p: 0 for p in ("snmp", "gnmi", "host")})
        by_group: Tally[str] = Tally({g: 0 for g in COVERAGE_GROUPS})
        by_reason: Tally[str] = Tally()
        by_why: Tally[tuple[str, str]] = Tally({(p, w): 0 for p in by_proto for w in _NOT_OK})
        for t in targets:
            by_state[t["state"]] += 1
            if t["state"] != "ok":
                by_why[(t["protocol"], _why_not_ok(t))] += 1
            by_proto[t["protocol"]] += t["state"] == "degraded"
            cov = t["coverage"] or {}
            by_group.update(cov.get("missing") or [])
            for why, r in (cov.get("rejected") or {}).items():
                by_reason[why] += r["count"]
        for family, counts in ((states, by_state), (degraded, by_proto), (missing, by_group), (refused, by_reason)):
            for label, n in sorted(counts.items()):
                family.add_metric([label], n)
            yield family
        for (proto, why), n in sorted(by_why.items()):
            blind.add_metric([proto, why], n)
        yield blind


_NOT_OK = ("collection_failing", "never_polled", "nothing_stored", "group_missing")


def _why_not_ok(target: dict[str, Any]) -> str:
    """A bounded reason for a target that is not ok (the words are in /api/v1/targets)."""
    if target["state"] == "failing":
        return "collection_failing"
    if target["state"] == "never_polled":
        return "never_polled"
    missing = (target["coverage"] or {}).get("missing") or []
    return "group_missing" if missing and not str(target["reason"] or "").startswith("nothing stored") else \
        "nothing_stored"


TARGET_COVERAGE = TargetCoverageMetrics()
REGISTRY.register(TARGET_COVERAGE)  # type: ignore[arg-type]


FAULT_SERIES_MAX = 1000   # fabricwatch_fault_info series at most (worst first); the rest are counted, not listed
_SEVERITIES = ("page", "ticket", "info")
_OPEN_STATES = ("firing", "acknowledged")

_ALERT_COUNTS = """SELECT state, severity, cause, muted_by IS NOT NULL AS muted, count(*), count(DISTINCT device)
                   FROM alerts WHERE state <> 'resolved' GROUP BY 1, 2, 3, 4"""
_DEVICES = "SELECT severity, count(DISTINCT device) FROM alerts WHERE state <> 'resolved' GROUP BY 1"
_FAULTS = """SELECT device, coalesce(port, '') AS port, coalesce(pod, '') AS pod, kind, cause, severity, state
             FROM alerts WHERE state <> 'resolved'
             ORDER BY CASE severity WHEN 'page' THEN 0 WHEN 'ticket' THEN 1 ELSE 2 END, id LIMIT :n"""
_DETECTOR = "SELECT extract(epoch FROM saved_at), last_cycle_ms FROM detector_state WHERE name = 'default'"
_NOTIFY = """
SELECT 'webhook' AS kind, s.name, count(o.id) FILTER (WHERE o.status = 'pending') AS pending,
       count(o.id) FILTER (WHERE o.status = 'dead') AS dead,
       extract(epoch FROM clock_timestamp() - min(o.created_at) FILTER (WHERE o.status = 'pending')) AS oldest,
       NULL::bool AS up, NULL::bigint AS firing
FROM webhook_subscriptions s LEFT JOIN webhook_outbox o ON o.subscription_id = s.id GROUP BY s.id, s.name
UNION ALL
SELECT 'alertmanager', d.name, count(o.id) FILTER (WHERE o.sent_version < o.version), 0,
       extract(epoch FROM clock_timestamp() - min(o.next_attempt_at) FILTER (WHERE o.sent_version < o.version)),
       CASE WHEN d.last_attempt_at IS NULL THEN NULL ELSE d.failures = 0 END,
       count(o.id) FILTER (WHERE o.status = 'firing')
FROM alertmanager_destinations d LEFT JOIN alertmanager_outbox o ON o.destination_id = d.id
WHERE d.enabled GROUP BY d.id, d.name
"""


class FabricHealthMetrics:
    """fabricwatch's derived signals as gauges, read from the database at scrape time (alerts change in the
    workers, not in this process). They name devices, ports and receivers, so they are served only with a
    token, at /api/v1/metrics (registry FABRIC), never on the open /metrics. Cardinality is bounded: counts
    per state, severity and cause (fixed sets); one `fabricwatch_fault_info` series per open alert, at most
    FAULT_SERIES_MAX; one series per configured receiver. A series that would be per port exists only while
    that port has an open alert."""

    def __init__(self) -> None:
        self.engine: Any = None
        self.topology: Any = None   # sharded: each shard keeps its own detector state (docs/architecture.md#shards)

    def describe(self) -> list[Any]:
        return []   # collected only once an engine is set

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        from service.detection.findings import Cause

        if self.engine is None:
            return
        try:
            with self.engine.connect() as conn:
                counts = conn.exec_driver_sql(_ALERT_COUNTS).all()
                devices = conn.exec_driver_sql(_DEVICES).all()
                faults = conn.exec_driver_sql(_FAULTS.replace(":n", str(FAULT_SERIES_MAX + 1))).all()
                detector = None if self.topology is not None else conn.exec_driver_sql(_DETECTOR).first()
                notify = conn.exec_driver_sql(_NOTIFY).all()
        except Exception:  # a scrape must still answer with the process's own metrics
            log.warning("fabric health gauges: cannot read the database", exc_info=True)
            return

        open_ = GaugeMetricFamily("fabricwatch_alerts_open", "Open alerts per state and severity.",
                                  labels=["state", "severity"])
        by_state: Tally[tuple[str, str]] = Tally({(s, v): 0 for s in _OPEN_STATES for v in _SEVERITIES})
        causes = GaugeMetricFamily("fabricwatch_alerts_open_by_cause", "Open alerts per fault cause and severity.",
                                   labels=["cause", "severity"])
        by_cause: Tally[tuple[str, str]] = Tally({(c.value, v): 0 for c in Cause for v in _SEVERITIES})
        muted = GaugeMetricFamily("fabricwatch_alerts_muted",
                                  "Open alerts fabricwatch does not notify now (silence, maintenance, inhibited "
                                  "by a parent, repeat interval), per severity.", labels=["severity"])
        by_muted: Tally[str] = Tally({v: 0 for v in _SEVERITIES})
        for state, severity, cause, is_muted, n, _ in counts:
            by_state[(state, severity)] += n
            by_cause[(cause, severity)] += n
            by_muted[severity] += n if is_muted else 0
        for family, tally in ((open_, by_state), (causes, by_cause)):
            for labels, n in sorted(tally.items()):
                family.add_metric(list(labels), n)
        for sev, n in sorted(by_muted.items()):
            muted.add_metric([sev], n)
        yield from (open_, causes, muted)

        devs = GaugeMetricFamily("fabricwatch_devices_with_open_alerts",
                                 "Devices with at least one open alert of this severity.", labels=["severity"])
        by_dev: Tally[str] = Tally({v: 0 for v in _SEVERITIES})
        by_dev.update(dict(devices))
        for sev, n in sorted(by_dev.items()):
            devs.add_metric([sev], n)
        yield devs

        info = GaugeMetricFamily("fabricwatch_fault_info",
                                 f"1 per open alert: where (device, port, pod), what (kind, cause), how bad; at "
                                 f"most {FAULT_SERIES_MAX}, pages first.",
                                 labels=["device", "port", "pod", "kind", "cause", "severity", "state"])
        for row in faults[:FAULT_SERIES_MAX]:
            info.add_metric([str(v) for v in row], 1)
        yield info
        cut = GaugeMetricFamily("fabricwatch_fault_info_omitted",
                                "Open alerts left out of fabricwatch_fault_info by its series limit.")
        cut.add_metric([], max(0, sum(r[4] for r in counts) - FAULT_SERIES_MAX))
        yield cut

        if self.topology is not None:
            yield from _shard_detectors(self.topology)
        elif detector is not None:
            saved, data = _detector_families([])
            saved.add_metric([], float(detector[0]))
            data.add_metric([], (detector[1] or 0) / 1000)
            yield from (saved, data)

        pending = GaugeMetricFamily("fabricwatch_notify_pending",
                                    "Notifications not yet accepted, per receiver (webhook messages; Alertmanager: "
                                    "alerts whose latest change it has not accepted).", labels=["kind", "receiver"])
        oldest = GaugeMetricFamily("fabricwatch_notify_oldest_pending_seconds",
                                   "Age of the oldest notification not yet accepted, per receiver.",
                                   labels=["kind", "receiver"])
        dead = GaugeMetricFamily("fabricwatch_notify_dead", "Webhook messages given up after max_attempts.",
                                 labels=["receiver"])
        up = GaugeMetricFamily("fabricwatch_alertmanager_up",
                               "1 if the last POST to this Alertmanager was accepted, 0 if it failed.",
                               labels=["receiver"])
        firing = GaugeMetricFamily("fabricwatch_alertmanager_firing", "Alerts this Alertmanager holds as firing.",
                                   labels=["receiver"])
        for kind, name, n_pending, n_dead, age, is_up, n_firing in notify:
            pending.add_metric([kind, name], n_pending)
            oldest.add_metric([kind, name], float(age or 0))
            if kind == "webhook":
                dead.add_metric([name], n_dead)
            else:
                firing.add_metric([name], n_firing)
                if is_up is not None:
                    up.add_metric([name], 1 if is_up else 0)
        yield from (pending, oldest, dead, up, firing)


def _detector_families(labels: list[str]) -> tuple[Any, Any]:
    from prometheus_client.core import GaugeMetricFamily

    return (GaugeMetricFamily("fabricwatch_detection_last_cycle_timestamp_seconds",
                              "Wall time the detection cycle last saved its state (a stalled detector: time() minus "
                              "this grows); sharded, one per shard.", labels=labels),
            GaugeMetricFamily("fabricwatch_detection_data_timestamp_seconds",
                              "Data time of the samples the last detection cycle read up to; sharded, one per "
                              "shard.", labels=labels))


def _shard_detectors(topology: Any) -> Iterator[Any]:
    """Sharded: each shard's detector state, read on the shard, labelled `shard` (none before its first cycle),
    and `fabricwatch_shard_up`: 0 for a shard that did not answer, whose gauges are then absent."""
    from prometheus_client.core import GaugeMetricFamily

    from service.shards.views import read_each_shard

    got, down = read_each_shard(topology, lambda conn: conn.exec_driver_sql(_DETECTOR).first())
    saved, data = _detector_families(["shard"])
    for shard, row in sorted(got.items()):
        if row is not None:
            saved.add_metric([shard], float(row[0]))
            data.add_metric([shard], (row[1] or 0) / 1000)
    up = GaugeMetricFamily("fabricwatch_shard_up", "1 if the telemetry shard answered this scrape's read of its "
                           "detector state, 0 if not (its detection gauges are then absent).", labels=["shard"])
    for shard in sorted(topology.shards):
        up.add_metric([shard], 0 if shard in down else 1)
    yield from (saved, data, up)


HEALTH = FabricHealthMetrics()
FABRIC = CollectorRegistry(auto_describe=False)   # /api/v1/metrics adds these to the open registry's
FABRIC.register(HEALTH)  # type: ignore[arg-type]
