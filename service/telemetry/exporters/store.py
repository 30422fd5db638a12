"""Store what the mapper gives: mapped rows and columns -> the one ingest path, in the caller's transaction.

    with engine.begin() as conn:
        mapped = mapper.map(conn, series)
        report, widths = store_mapped(conn, mapped, mapper)
    mapper.widths_stored(widths)            # after the commit
"""

from __future__ import annotations

import numpy as np
from sqlalchemy import Connection

from service.telemetry.exporters.mapper import Mapper, MapResult, SeriesKey
from service.telemetry.ingest import Ingestor, IngestReport
from service.telemetry.promtext import PromBlock
from service.telemetry.samples import Sample


def store_mapped(conn: Connection, mapped: MapResult, mapper: Mapper, *, batch_rows: int = 50_000,
                 source: str = "exporters") -> tuple[IngestReport, list[SeriesKey]]:
    """Store mapped rows in the caller's transaction. Rows go the way of the text import (one block of
    columns, series resolved by their exposition text, which this process remembers between requests),
    except rows of series with a counter width (SNMP Counter32, saturating IB counters) not yet stored
    by this process: those go sample by sample, so a new series is created with its width. Returns the
    report and those series, for `mapper.widths_stored` once the transaction commits."""
    ingestor = Ingestor(conn, batch_rows=batch_rows)
    plain, widths = [], []
    for r in mapped.rows:
        if (r.counter_bits is None and not r.saturating) or mapper.width_known(r.key):
            plain.append(r)
        else:
            widths.append(r)
    texts: list[str] = []
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    if mapped.block is not None:
        texts += mapped.block.texts
        parts.append((mapped.block.codes, mapped.block.ts_ms, mapped.block.values))
    if plain:
        counts = np.fromiter((len(r.points) for r in plain), np.int64, len(plain))
        points = [p for r in plain for p in r.points]
        ts = np.fromiter((p[0] for p in points), np.int64, len(points))
        values = np.fromiter((p[1] for p in points), np.float64, len(points))
        parts.append((np.repeat(np.arange(len(texts), len(texts) + len(plain), dtype=np.int32), counts), ts, values))
        texts += [r.text for r in plain]
    if texts:
        codes, ts, values = (np.concatenate(c) for c in zip(*parts, strict=True))
        block = PromBlock(first_line=1, texts=texts, codes=codes, values=values, ts_ms=ts)
        ingestor.add_prom_blocks([block], 0, source=source)
    for r in widths:
        metric, device, port, lane, prio, gpu = r.key
        for t, v in r.points:
            ingestor.add(Sample(metric, v, t, device, port, lane, prio, gpu, r.counter_bits, r.saturating))
    return ingestor.finish(), [r.key for r in widths]

