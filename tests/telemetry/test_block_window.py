"""raw_rows_between and samples_between read only the slice of an import block inside the range
(migration 0250): the same samples as filtering the whole block, at every kind of boundary."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine, text

from tests.factories import add_hosts

T0 = datetime(2026, 11, 2, tzinfo=UTC)
# irregular times (a gap, steps of 1 s and 10 s), strictly increasing as an import writes them
OFFSETS_S = [0, 1, 2, 12, 22, 300, 301, 310, 900, 905]


def test_block_slices_match_filtering_the_whole_block(db: Engine) -> None:
    add_hosts(db, 1)
    times = [T0 + timedelta(seconds=s) for s in OFFSETS_S]
    with db.begin() as conn:
        conn.execute(text("INSERT INTO sample_blocks VALUES (1, :a, :b, CAST(:ts AS timestamptz[]), "
                          "CAST(:v AS float8[]))"),
                     {"a": times[0], "b": times[-1], "ts": times, "v": [float(i) for i in range(len(times))]})
    # every boundary: before the first, on a sample, between two, after the last; empty ranges too
    edges = sorted({T0 + timedelta(seconds=s + d) for s in OFFSETS_S for d in (-0.5, 0, 0.5)}
                   | {T0 - timedelta(hours=1), T0 + timedelta(hours=1)})
    checked = 0
    with db.connect() as conn:
        for fn in ("raw_rows_between", "samples_between"):
            for lo in edges:
                for hi in edges:
                    got = [(r[0], r[1]) for r in conn.execute(
                        text(f"SELECT ts, value FROM {fn}(:lo, :hi) ORDER BY ts"), {"lo": lo, "hi": hi})]
                    want = [(t, float(i)) for i, t in enumerate(times) if lo <= t <= hi]
                    assert got == want, (fn, lo, hi)
                    checked += bool(want)
    assert checked > 500
