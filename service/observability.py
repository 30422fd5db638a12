"""The service's own Prometheus metrics (served at /metrics)."""

import logging
from collections import Counter as Tally
from collections.abc import Iterator
from typing import Any

from prometheus_client import REGISTRY, Counter, Histogram

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
        refused = GaugeMetricFamily("fabricwatch_target_rejected_samples",
                                    "Samples refused in the targets' latest collections, per reason.",
                                    labels=["reason"])
        by_state: Tally[str] = Tally({s: 0 for s in ("ok", "degraded", "failing", "never_polled")})
        by_proto: Tally[str] = Tally({p: 0 for p in ("snmp", "gnmi", "host")})
        by_group: Tally[str] = Tally({g: 0 for g in COVERAGE_GROUPS})
        by_reason: Tally[str] = Tally()
        for t in targets:
            by_state[t["state"]] += 1
            by_proto[t["protocol"]] += t["state"] == "degraded"
            cov = t["coverage"] or {}
            by_group.update(cov.get("missing") or [])
            for why, r in (cov.get("rejected") or {}).items():
                by_reason[why] += r["count"]
        for family, counts in ((states, by_state), (degraded, by_proto), (missing, by_group), (refused, by_reason)):
            for label, n in sorted(counts.items()):
                family.add_metric([label], n)
            yield family


TARGET_COVERAGE = TargetCoverageMetrics()
REGISTRY.register(TARGET_COVERAGE)  # type: ignore[arg-type]
