"""Detection evaluation (shared/docs/detection.md 4.1-4.4): the S1-S12 suite through import, detection and alerts.

    .venv/bin/python bench/detection_eval.py [--seeds 1 2 3 4 5] [--tune-seeds 101 102 103] [--quick]
        [--server postgresql://postgres@127.0.0.1:5432/postgres] [--workers 2] [--set name=value ...]

Per suite (examples/scenarios/eval/*.yaml) and seed: a scratch database is created and migrated, the
inventory loaded, the simulated telemetry written as Prometheus text and imported with
`import_prometheus`, then detection replays the stored history (`backtest` with a Config) and every
cycle's findings go through the alert state machine (`pipeline.apply_cycle`) into the scratch
database's alert tables. The alerts (opened/reopened events) are what is scored, event by event,
with no point adjustment. Baselines: static DOM thresholds (rx below the module's low-warning, from
the stored samples), rules only (the same detector with trends and the forest switched off through
Config), and a random detector with the same alert count. Scratch databases are dropped at the end.
Prints the figures; docs/detection-eval.md holds a run's results.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import multiprocessing as mp
import os
import platform
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

SUITES = ("hard-faults", "confounders", "gradual-optics")
EVAL_DIR = REPO / "examples" / "scenarios" / "eval"
T0 = 1_735_689_600.0  # 2025-01-01T00:00:00Z
DAY = 86_400.0

# Per-scenario tolerance after onset for a TP (brief 4.3: 10 min for S4-S6 and S9, until hard failure for S2).
TOLERANCE_S = {"S1": 2 * 3600, "S3": 2 * 3600, "S4": 600, "S5": 600, "S6": 600, "S9": 600, "S10": 1800,
               "S11": 600}
HARD = ("S4", "S5", "S6", "S9", "S11")
GRADUAL = ("S1", "S2", "S3")
CONFOUNDERS = ("S5-benign", "S7", "S8", "S12")
LATENESS_S = 30.0  # Config.lateness_ms
# Cycles run this long after each nominal poll time: lateness plus the suites' timestamp jitter (+-400 ms),
# so a cycle reads the whole poll it follows, not just the samples stamped before the nominal time.
CYCLE_AFTER_POLL_S = LATENESS_S + 1.0
FRAGMENT_GRACE_S = 3600  # alerts on the event's entity up to 1 h after it ends are the same event

# Ground-truth cause -> class; detector Cause -> class.
TRUTH_CLASS = {"physical-contamination": "contamination", "physical-tx": "tx-wearout", "physical-fiber": "fiber",
               "flap-seating": "flap/seating", "flap": "flap-storm", "shared-component": "shared-component",
               "physical-electrical": "post-fec", "congestion": "congestion", "congestion-hotspot": "congestion",
               "nic-stall": "nic-stall",
               "host": "host", "telemetry-artefact": "none", "benign": "none"}
PRED_CLASS = {"connector_contamination": "contamination", "transmitter_wearout": "tx-wearout",
              "fiber_damage": "fiber", "loose_module": "flap/seating", "flap_storm": "flap-storm",
              "shared_component": "shared-component", "post_fec_errors": "post-fec", "congestion": "congestion",
              "nic_pause_storm": "nic-stall", "host_side": "host", "module_alarm": "physical-other",
              "unknown_physical": "physical-other", "static_dom": "physical-other"}
NON_PHYSICAL = {"congestion", "nic-stall", "host", "none", "missed"}
CLASSES = ["contamination", "tx-wearout", "fiber", "flap/seating", "flap-storm", "shared-component", "post-fec",
           "nic-stall", "host", "congestion", "physical-other", "none", "missed"]

# Per-seed parameter jitter: fault type -> {param: (lo, hi)}; ("log", lo, hi) draws log-uniformly.
JITTER: dict[str, dict[str, tuple]] = {
    "dirty_connector": {"drop_db": (2.0, 5.0)},
    "decaying_laser": {"rate_db_per_day": (0.5, 1.0), "bias_pct_per_day": (3.0, 5.0)},
    "damaged_fiber": {"drop_db": (2.0, 4.0), "wobble_db": (0.5, 1.5)},
    "loose_transceiver": {"bursts_per_hour": (4.0, 10.0)},
    "flap_storm": {"flaps_per_10s": (5.0, 12.0)},
    "post_fec": {"post_fec_ber": ("log", 1e-12, 1e-9)},
    "congestion": {"intensity": (1.0, 3.0)},
}
ONSET_JITTER_S = {"hard-faults": 900, "confounders": 900, "gradual-optics": 6 * 3600}
RULES_ONLY = {"trend_min_points": 10**6, "if_min_history_ms": 10**15}  # no trend ever has enough points; no forest


# --- the cadence matrix (#23 item 5) ------------------------------------------------------------------------

OPTIC_METRICS = {"optic_rx_power_dbm", "optic_tx_power_dbm", "optic_tx_bias_amperes", "optic_temperature_celsius",
                 "optic_voltage_volts"}  # polled on the optics cadence; every other metric on the counters one
GRID = {"counters": (10, 60, 300), "optics": (60, 300, 900), "step": ("60", "counters", "optics"),
        "route": ("live", "import")}


@dataclass(frozen=True)
class Cell:
    """One cell of the matrix: poll intervals per group (s), the cycle step, the data route."""

    counters: int
    optics: int
    step: str = "60"      # "60" (seconds), "counters" or "optics": the cycle step
    route: str = "import"  # "import": history imported in batches, then a replay; "live": poll by poll, live cycles

    @property
    def base_s(self) -> int:
        """The simulator's step: every poll of either group falls on it."""
        return math.gcd(self.counters, self.optics)

    @property
    def cycle_s(self) -> int:
        return {"counters": self.counters, "optics": self.optics}.get(self.step) or int(self.step)

    def label(self) -> str:
        return f"counters={self.counters},optics={self.optics},step={self.step},route={self.route}"


