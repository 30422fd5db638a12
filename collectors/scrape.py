"""Scrape collector: an exporter's own /metrics (node_exporter, dcgm-exporter, snmp_exporter, gnmic), mapped
onto the catalogue by the same exporter mappings as remote write (service/telemetry/exporters), so a host
with node_exporter and dcgm-exporter needs no fabricwatch agent.

An inventory endpoint `protocol: scrape` lists its exporters' URLs in `scrape_urls` (default
`http://<address>:<port or 9100>/metrics`). As Prometheus does for a scrape target, every series gets
`instance` = the target's device: identity is the inventory's, not the exporter host's name. Labels an
exporter sets to name another device (dcgm-exporter's Hostname, gnmic's source) still come first.

Two steps, because mapping reads the inventory: `collect_scrape` fetches and parses every URL (no database),
`map_scraped` maps the series in the worker's store step (collectors/tasks.py). A URL that fails or answers
garbage is a `source:` blind spot that degrades the target (service/telemetry/coverage.py) while the other
URLs' samples are kept; all URLs failing is the collection's error. Series the mappings do not know
(node_exporter's CPU and memory, Go runtime) are counted, not stored; series of the fabric whose device or
port the inventory lacks are warned about by name.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import httpx
from sqlalchemy import Engine

from collectors.base import CollectResult, Target, register
from service.telemetry.exporters.base import Reason
from service.telemetry.exporters.mapper import LabelPairs, Mapper
from service.telemetry.promtext import PromParseError, parse_lines

DEFAULT_PORT = 9100  # node_exporter's
MAX_BODY_BYTES = 64 << 20  # a large dcgm-exporter page is a few MiB
# mapping outcomes that mean "fabric telemetry we could not place", not "not fabric telemetry"
_IDENTITY = (Reason.UNKNOWN_INSTANCE, Reason.AMBIGUOUS_INSTANCE, Reason.UNKNOWN_PORT, Reason.MISSING_LABEL,
             Reason.BAD_LABEL)

Series = list[tuple[LabelPairs, list[tuple[int, float]]]]


@dataclass(slots=True)
class ScrapeResult(CollectResult):
    series: Series = field(default_factory=list)  # parsed, not yet mapped (map_scraped)
    unmapped: dict[str, int] = field(default_factory=dict)  # mapping outcome -> samples


def urls_of(target: Target) -> list[str]:
    urls = target.params.get("scrape_urls") or [f"http://{target.address}:{target.port or DEFAULT_PORT}/metrics"]
    return [str(u) for u in urls]


def _fetch(client: httpx.Client, url: str) -> tuple[str, int]:
    """The page's text and when it arrived (ms); httpx.HTTPError or ValueError with the reason."""
    with client.stream("GET", url, headers={"accept": "text/plain;version=0.0.4"}) as resp:
        if resp.status_code != 200:
            raise ValueError(f"HTTP {resp.status_code} {resp.reason_phrase}")
        body = bytearray()
        for chunk in resp.iter_bytes():
            body += chunk
            if len(body) > MAX_BODY_BYTES:
                raise ValueError(f"page larger than {MAX_BODY_BYTES >> 20} MiB")
        arrived = int(time.time() * 1000)
        return body.decode(resp.encoding or "utf-8", errors="replace"), arrived


def _series(page: str, source: str, device: str, at_ms: int) -> Series:
    """Parsed samples grouped by label set, `instance` set to the device; PromParseError names the line."""
    out: dict[LabelPairs, list[tuple[int, float]]] = {}
    for line in parse_lines(page.splitlines(), source):
        labels = {k: v for k, v in line.labels if k != "instance"}
        labels["__name__"], labels["instance"] = line.name, device
        out.setdefault(tuple(sorted(labels.items())), []).append((line.ts_ms or at_ms, line.value))
    return list(out.items())


@register("scrape")
def collect_scrape(target: Target, *, now_ms: int) -> ScrapeResult:
    """Fetch and parse every URL of the target; one URL's failure never loses the others' series.

    Samples without a timestamp are stamped when their page arrived, not when the poll was due (`now_ms`)."""
    t0 = time.monotonic()
    res = ScrapeResult(target=target.name)
    failed: list[str] = []
    urls = urls_of(target)
    transport = httpx.HTTPTransport(retries=target.retries)  # connection failures only, as Prometheus would not
    with httpx.Client(transport=transport, timeout=target.timeout_s, follow_redirects=True) as client:
        for url in urls:
            try:
                page, arrived = _fetch(client, url)
                res.series += _series(page, url, target.device, arrived)
            except PromParseError as exc:
                failed.append(f"{url}: not Prometheus text: {exc}")
            except (httpx.HTTPError, ValueError) as exc:
                failed.append(f"{url}: {type(exc).__name__ if not str(exc) else exc}")
    res.warnings += [f"source: {why}" for why in failed]
    if len(failed) == len(urls):
        res.error = f"every exporter URL failed: {'; '.join(failed)}"[:1000]
    res.duration_s = time.monotonic() - t0
    return res


MAPPER = Mapper()  # one per worker process: it remembers ranks and sums across scrapes


def map_scraped(engine: Engine, result: ScrapeResult) -> None:
    """Map the scraped series onto the catalogue (in place): samples, counts, and a warning per kind of
    fabric series that could not be placed in the inventory."""
    if not result.series:
        return
    with engine.connect() as conn:
        mapped = MAPPER.map(conn, result.series)
    result.samples = mapped.samples
    result.unmapped = dict(mapped.unmapped)
    for reason in _IDENTITY:
        n = mapped.unmapped.get(str(reason), 0)
        if n:
            examples = Counter(mapped.details[str(reason)]).most_common(5)
            result.warnings.append(f"ports: {n} samples not placed ({reason}): "
                                   + ", ".join(what for what, _ in examples))
    result.series = []  # mapped: not kept (nor spooled) twice
