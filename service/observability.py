"""The service's own Prometheus metrics (served at /metrics)."""

from prometheus_client import Counter, Histogram

INGESTED_ROWS = Counter("fabricwatch_ingested_samples_total", "Samples written to storage.")
INGEST_ERRORS = Counter("fabricwatch_ingest_errors_total", "Rejected ingest requests.", ["reason"])
REQUEST_SECONDS = Histogram("fabricwatch_http_request_seconds", "HTTP request latency.",
                            ["method", "route", "status"])
COLLECT_SECONDS = Histogram("fabricwatch_collect_seconds", "Collection duration per target.", ["protocol"])
COLLECT_ERRORS = Counter("fabricwatch_collect_errors_total", "Failed collections.", ["protocol"])