def parse_cell(v: str) -> Cell:
    """`counters=300,optics=900,step=60,route=import` (step: seconds, `counters` or `optics`)."""
    kv: dict[str, str] = {}
    for part in v.split(","):
        k, sep, val = part.partition("=")
        if not sep or k.strip() not in ("counters", "optics", "step", "route"):
            raise argparse.ArgumentTypeError(f"{part!r} in --cell: expected counters=, optics=, step=, route=")
        kv[k.strip()] = val.strip()
    try:
        cell = Cell(int(kv["counters"]), int(kv["optics"]), kv.get("step", "60"), kv.get("route", "import"))
    except (KeyError, ValueError) as exc:
        raise argparse.ArgumentTypeError(f"--cell {v!r}: counters and optics are whole seconds ({exc})") from None
    if cell.route not in ("import", "live"):
        raise argparse.ArgumentTypeError(f"--cell {v!r}: route is import or live, not {cell.route!r}")
    if cell.step not in ("counters", "optics") and not cell.step.isdigit():
        raise argparse.ArgumentTypeError(f"--cell {v!r}: step is seconds, 'counters' or 'optics'")
    return cell


def grid_cells() -> list[Cell]:
    return [Cell(c, o, st, r) for c in GRID["counters"] for o in GRID["optics"] for st in GRID["step"]
            for r in GRID["route"]]


def due(frame: Any, t: float, start: float, cell: Cell) -> Any:
    """The frame as the cell's pollers would have read it at t: each group's metrics only on its cadence."""
    k = round(t - start)
    keep_opt, keep_cnt = k % cell.optics == 0, k % cell.counters == 0
    for name in list(frame.values):
        if not (keep_opt if name in OPTIC_METRICS else keep_cnt):
            del frame.values[name]
            frame.keep.pop(name, None)
    return frame


# --- scratch databases ---------------------------------------------------------------------------------------

def _db_url(server: str, name: str) -> str:
    return server.rsplit("/", 1)[0] + "/" + name


def create_db(server: str) -> tuple[str, str]:
    import psycopg

    from service.migrate import upgrade

    name = f"fw_eval_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    url = _db_url(server, name)
    upgrade(url)
    return name, url


