"""Run a scenario in memory and read series back as arrays (no files)."""

from __future__ import annotations

from typing import Any

import numpy as np

from simulator.scenarios import Scenario
from simulator.telemetry import FabricSim, make_sim, timeline

T0 = 1_735_689_600.0  # 2025-01-01T00:00:00Z


def run(spec: dict[str, Any], end: float = 3600, step: float = 60) -> tuple[FabricSim, dict[str, list]]:
    """Simulate and keep every frame's values per metric (small fabrics only)."""
    sc = Scenario.model_validate({"name": "t", **spec})
    sim = make_sim(None, sc, T0)
    frames: dict[str, list] = {}
    for t in timeline(T0, T0 + end, step):
        f = sim.step(t, step)
        for n, v in f.values.items():
            keep = f.keep.get(n)
            frames.setdefault(n, []).append(np.where(keep, v, np.nan) if keep is not None else np.array(v))
    return sim, frames


def series(sim: FabricSim, frames: dict[str, list], metric: str, device: str, port: str | None = None,
           lane: int | None = None) -> np.ndarray:
    b = sim.block[metric]
    if b.gpu is not None:
        mask = b.gpu_dev == sim.m.dev_names.index(device)
    else:
        mask = b.ports == sim.m.port(device, port)
        if lane is not None:
            mask &= b.lane == lane
    j = np.flatnonzero(mask)
    return np.asarray([np.asarray(f, dtype=float)[j] for f in frames[metric]])
