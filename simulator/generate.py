"""Offline output: a scenario over a time range -> Prometheus text, inventory.yaml, ground_truth.json.

The bulk path never builds Sample objects: each metric block keeps a %-format template of
its series (label sets fixed for the run) and a step is formatted with one C-level ``%``
over the block's value and timestamp arrays. Lines are the same as promtext.format_sample
writes (labels device, port, lane, priority, gpu; millisecond timestamps), except that
gauges are printed with 6 significant digits.
"""

from __future__ import annotations

import gzip
import io
import json
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import compress
from pathlib import Path
from typing import IO, Any

import numpy as np

from service.telemetry.catalogue import METRICS, Entity, Kind
from simulator.scenarios import Scenario, TimeSpec, load_scenario, parse_duration, parse_time
from simulator.telemetry import (
    PRIORITY,
    Block,
    FabricModel,
    FabricSim,
    Frame,
    make_sim,
    resolve_inventory,
    timeline,
)
from simulator.topology import write_inventory

DEFAULT_START = "2025-01-01T00:00:00Z"


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class BlockText:
    """Pre-rendered label sets of one block, and the per-step formatting of its values."""

    def __init__(self, b: Block, m: FabricModel) -> None:
        ent = METRICS[b.metric].entity
        if b.gpu is not None:
            self.dev = b.gpu_dev
            pre = [f'{b.metric}{{device="{_esc(m.dev_names[d])}",gpu="{g}"}} '
                   for d, g in zip(b.gpu_dev.tolist(), b.gpu.tolist(), strict=True)]
        else:
            self.dev = m.dev[b.ports]
            extra = [""] * len(b.ports)
            if ent is Entity.LANE:
                extra = [f',lane="{x}"' for x in b.lane.tolist()]
            elif ent is Entity.PRIORITY:
                extra = [f',priority="{PRIORITY}"'] * len(b.ports)
            pre = [f'{b.metric}{{device="{_esc(m.port_dev_name[p])}",port="{_esc(m.port_name[p])}"{x}}} '
                   for p, x in zip(b.ports.tolist(), extra, strict=True)]
        kind = METRICS[b.metric].kind
        self.fmt = "%d" if kind is Kind.COUNTER else "%.6g"
        if b.metric.endswith("_seconds_total"):
            self.fmt = "%.6f"
        self.lines = [p.replace("%", "%%") + self.fmt + " %d\n" for p in pre]
        self.template = "".join(self.lines)
        self.n = len(pre)

    def render(self, values: np.ndarray, ts_ms: np.ndarray, keep: np.ndarray | None) -> str:
        ts = ts_ms[self.dev]
        if keep is not None:
            values, ts = values[keep], ts[keep]
        has_nan = values.dtype.kind == "f" and bool(np.isnan(values).any())
        tmpl = self.template if keep is None else "".join(compress(self.lines, keep))
        if self.fmt == "%d":
            if has_nan:  # NaN counters (garbled reads) print through %s
                vals: list[Any] = [int(x) if x == x else "NaN" for x in values.tolist()]
                tmpl = tmpl.replace("%d %d", "%s %d")
            else:
                vals = values.astype(np.int64).tolist()
        else:
            vals = values.tolist()
        args: list[Any] = [None] * (2 * len(vals))
        args[0::2] = vals
        args[1::2] = ts.tolist()
        text = tmpl % tuple(args)
        return text.replace("nan ", "NaN ") if has_nan and self.fmt != "%d" else text


def write_frame(sim: FabricSim, texts: dict[str, BlockText], frame: Frame, out: IO[str]) -> int:
    """Write one frame; returns the number of lines."""
    n = 0
    for b in sim.blocks:
        v = frame.values.get(b.metric)
        if v is None:
            continue
        keep = frame.keep.get(b.metric)
        out.write(texts[b.metric].render(np.asarray(v, dtype=float) if v.dtype != np.uint64 else v,
                                         frame.ts_ms, keep))
        n += int(keep.sum()) if keep is not None else len(v)
    return n