def drop_db(server: str, name: str) -> None:
    import psycopg

    with psycopg.connect(server, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# --- scenario per seed ---------------------------------------------------------------------------------------

def seeded_scenario(suite: str, seed: int, quick: bool) -> Any:
    """The suite's scenario with this seed, jittered fault parameters and onsets (deterministic per seed)."""
    from simulator.scenarios import load_scenario, parse_duration, parse_time

    sc = load_scenario(EVAL_DIR / f"{suite}.yaml")
    rng = np.random.default_rng([seed, sum(map(ord, suite))])
    sc.seed = seed
    if sc.topology is not None:
        sc.topology = sc.topology.model_copy(update={"seed": seed})
    if quick:  # a shorter run for smoke tests: half the duration, faults kept inside it
        sc.end = "2d6h" if suite == "gradual-optics" else "11h"
    jit = ONSET_JITTER_S[suite]
    faults = []
    for f in sc.faults:
        upd: dict[str, Any] = {}
        for name, spec in JITTER.get(f.type, {}).items():
            if spec[0] == "log":
                upd[name] = float(10 ** rng.uniform(math.log10(spec[1]), math.log10(spec[2])))
            else:
                upd[name] = round(float(rng.uniform(spec[0], spec[1])), 3)
        shift = float(rng.uniform(-jit, jit))
        at = parse_time(f.at, 0.0) + shift
        if quick and suite == "gradual-optics":
            at = min(at, 1.2 * DAY)
        upd["at"] = max(at, 1800.0)
        if f.until is not None:
            upd["until"] = parse_time(f.until, 0.0) - parse_time(f.at, 0.0) + upd["at"]
        faults.append(f.model_copy(update=upd))
    sc.faults = faults
    _ = parse_duration  # (durations stay as written)
    return sc


def dac_links(inv: dict[str, Any], ports: list[tuple[str, str]]) -> None:
    """S11 is electrical: make the links of these ports 400G DAC assemblies (no optical DOM)."""
    from simulator import optics

    spec = optics.spec("400G-DAC")
    vendor, part = spec.parts[0]
    want = {f"{d}:{p}" for d, p in ports}
    ends: set[str] = set()
    for link in inv["links"]:
        if link["a"] in want or link["b"] in want:
            link["cable"] = {"type": "dac", "length_m": 2.0}
            ends |= {link["a"], link["b"]}
    for dev in inv["devices"]:
        for port in dev.get("ports", []):
            ref = f"{dev['name']}:{port['name']}"
            if ref in ends:
                port["optic"] = {"vendor": vendor, "part_number": part, "serial": f"CU{abs(hash(ref)) % 10**8:08d}",
                                 "type": spec.type, "form_factor": spec.form_factor, "lanes": spec.lanes,
                                 "thresholds": optics.thresholds_dict(spec.type)}


def low_alarm_crossing(m: Any, fault: Any) -> float | None:
    """When rx at the receiver of a tx_decline laser reaches the module's low-alarm (true power, no noise)."""
    if fault.type != "decaying_laser" or fault.mode != "tx_decline":
        return None
    i = int(fault._idx[0])
    p = int(m.peer[i])
    rx_nom = (m.tx_nom[i] - m.loss[p])[fault.lanes]
    need_db = float(np.min(rx_nom - m.rx_low_alarm[p]))
    return fault._t_on + need_db / fault.rate_db_per_day * DAY


# --- one (suite, seed): load, detect under each Config, collect alerts and baselines --------------------------

@dataclass
class Job:
    suite: str
    seed: int
    configs: dict[str, dict[str, Any]]
    server: str
    quick: bool = False
    cell: Cell | None = None   # None: the suite's own step for every metric and cycle (developers' default)


@dataclass
class RunResult:
    suite: str
    seed: int
    step_s: float
    start: float
    end: float
    events: list[dict[str, Any]]
    links: list[tuple[str, str, str, str]]
    alerts: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    timing: dict[str, float] = field(default_factory=dict)
    samples: int = 0
    cycle_s: float = 0.0   # the detection cycle step (0: the suite's step)


def _alerts(conn: Any) -> list[dict[str, Any]]:
    from sqlalchemy import text

    rows = conn.execute(text(
        "SELECT e.at_ms, e.event, e.detail, a.kind, a.device, a.port, a.peer_device, a.peer_port, a.cause, "
        "a.severity, a.members, a.fingerprint FROM alert_events e JOIN alerts a ON a.id = e.alert_id "
        "WHERE e.event IN ('opened', 'reopened') ORDER BY e.at_ms, e.id")).all()
    out = []
    for at, ev, detail, kind, dev, port, pdev, pport, cause, sev, members, fp in rows:
        out.append({"at": at / 1000.0, "event": ev, "kind": kind, "device": dev, "port": port, "peer_device": pdev,
                    "peer_port": pport, "cause": cause, "severity": (detail or {}).get("severity", sev),
                    "members": list(members or []), "fingerprint": fp})
    return out


def static_dom_alerts(conn: Any, step_s: float, clear: int = 3) -> list[dict[str, Any]]:
    """Baseline: a port alerts when any lane's rx reading is below its module's low-warning; one alert per
    episode, closed after `clear` consecutive polls without it (the detector's clear delay)."""
    from sqlalchemy import text

    rows = conn.execute(text(
        "SELECT d.name, p.name, (extract(epoch FROM s.ts))::float8, "
        "bool_or(s.value < (o.thresholds->'rx_power_dbm'->>'low_warning')::float8) "
        "FROM samples s JOIN series r ON r.id = s.series_id JOIN ports p ON p.id = r.port_id "
        "JOIN devices d ON d.id = p.device_id JOIN optics o ON o.port_id = p.id "
        "WHERE r.metric = 'optic_rx_power_dbm' AND s.value = s.value "
        "GROUP BY d.name, p.name, 3 ORDER BY 1, 2, 3")).all()
    out: list[dict[str, Any]] = []
    state: dict[tuple[str, str], tuple[bool, int]] = {}
    for dev, port, ts, low in rows:
        is_open, ok = state.get((dev, port), (False, 0))
        if low:
            if not is_open:
                out.append({"at": ts + CYCLE_AFTER_POLL_S, "event": "opened", "kind": "static_dom", "device": dev,
                            "port": port,
                            "peer_device": None, "peer_port": None, "cause": "static_dom", "severity": "ticket",
                            "members": [], "fingerprint": f"static/{dev}:{port}"})
            state[(dev, port)] = (True, 0)
        elif is_open:
            state[(dev, port)] = (ok + 1 < clear, ok + 1)
    return out


def cfg_day_limit(cfg: Any) -> float:
    """Shortest run (s) in which trends or the forest can fire at all."""
    return min(cfg.trend_min_points * cfg.trend_bucket_ms, cfg.if_min_history_ms) / 1000.0


def run_job(job: Job) -> RunResult:
    from sqlalchemy import text
    from sqlalchemy.orm import Session

    from service.db import dispose_engines, get_engine
    from service.detection.service import backtest
    from service.detection.state import Config
    from service.inventory.schemas import Inventory
    from service.inventory.service import upsert_inventory
    from service.pipeline import apply_cycle, run_cycle
    from service.telemetry.service import import_prometheus
    from simulator.generate import BlockText, write_frame
    from simulator.scenarios import parse_duration, parse_time
    from simulator.telemetry import make_sim, resolve_inventory, timeline

    sc = seeded_scenario(job.suite, job.seed, job.quick)
    step = parse_duration(sc.step)
    sim_step, cycle_step = (step, step) if job.cell is None else (job.cell.base_s, job.cell.cycle_s)
    start = T0
    end = parse_time(sc.end, T0)
    inv = resolve_inventory(sc.inventory_source())
    dac_links(inv, [(f.device, f.port) for f in sc.faults if f.type == "post_fec"])
    name, url = create_db(job.server)
    timing: dict[str, float] = {}
    try:
        engine = get_engine(url)
        with Session(engine) as s:
            upsert_inventory(session=s, inventory=Inventory.model_validate(inv))
            s.commit()
        sim = make_sim(inv, sc, start)
        texts = {b.metric: BlockText(b, sim.m) for b in sim.blocks}
        clock = time.perf_counter()
        n_samples = 0
        buf = io.StringIO()
        # small import batches, as a collector would push them: the import writes a batch grouped by series,
        # so one huge batch leaves samples(ts) unordered on disk and the BRIN index that detection's time-range
        # read relies on becomes useless (every cycle then scans the whole day partition)
        chunk_steps = 10
        # route=live: each poll is imported as it comes and live cycles (run_cycle: state saved and loaded every
        # cycle, alerts in the same transaction) run at the cell's step between the polls
        live = job.cell is not None and job.cell.route == "live"
        after = int(CYCLE_AFTER_POLL_S * 1000)
        # a cycle right after each poll (CYCLE_AFTER_POLL_S), from the first poll to the last
        first = int((start + cycle_step) * 1000) + after
        last = int(end * 1000) + after
        live_cfg, next_cycle = Config(**job.configs["detector"]), first
        for k, t in enumerate(timeline(start, end, sim_step), 1):
            frame = sim.step(t, sim_step)
            n_samples += write_frame(sim, texts, frame if job.cell is None else due(frame, t, start, job.cell), buf)
            if live or k % chunk_steps == 0:
                import_prometheus(engine=engine, chunks=[buf.getvalue().encode()], source=f"{job.suite}-{job.seed}")
                buf = io.StringIO()
            # every cycle that runs before the next poll arrives (it reads ts <= cycle - lateness < next poll)
            while live and next_cycle <= min(last, int((t + sim_step) * 1000) + after - 2000):
                run_cycle(engine, next_cycle, name="eval", config=live_cfg)
                next_cycle += int(cycle_step * 1000)
        if buf.tell():
            import_prometheus(engine=engine, chunks=[buf.getvalue().encode()], source=f"{job.suite}-{job.seed}")
        with engine.begin() as c:
            c.execute(text("ANALYZE samples"))
        timing["generate_import_s"] = time.perf_counter() - clock
        events = sc.ground_truth(sim.m)
        for ev, f in zip(events, sc.faults, strict=True):
            ev["low_alarm_unix"] = low_alarm_crossing(sim.m, f)
        links = [(sim.m.port_dev_name[i], sim.m.port_name[i], sim.m.port_dev_name[int(sim.m.peer[i])],
                  sim.m.port_name[int(sim.m.peer[i])]) for i in range(0, sim.m.P, 2)]
        # "polls" in the scores count counter polls (hard faults) in a cell
        res = RunResult(job.suite, job.seed, step if job.cell is None else job.cell.counters, start, end, events,
                        links, timing=timing, samples=n_samples, cycle_s=cycle_step)
        if live:
            with engine.connect() as conn:
                res.alerts["detector"] = _alerts(conn)
        for label, overrides in job.configs.items():
            if live:
                break
            if label == "rules-only" and end - start <= cfg_day_limit(Config(**job.configs["detector"])):
                # trends need trend_min_points buckets and the forest a day of history: in a run this short
                # both are off anyway, so rules-only is the detector itself (not run twice)
                res.alerts[label] = res.alerts["detector"]
                continue
            cfg = Config(**overrides)
            with engine.begin() as c:
                c.execute(text("TRUNCATE alerts, alert_events, webhook_outbox RESTART IDENTITY CASCADE"))
            clock = time.perf_counter()
            with engine.connect() as conn:
                def cycle(at_ms: int, findings: list, conn: Any = conn) -> None:
                    with conn.begin():
                        apply_cycle(conn, findings, at_ms, drains=False)

                backtest(engine, first, last, int(cycle_step * 1000), config=cfg, on_cycle=cycle)
                res.alerts[label] = _alerts(conn)
            timing[f"detect_{label}_s"] = time.perf_counter() - clock
        with engine.connect() as conn:
            res.alerts["static-dom"] = static_dom_alerts(conn, step)
        dispose_engines()
        return res
    finally:
        dispose_engines()
        drop_db(job.server, name)


# --- scoring ---------------------------------------------------------------------------------------------------

def _entities(ev: dict[str, Any]) -> tuple[set[tuple[str, str | None]], set[str]]:
    """(ports at either end of every affected link, devices) an alert may name for this event."""
    ports: set[tuple[str, str | None]] = set()
    for ref in ev["ports"]:
        d, p = ref.split(":", 1)
        ports.add((d, p))
    if ev.get("peer"):
        d, p = ev["peer"].split(":", 1)
        ports.add((d, p))
    return ports, {ev["device"]}


def _peers_of(links: list[tuple[str, str, str, str]]) -> dict[tuple[str, str], tuple[str, str]]:
    out = {}
    for a, ap, b, bp in links:
        out[(a, ap)], out[(b, bp)] = (b, bp), (a, ap)
    return out


def _match(alert: dict[str, Any], ports: set[tuple[str, str | None]], devices: set[str]) -> bool:
    names = {(alert["device"], alert["port"]), (alert["peer_device"], alert["peer_port"])}
    names |= {(alert["device"], m) for m in alert["members"]}
    if names & ports:
        return True
    return alert["port"] is None and alert["device"] in devices


def _class_of(alert: dict[str, Any]) -> str:
    return PRED_CLASS.get(alert["cause"], "physical-other")


def _scored(alert: dict[str, Any]) -> bool:
    """Alerts that page or ticket someone; INFO (congestion labels, forest outliers) is not an alarm."""
    return alert["severity"] in ("ticket", "page")


@dataclass
class Score:
    """Event-level outcome of one detector on one run."""

    events: list[dict[str, Any]] = field(default_factory=list)   # per event: scenario, detected, delay, class, ...
    fp: list[dict[str, Any]] = field(default_factory=list)        # background false alarms
    conf_fa: list[dict[str, Any]] = field(default_factory=list)   # ticket/page alerts during confounders
    conf_phys_info: int = 0                                       # INFO physical (forest) alerts during confounders
    fragments: int = 0
    clean_link_days: float = 0.0
    conf_link_days: float = 0.0


def read_by(res: RunResult, t: float) -> float:
    """The first cycle (they run CYCLE_AFTER_POLL_S after each multiple of the step) that reads data up to t.

    A 15-minute cycle cannot alert within 10 min of an onset early in its interval, whatever the detector: the
    tolerance ends at the cycle that has read the tolerance's data (at 60 s cycles, < 1 min later)."""
    step = res.cycle_s or res.step_s
    k = math.ceil((t - (CYCLE_AFTER_POLL_S - LATENESS_S) - res.start) / step - 1e-9)
    return res.start + max(k, 1) * step + CYCLE_AFTER_POLL_S


def score_run(res: RunResult, alerts: list[dict[str, Any]]) -> Score:
    sc = Score()
    peers = _peers_of(res.links)
    evs = []
    for ev in res.events:
        ports, devs = _entities(ev)
        if ev["scenario"] in ("S10", "S9", "S7", "S12") or ev["end"] == "host":
            # device/host-level events: every linked port of the device, and the far ends
            for (a, ap), (b, bp) in peers.items():
                if a == ev["device"]:
                    ports |= {(a, ap), (b, bp)}
        if ev["scenario"] == "S6":
            devs |= {d for d, _ in ports}  # the line card's far ends may raise their own device finding
            # (only the line card's own ports and their far ends: other ports of the switch are not in it)
        on = ev["onset_unix"]
        until = ev["until_unix"] if ev.get("until_unix") else (ev["hard_failure_unix"] or res.end)
        if ev["scenario"] == "S5" and ev["params"].get("ends") == "down":
            until = res.end
        tol_end = on + TOLERANCE_S.get(ev["scenario"], 0)
        if ev["scenario"] != "S2":  # a detector alerts at its cycles: the one that reads the data at tol_end counts
            tol_end = read_by(res, tol_end)
        if ev["scenario"] == "S2":
            tol_end = min(ev["hard_failure_unix"] or res.end, res.end)
        evs.append({"ev": ev, "ports": ports, "devs": devs, "on": on, "until": min(until, res.end),
                    "tol_end": tol_end, "hits": []})
    faulty_links: set[tuple[str, str]] = set()
    for e in evs:
        faulty_links |= {p for p in e["ports"] if p[1] is not None}
    link_days = (res.end - res.start) / DAY
    n_links = len(res.links)
    n_faulty = sum(1 for a, ap, b, bp in res.links if (a, ap) in faulty_links or (b, bp) in faulty_links)
    sc.clean_link_days = (n_links - n_faulty) * link_days
    for e in evs:
        if not e["ev"]["alert_expected"]:
            n = sum(1 for a, ap, b, bp in res.links if (a, ap) in e["ports"] or (b, bp) in e["ports"])
            sc.conf_link_days += n * (e["until"] - e["on"] + FRAGMENT_GRACE_S) / DAY
    for al in alerts:
        t = al["at"]
        placed = False
        for e in evs:  # first: the TP window of an expected event still waiting for its TP
            if e["ev"]["alert_expected"] and _scored(al) and not any(h["at"] <= e["tol_end"] for h in e["hits"]) \
                    and e["on"] <= t <= e["tol_end"] and _match(al, e["ports"], e["devs"]):
                e["hits"].append(al)
                placed = True
                break
        if placed:
            continue
        for e in evs:  # then: a fragment of an expected event
            if e["ev"]["alert_expected"] and _match(al, e["ports"], e["devs"]) and \
                    e["on"] <= t <= max(e["tol_end"], e["until"] + FRAGMENT_GRACE_S):
                if _scored(al):
                    e["hits"].append(al)
                placed = True
                break
        if placed:
            continue
        for e in evs:  # during a confounder, on its entities
            if not e["ev"]["alert_expected"] and _match(al, e["ports"], e["devs"]) and \
                    e["on"] <= t <= e["until"] + FRAGMENT_GRACE_S:
                cls = _class_of(al)
                if _scored(al):
                    sc.conf_fa.append({**al, "scenario": e["ev"]["scenario"], "class": cls})
                elif cls not in NON_PHYSICAL:
                    sc.conf_phys_info += 1
                e["hits"].append(al)
                placed = True
                break
        if not placed and _scored(al):
            sc.fp.append(al)
    for e in evs:
        ev = e["ev"]
        truth = TRUTH_CLASS.get(ev["cause"], ev["cause"])
        row: dict[str, Any] = {"run": f"{res.suite}/{res.seed}", "id": ev["id"], "scenario": ev["scenario"],
                               "type": ev["type"], "truth": truth, "expected": ev["alert_expected"]}
        if ev["scenario"] == "S2":
            row["scenario"] = f"S2-{ev['params'].get('mode', 'tx_decline')}"
        if ev["alert_expected"]:
            tps = [a for a in e["hits"] if a["at"] <= e["tol_end"]]
            row["detected"] = bool(tps)
            if tps:
                first = tps[0]
                row["delay_s"] = first["at"] - e["on"]
                # polls consumed: from the first poll after onset to the poll the alerting cycle read (cycles run
                # CYCLE_AFTER_POLL_S after it), counting both; 1 = alerted on the first poll that could show it
                first_poll = res.start + math.ceil((e["on"] - res.start) / res.step_s - 1e-9) * res.step_s
                read_poll = res.start + math.floor((first["at"] - CYCLE_AFTER_POLL_S - res.start) / res.step_s + 1e-9) \
                    * res.step_s
                row["delay_polls"] = int(round((read_poll - first_poll) / res.step_s)) + 1
                row["pred"] = _class_of(first)
                row["severity"] = first["severity"]
                row["reopens"] = sum(1 for a in e["hits"] if a["event"] == "reopened")
                sc.fragments += len(e["hits"]) - 1
                fail = [x for x in (ev.get("hard_failure_unix"), ev.get("low_alarm_unix")) if x]
                if ev["scenario"] == "S2" and fail:
                    row["lead_h"] = (min(fail) - first["at"]) / 3600
            else:
                row["pred"] = "missed"
                sc.fragments += len(e["hits"])
        else:
            phys = [a for a in e["hits"] if _class_of(a) not in NON_PHYSICAL]
            cong = [a for a in e["hits"] if _class_of(a) == "congestion"]
            row["pred"] = _class_of(phys[0]) if phys else "congestion" if cong else "none"
            row["phys_alerts"] = len(phys)
        sc.events.append(row)
    return sc


def random_alerts(res: RunResult, like: list[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    """The random-score floor: as many scored alerts as `like`, at uniform times on uniform link ends,
    with causes drawn from `like`'s cause mix."""
    rng = np.random.default_rng([seed, 0xACE])
    scored = [a for a in like if _scored(a)]
    ends = [(a, ap, b, bp) for a, ap, b, bp in res.links] + [(b, bp, a, ap) for a, ap, b, bp in res.links]
    out = []
    for k in range(len(scored)):
        d, p, pd, pp = ends[int(rng.integers(len(ends)))]
        src = scored[int(rng.integers(len(scored)))]
        out.append({"at": float(rng.uniform(res.start + res.step_s, res.end)), "event": "opened", "kind": "random",
                    "device": d, "port": p, "peer_device": pd, "peer_port": pp, "cause": src["cause"],
                    "severity": src["severity"], "members": [], "fingerprint": f"random/{k}"})
    return sorted(out, key=lambda a: a["at"])


# --- aggregation -----------------------------------------------------------------------------------------------

def prf(rows: list[dict[str, Any]], n_fp: int) -> tuple[float, float, float]:
    """Event-level P/R/F1: precision over TPs and false alarms (fragments are neither)."""
    tp = sum(1 for r in rows if r.get("detected"))
    fn = sum(1 for r in rows if not r.get("detected"))
    p = tp / (tp + n_fp) if tp + n_fp else float("nan")
    r = tp / (tp + fn) if tp + fn else float("nan")
    f1 = 2 * p * r / (p + r) if p + r and not (math.isnan(p) or math.isnan(r)) else 0.0
    return p, r, f1


def ci95(xs: list[float]) -> tuple[float, float]:
    """Mean and half-width of a t-based 95 % interval over seeds."""
    xs = [x for x in xs if not math.isnan(x)]
    if not xs:
        return float("nan"), float("nan")
    t = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}
    m = float(np.mean(xs))
    if len(xs) < 2:
        return m, float("nan")
    return m, t.get(len(xs) - 1, 2.0) * float(np.std(xs, ddof=1)) / math.sqrt(len(xs))


def _fp_scenario(al: dict[str, Any], run_rows: list[dict[str, Any]]) -> str:
    return {"flap/seating": "S4", "flap-storm": "S5", "shared-component": "S6", "nic-stall": "S9", "host": "S10",
            "post-fec": "S11", "contamination": "S1", "fiber": "S3", "tx-wearout": "S2"}.get(_class_of(al), "other")


def summarize(label: str, scores: dict[tuple[str, int], Score], seeds: list[int]) -> dict[str, Any]:
    """Per-scenario and overall figures for one detector over the scoring seeds."""
    rows = [r for s in scores.values() for r in s.events]
    out: dict[str, Any] = {"label": label, "scenarios": {}, "groups": {}}
    scen = sorted({r["scenario"] for r in rows if r["expected"]})
    # false alarms are charged to the scenario whose cause they claim (precision per scenario)
    fp_by: Counter[str] = Counter()
    for s in scores.values():
        for al in s.fp:
            fp_by[_fp_scenario(al, s.events)] += 1
    for name in scen:
        rs = [r for r in rows if r["scenario"] == name]
        base = name.split("-")[0]
        p, r, f1 = prf(rs, fp_by.get(base, 0) if name == base or not name.startswith("S2") else 0)
        delays = [r["delay_s"] for r in rs if r.get("detected")]
        leads = [r["lead_h"] for r in rs if "lead_h" in r]
        out["scenarios"][name] = {
            "n": len(rs), "tp": sum(1 for r in rs if r.get("detected")), "p": p, "r": r, "f1": f1,
            "delay_med_s": float(np.median(delays)) if delays else float("nan"),
            "delay_p90_s": float(np.percentile(delays, 90)) if delays else float("nan"),
            "polls_med": float(np.median([r["delay_polls"] for r in rs if r.get("detected")])) if delays
            else float("nan"),
            "within2": sum(1 for r in rs if r.get("detected") and r["delay_polls"] <= 2),
            "lead_med_h": float(np.median(leads)) if leads else float("nan"),
            "lead_ge24": (sum(1 for x in leads if x >= 24) / len(rs)) if name.startswith("S2") else float("nan"),
            "fragments": 0}
    for grp, members in (("hard", HARD), ("gradual", GRADUAL), ("all", tuple(s.split("-")[0] for s in scen))):
        per_seed = []
        for seed in seeds:
            rs = [r for (su, sd), s in scores.items() if sd == seed for r in s.events
                  if r["expected"] and r["scenario"].split("-")[0] in members]
            fps = sum(1 for (su, sd), s in scores.items() if sd == seed for al in s.fp
                      if _fp_scenario(al, []) in members or (grp == "all"))
            per_seed.append(prf(rs, fps)[2])
        rs = [r for r in rows if r["expected"] and r["scenario"].split("-")[0] in members]
        fps = sum(v for k, v in fp_by.items() if k in members or grp == "all")
        p, r, f1 = prf(rs, fps)
        m, h = ci95(per_seed)
        out["groups"][grp] = {"p": p, "r": r, "f1": f1, "f1_seed_mean": m, "f1_ci95": h, "fp": fps}
    # hard faults within 2 poll intervals
    hard = [r for r in rows if r["scenario"] in HARD]
    fast = [dict(r, detected=r.get("detected") and r["delay_polls"] <= 2) for r in hard]
    out["hard_2poll"] = prf(fast, out["groups"]["hard"]["fp"])
    # false alarms per 1,000 link-days
    clean_days = sum(s.clean_link_days for s in scores.values())
    conf_days = sum(s.conf_link_days for s in scores.values())
    sev = Counter(al["severity"] for s in scores.values() for al in s.fp)
    csev = Counter(al["severity"] for s in scores.values() for al in s.conf_fa)
    out["fa"] = {"clean_link_days": clean_days, "conf_link_days": conf_days,
                 "clean_page": sev["page"], "clean_ticket": sev["ticket"],
                 "conf_page": csev["page"], "conf_ticket": csev["ticket"],
                 "conf_physical": sum(1 for s in scores.values() for al in s.conf_fa
                                      if al["class"] not in NON_PHYSICAL),
                 "conf_physical_info": sum(s.conf_phys_info for s in scores.values()),
                 "by_conf": Counter(al["scenario"] for s in scores.values() for al in s.conf_fa),
                 "fp_kinds": Counter(f"{al['kind']}:{al['cause']}" for s in scores.values() for al in s.fp)}
    # attribution
    conf = Counter((r["truth"], r["pred"]) for r in rows)
    out["confusion"] = conf
    pc = [r for r in rows if r["truth"] not in ("none", "nic-stall", "host") and
          (r["pred"] != "missed")]
    ok = sum(1 for r in pc if (r["truth"] in NON_PHYSICAL) == (r["pred"] in NON_PHYSICAL))
    out["phys_vs_cong"] = (ok / len(pc) if pc else float("nan"), ok, len(pc))
    det = [r for r in rows if r["expected"] and r["pred"] != "missed"]
    out["cause_acc"] = (sum(1 for r in det if r["pred"] == r["truth"]) / len(det)) if det else float("nan")
    out["macro_f1"] = macro_f1([r for r in rows if r["pred"] != "missed"])
    out["fragments"] = sum(s.fragments for s in scores.values())
    return out


def macro_f1(rows: list[dict[str, Any]]) -> float:
    classes = sorted({r["truth"] for r in rows} - {"none"})
    f1s = []
    for c in classes:
        tp = sum(1 for r in rows if r["truth"] == c and r["pred"] == c)
        fp = sum(1 for r in rows if r["truth"] != c and r["pred"] == c)
        fn = sum(1 for r in rows if r["truth"] == c and r["pred"] != c)
        f1s.append(2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0)
    return float(np.mean(f1s)) if f1s else float("nan")


# --- printing --------------------------------------------------------------------------------------------------

def _f(x: float, nd: int = 2) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def _dur(s: float) -> str:
    if s is None or math.isnan(s):
        return "-"
    return f"{s / 60:.0f} min" if s < 3 * 3600 else f"{s / 3600:.1f} h"


def report(summaries: list[dict[str, Any]]) -> str:
    lines: list[str] = []
    main = summaries[0]
    lines.append(f"### Per scenario: {main['label']}\n")
    lines.append("| scenario | events | TP | precision | recall | F1 | delay median | delay p90 | polls median | "
                 "TP within 2 polls | lead median | lead >= 24 h |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, s in main["scenarios"].items():
        lines.append(f"| {name} | {s['n']} | {s['tp']} | {_f(s['p'])} | {_f(s['r'])} | {_f(s['f1'])} | "
                     f"{_dur(s['delay_med_s'])} | {_dur(s['delay_p90_s'])} | {_f(s['polls_med'], 0)} | "
                     f"{s['within2']} | "
                     f"{_f(s['lead_med_h'], 0) + ' h' if not math.isnan(s['lead_med_h']) else '-'} | "
                     f"{_f(s['lead_ge24'])} |")
    lines.append("")
    lines.append("### Detectors compared\n")
    lines.append("| detector | hard F1 (seed mean +- 95 % CI) | hard F1 <= 2 polls | gradual F1 (mean +- CI) | "
                 "overall P / R / F1 | phys-vs-congestion | cause accuracy | macro-F1 | FA clean page/ticket per "
                 "1k link-days | confounder physical alerts (page+ticket / info) | fragments |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for s in summaries:
        g = s["groups"]
        fa = s["fa"]
        k = 1000 / fa["clean_link_days"] if fa["clean_link_days"] else float("nan")
        pvc = s["phys_vs_cong"]
        lines.append(
            f"| {s['label']} | {_f(g['hard']['f1'])} ({_f(g['hard']['f1_seed_mean'])} +- {_f(g['hard']['f1_ci95'])})"
            f" | {_f(s['hard_2poll'][2])} | {_f(g['gradual']['f1'])} ({_f(g['gradual']['f1_seed_mean'])} +- "
            f"{_f(g['gradual']['f1_ci95'])}) | {_f(g['all']['p'])} / {_f(g['all']['r'])} / {_f(g['all']['f1'])} | "
            f"{_f(pvc[0], 3)} ({pvc[1]}/{pvc[2]}) | {_f(s['cause_acc'])} | {_f(s['macro_f1'])} | "
            f"{_f(fa['clean_page'] * k, 1)} / {_f(fa['clean_ticket'] * k, 1)} | "
            f"{fa['conf_physical']} / {fa['conf_physical_info']} | {s['fragments']} |")
    lines.append("")
    fa = main["fa"]
    lines.append(f"False alarms ({main['label']}): {fa['clean_page']} page + {fa['clean_ticket']} ticket on "
                 f"{fa['clean_link_days']:.0f} fault-free link-days; during confounders ({fa['conf_link_days']:.1f} "
                 f"link-days): {fa['conf_page']} page + {fa['conf_ticket']} ticket "
                 f"({dict(fa['by_conf']) or 'none'}); false-alarm kinds: {dict(fa['fp_kinds']) or 'none'}.\n")
    lines.append(f"### Attribution confusion matrix: {main['label']} (rows: truth, columns: first alert's cause)\n")
    cols = [c for c in CLASSES if any(k[1] == c for k in main["confusion"])]
    rows_ = [c for c in CLASSES if any(k[0] == c for k in main["confusion"])]
    lines.append("| truth \\ predicted | " + " | ".join(cols) + " |")
    lines.append("|---|" + "---|" * len(cols))
    for r in rows_:
        lines.append(f"| {r} | " + " | ".join(str(main["confusion"].get((r, c), 0) or ".") for c in cols) + " |")
    lines.append("")
    return "\n".join(lines)


def goals(s: dict[str, Any]) -> list[str]:
    g = s["groups"]
    hard_delay = [x for k, x in s["scenarios"].items() if k in HARD]
    s2 = [x for k, x in s["scenarios"].items() if k.startswith("S2")]
    lead_ok = (sum(x["lead_ge24"] * x["n"] for x in s2) / sum(x["n"] for x in s2)) if s2 else float("nan")
    out = [
        f"hard faults F1 >= 0.95 within 2 poll intervals: {_f(s['hard_2poll'][2])} "
        f"({'met' if s['hard_2poll'][2] >= 0.95 else 'NOT met'}; F1 at the scenario tolerance {_f(g['hard']['f1'])}, "
        f"p90 delays {', '.join(_dur(x['delay_p90_s']) for x in hard_delay)})",
        f"gradual optics F1 >= 0.90: {_f(g['gradual']['f1'])} ({'met' if g['gradual']['f1'] >= 0.90 else 'NOT met'})",
        f"S2 lead >= 24 h in >= 80 % of events: {_f(lead_ok)} ({'met' if lead_ok >= 0.8 else 'NOT met'})",
        f"congestion and artefacts, 0 physical alerts: {s['fa']['conf_physical']} page/ticket, "
        f"{s['fa']['conf_physical_info']} INFO ({'met' if s['fa']['conf_physical'] == 0 else 'NOT met'})",
        f"physical-vs-congestion attribution >= 0.97: {_f(s['phys_vs_cong'][0], 3)} "
        f"({'met' if s['phys_vs_cong'][0] >= 0.97 else 'NOT met'})",
    ]
    return out


# --- main ------------------------------------------------------------------------------------------------------

def _parse_set(items: list[str]) -> dict[str, Any]:
    from service.detection.state import Config

    types = {f.name: f.type for f in fields(Config)}
    out: dict[str, Any] = {}
    for item in items:
        k, v = item.split("=", 1)
        if k not in types:
            raise SystemExit(f"unknown Config field {k!r}")
        out[k] = float(v) if "float" in str(types[k]) else int(float(v))
    return out


def run_all(seeds: list[int], configs: dict[str, dict[str, Any]], server: str, quick: bool, workers: int,
            suites: tuple[str, ...] = SUITES, cell: Cell | None = None) -> list[RunResult]:
    jobs = [Job(s, seed, configs, server, quick, cell) for seed in seeds for s in suites]
    jobs.sort(key=lambda j: j.suite != "gradual-optics")  # longest first
    if workers <= 1:
        return [run_job(j) for j in jobs]
    with mp.get_context("spawn").Pool(workers) as pool:
        return pool.map(run_job, jobs, chunksize=1)


def cell_rows(cell: Cell | None, results: list[RunResult], seeds: list[int]) -> list[str]:
    """One markdown row per suite for a cell: F1, delay, lead, cause accuracy, confounder physical alerts,
    reopens per detected event, and the events missed, mis-attributed or reopened more than once (the defects)."""
    out = []
    for suite in sorted({r.suite for r in results}):
        scores = {(r.suite, r.seed): score_run(r, r.alerts["detector"]) for r in results if r.suite == suite}
        s = summarize("detector", scores, seeds)
        rows = [x for sc in scores.values() for x in sc.events if x["expected"]]
        grp = "gradual" if suite == "gradual-optics" else "hard" if suite == "hard-faults" else "all"
        det = [x for x in rows if x.get("detected")]
        delays = [x["delay_s"] for x in det]
        leads = [x["lead_h"] for x in rows if "lead_h" in x]
        s2 = [x for x in rows if x["scenario"].startswith("S2")]
        bad = [f"{x['run']} {x['id']} ({x['scenario']}): {x['pred']}" for x in rows
               if not x.get("detected") or x["pred"] != x["truth"]]
        # the goal is per event (#23 item 7: at most 1 reopen), which the column's mean can hide
        bad += [f"{x['run']} {x['id']} ({x['scenario']}): {x['reopens']} reopens (goal <= 1)" for x in det
                if x.get("reopens", 0) > 1]
        f1 = s["groups"][grp]["f1"] if rows else float("nan")
        delay = float(np.median(delays)) if delays else float("nan")
        out.append(
            f"| {cell.label() if cell else 'default (suite step for polls and cycles)'} | {suite} | {len(rows)} | "
            f"{sum(1 for x in rows if x.get('detected'))} | {_f(f1)} | {_dur(delay)} | "
            f"{(_f(float(np.median(leads)), 0) + ' h') if leads else '-'} | "
            f"{(str(sum(1 for x in leads if x >= 24)) + '/' + str(len(s2))) if s2 else '-'} | {_f(s['cause_acc'])} | "
            f"{s['fa']['conf_physical']} | {s['fa']['clean_page'] + s['fa']['clean_ticket']} | "
            f"{_f(sum(x.get('reopens', 0) for x in det) / len(det) if det else float('nan'))} | "
            f"{'; '.join(bad) or 'none'} |")
    return out


CELL_HEAD = ("| cell | suite | events | TP | F1 | delay median | lead median | lead >= 24 h | cause accuracy | "
             "confounder physical alerts | false alarms | reopens per detected event | missed or wrong cause |\n"
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def machine() -> str:
    date = subprocess.run(["date", "-u"], capture_output=True, text=True).stdout.strip()
    return f"{date}; nproc {os.cpu_count()}; {' '.join(platform.uname())}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5], help="scoring seeds")
    ap.add_argument("--tune-seeds", type=int, nargs="*", default=[], help="also report these (tuning) seeds")
    ap.add_argument("--quick", action="store_true", help="shorter runs (smoke test), 2 seeds unless given")
    ap.add_argument("--server", default=os.environ.get("FW_EVAL_SERVER", "postgresql://postgres@127.0.0.1:5432/postgres"))
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE",
                    help="Config overrides for the detector under test (e.g. tuned values)")
    ap.add_argument("--suites", nargs="+", choices=SUITES, default=list(SUITES),
                    help="run only these suites (iterating on one scenario group; goals need all three)")
    ap.add_argument("--no-rules-only", action="store_true", help="skip the rules-only baseline run")
    ap.add_argument("--cell", type=parse_cell, action="append", default=[],
                    help="run one cadence cell (repeatable), e.g. counters=300,optics=900,step=60,route=import; "
                         "step is seconds, 'counters' or 'optics'")
    ap.add_argument("--grid", action="store_true", help="run every cell of the cadence matrix (hours on 2 cores)")
    ap.add_argument("--json", type=Path, help="write the raw per-event rows here")
    ap.add_argument("--pickle", type=Path, help="keep the raw runs (alerts, truth) for re-scoring")
    ap.add_argument("--rescore", type=Path, help="re-score runs kept with --pickle (same path) instead of running")
    a = ap.parse_args(argv)
    if a.quick and a.seeds == [1, 2, 3, 4, 5]:
        a.seeds = [1, 2]
    tuned = _parse_set(a.set)
    configs = {"detector": tuned}
    if not a.no_rules_only:
        configs["rules-only"] = {**tuned, **RULES_ONLY}
    print(f"machine: {machine()}")
    print(f"scoring seeds {a.seeds}; tuning seeds {a.tune_seeds}; Config overrides {tuned or 'none (defaults)'}; "
          f"suites {', '.join(a.suites)}; quick={a.quick}")
    clock = time.perf_counter()
    cells = grid_cells() if a.grid else a.cell
    if cells:  # the cadence matrix: the detector only (no baselines), one row per cell and suite
        print(CELL_HEAD)
        for cell in cells:
            kept = a.pickle or a.rescore
            path = kept.with_suffix(".cell-" + cell.label().replace(",", "-").replace("=", "") + ".pkl") \
                if kept else None
            if a.rescore and path is not None:  # score the runs kept with --pickle again
                import pickle

                results = pickle.loads(path.read_bytes())
            else:
                results = run_all(a.seeds, {"detector": tuned}, a.server, a.quick, a.workers, tuple(a.suites), cell)
                if a.pickle and path is not None:
                    import pickle

                    path.write_bytes(pickle.dumps(results))
            for row in cell_rows(cell, results, a.seeds):
                print(row, flush=True)
        print(f"\ntotal wall time {time.perf_counter() - clock:.0f} s")
        return 0
    for title, seeds in (("tuning", a.tune_seeds), ("scoring", a.seeds)):
        if not seeds:
            continue
        if a.rescore:  # score stored runs again (scoring changes) without simulating and detecting again
            import pickle

            results = pickle.loads(a.rescore.with_suffix(f".{title}.pkl").read_bytes())
        else:
            results = run_all(seeds, configs, a.server, a.quick, a.workers, tuple(a.suites))
        samples = sum(r.samples for r in results)
        tim = defaultdict(float)
        for r in results:
            for k, v in r.timing.items():
                tim[k] += v
        print(f"\n## {title} seeds {seeds}: {len(results)} runs, {samples:,} samples imported; "
              + ", ".join(f"{k} {v:.0f} s" for k, v in tim.items()))
        by = {lab: {(r.suite, r.seed): score_run(r, r.alerts[lab]) for r in results} for lab in results[0].alerts}
        by["random"] = {(r.suite, r.seed): score_run(r, random_alerts(r, r.alerts["detector"], r.seed))
                        for r in results}
        order = ["detector", "rules-only", "static-dom", "random"]
        sums = [summarize(lab, by[lab], seeds) for lab in order if lab in by]
        print(report(sums))
        print("Goals (" + title + " seeds):")
        for line in goals(sums[0]):
            print(" - " + line)
        missed = [r for r in (x for s in by["detector"].values() for x in s.events)
                  if r["expected"] and not r.get("detected")]
        print(f"missed events: {[(r['run'], r['id']) for r in missed] or 'none'}")
        fps = [(k, al["at"] - r0.start, al["kind"], al["device"], al["port"], al["cause"], al["severity"])
               for r0 in results for k, s in [((r0.suite, r0.seed), by["detector"][(r0.suite, r0.seed)])]
               for al in s.fp]
        print(f"false alarms (run, t from start s, kind, device, port, cause, severity): {fps or 'none'}")
        confa = [(k, al["kind"], al["device"], al["port"], al["cause"], al["severity"], al["scenario"])
                 for k, s in by["detector"].items() for al in s.conf_fa]
        print(f"alerts during confounders: {confa or 'none'}")
        if a.pickle and not a.rescore:
            import pickle

            a.pickle.with_suffix(f".{title}.pkl").write_bytes(pickle.dumps(results))
        if a.json:
            a.json.write_text(json.dumps({lab: [x for s in sc.values() for x in s.events] for lab, sc in by.items()},
                                         default=str, indent=1))
    print(f"\ntotal wall time {time.perf_counter() - clock:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