@dataclass
class GenerateResult:
    out_dir: Path
    metrics_file: Path
    inventory_file: Path
    ground_truth_file: Path
    steps: int
    samples: int
    seconds: float
    ports: int
    series: int
    faults: int
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SizeEstimate:
    """How much a run will write, from its first step: the lines and text of the rest are about the same."""

    steps: int
    samples: int
    text_bytes: int  # metrics.prom
    gzip_bytes: int  # metrics.prom.gz, roughly (the first step compressed on its own)
    out_dir: Path
    gzipped: bool  # whether this run writes the gzip

    @property
    def bytes(self) -> int:
        """What this run writes."""
        return self.gzip_bytes if self.gzipped else self.text_bytes


class GenerationDeclined(Exception):
    """The caller's `confirm` declined the estimate; nothing was written."""


def resolve_range(sc: Scenario, start: TimeSpec | None, end: TimeSpec | None,
                  step: TimeSpec | None) -> tuple[float, float, float]:
    t0 = parse_time(start if start is not None else (sc.start if sc.start is not None else DEFAULT_START))
    t1 = parse_time(end if end is not None else (sc.end if sc.end is not None else "1h"), t0)
    dt = parse_duration(step if step is not None else (sc.step if sc.step is not None else 60))
    if t1 <= t0:
        raise ValueError("end is not after start")
    if dt <= 0:
        raise ValueError("step must be positive")
    return t0, t1, dt


def generate(scenario_file: str | Path | Scenario, start: TimeSpec | None = None, end: TimeSpec | None = None,
             step: TimeSpec | None = None, out_dir: str | Path = "sim-out", compress_gz: bool = False,
             groups: set[str] | None = None,
             confirm: Callable[[SizeEstimate], bool] | None = None) -> GenerateResult:
    """Generate metrics.prom(.gz), inventory.yaml and ground_truth.json into out_dir.

    `confirm` sees the size estimate before anything is written; if it returns False, GenerationDeclined."""
    sc = scenario_file if isinstance(scenario_file, Scenario) else load_scenario(scenario_file)
    t0, t1, dt = resolve_range(sc, start, end, step)
    out = Path(out_dir)
    inv = resolve_inventory(sc.inventory_source())
    grp = groups or (set(sc.groups) if sc.groups else None)
    sim = make_sim(inv, sc, t0, groups=grp)
    texts = {b.metric: BlockText(b, sim.m) for b in sim.blocks}
    clock = time.perf_counter()
    times = list(timeline(t0, t1, dt))
    first = io.StringIO()  # the first step, written to the file once it is confirmed
    samples = write_frame(sim, texts, sim.step(times[0], dt), first) if times else 0
    steps = len(times)
    estimate = _estimate(first.getvalue(), samples, steps, out, compress_gz)
    spent = time.perf_counter() - clock
    if confirm is not None and not confirm(estimate):
        raise GenerationDeclined(f"declined: about {estimate.bytes:,} bytes")
    clock = time.perf_counter() - spent  # the time to confirm is not the generator's
    out.mkdir(parents=True, exist_ok=True)
    inv_path = write_inventory(inv, out / "inventory.yaml")
    metrics_path = out / ("metrics.prom.gz" if compress_gz else "metrics.prom")
    opener = (lambda p: gzip.open(p, "wt", compresslevel=1)) if compress_gz else \
        (lambda p: open(p, "w", buffering=1 << 22))  # noqa: SIM115 - closed by the with below
    with opener(metrics_path) as f:
        f.write(first.getvalue())
        for t in times[1:]:
            samples += write_frame(sim, texts, sim.step(t, dt), f)
    secs = time.perf_counter() - clock
    truth = {
        "scenario": sc.name, "seed": sc.seed, "start": t0, "end": t1, "step": dt,
        "metrics_file": metrics_path.name, "inventory_file": inv_path.name,
        "events": sc.ground_truth(sim.m),
    }
    gt_path = out / "ground_truth.json"
    gt_path.write_text(json.dumps(truth, indent=2))
    return GenerateResult(out, metrics_path, inv_path, gt_path, steps, samples, secs, sim.m.P,
                          sum(t.n for t in texts.values()), len(sc.faults))


def _estimate(first_step: str, samples: int, steps: int, out: Path, gzipped: bool) -> SizeEstimate:
    """Every step as large as the first (counters grow a digit now and then; faults drop a few lines)."""
    data = first_step.encode()
    packed = len(zlib.compress(data, 1))
    return SizeEstimate(steps, samples * steps, len(data) * steps, packed * steps, out, gzipped)
