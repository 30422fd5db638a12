"""One detection cycle over a synthetic 100k-GPU fabric (~300k ports), arrays in memory, no database.

Shape: 12,500 hosts x 8 NICs (400G DR4, 4 lanes) to 32-port-down leaves; 16 uplinks per leaf at 800G
(DR8, 8 lanes) to spines, both ends counted: ~300k ports. Every metric detection uses gets one sample
per entity per cycle, a few hundred ports carry faults, cohort forests are trained once beforehand
(timed apart).

    .venv/bin/python bench/detection_scale.py [--gpus 100000] [--cycles 5]

Reports: observe time, cycle time (plain and with a trend-bucket close), training time, the state's size and the
time to serialize it (a live cycle's save) and read it back (a cycle after a start), peak RSS.
Goal (detection.md brief): one cycle <= 10 s on 2 cores.

    .venv/bin/python bench/detection_scale.py --state-io postgresql://postgres@127.0.0.1:5432/postgres \
        [--gpus 6656] [--cycles 5] [--reservoir-rows 0]

The live cycle's detector-state load and save against PostgreSQL (a scratch database, dropped at the end), side
by side in one run; each cycle the same samples go to four states: `before` is read and written whole every
cycle as a plain npz (as before 2026-12-04), `whole` likewise compressed with the training reservoir in it
(as until 2026-12-06, then a deflated npz), `reload` is read whole every cycle and saved as today (what a
cycle pays after a start or a pod move), `after` is today's live cycle (store.StateCache: kept in the process,
read only when another process wrote it; the reservoir appended to). Reports wall and CPU time (this process's
and the database backend's) and the WAL written (anyone's: run it on a quiet server) of each load and save.
--gpus 6656 is 19,968 ports; --gpus 24 --reservoir-rows 65536 is a small fabric's live detector after a day,
whose state is mostly its training reservoir.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import time
from collections.abc import Iterator

import numpy as np
from sqlalchemy import Connection, text

from service.detection.engine import Engine
from service.detection.features import compute, if_matrix
from service.detection.state import AXIS, NPRIO, Config, Fabric, FeatureState, thresholds_arrays
from service.telemetry import catalogue

TH = {"rx_power_dbm": {"high_alarm": 5.0, "high_warning": 4.0, "low_warning": -4.9, "low_alarm": -6.9},
      "tx_power_dbm": {"high_alarm": 5.0, "high_warning": 4.0, "low_warning": -2.9, "low_alarm": -3.9},
      "tx_bias_amperes": {"high_alarm": 0.08, "high_warning": 0.072, "low_warning": 0.012, "low_alarm": 0.008},
      "temperature_celsius": {"high_alarm": 75, "high_warning": 70, "low_warning": 0, "low_alarm": -5},
      "voltage_volts": {"high_alarm": 3.63, "high_warning": 3.465, "low_warning": 3.135, "low_alarm": 2.97}}


def build(gpus: int) -> Fabric:
    hosts = gpus // 8
    nic = hosts * 8
    leaves = int(np.ceil(nic / 32))
    uplinks = leaves * 16  # leaf uplinks (2:1 at the leaf, so the fabric is ~300k ports) ...
    spine_ports = uplinks  # ... and the spine ends
    P = 2 * nic + uplinks + spine_ports
    n_spines = max(1, spine_ports // 64)
    dev = np.concatenate([np.repeat(np.arange(hosts), 8),
                          hosts + np.arange(nic) // 32,                 # leaf host-facing (the last may be part-filled)
                          hosts + np.repeat(np.arange(leaves), 16),     # leaf uplinks
                          hosts + leaves + np.arange(spine_ports) % n_spines])
    order = np.argsort(dev, kind="stable")
    inv = np.empty(P, np.int64)
    inv[order] = np.arange(P)
    a = np.arange(nic)
    peer = np.empty(P, np.int64)
    peer[a], peer[nic + a] = nic + a, a
    u = np.arange(uplinks)
    peer[2 * nic + u], peer[2 * nic + uplinks + u] = 2 * nic + uplinks + u, 2 * nic + u
    dev, peer = dev[order], inv[peer[order]]
    lanes = np.where(np.arange(P)[order] < 2 * nic, 4, 8)
    roles = ["host"] * hosts + ["leaf"] * leaves + ["spine"] * n_spines
    role_of = np.asarray([0] * hosts + [1] * leaves + [2] * n_spines)[dev]
    cohort = role_of * 2 + (lanes == 8)
    names = [f"Ethernet1/{i}" for i in range(P)]
    th = thresholds_arrays([TH])
    return Fabric(port_ids=np.arange(1, P + 1), port_names=names, dev=dev, dev_names=[f"d{i}" for i in
                  range(hosts + leaves + n_spines)], dev_roles=roles, peer=peer, n_lanes=lanes,
                  speed_bps=np.where(lanes == 4, 400e9, 800e9),
                  cohort=cohort, cohort_names=[f"c{i}" for i in range(6)], fec_limit=np.full(P, 2.4e-4),
                  copper=np.zeros(P, bool), th={k: np.full(P, v[0]) for k, v in th.items()})


class Synth:
    """Healthy telemetry for every entity, a few hundred faulty ports."""

    def __init__(self, fab: Fabric, seed: int = 0) -> None:
        self.fab = fab
        self.rng = np.random.default_rng(seed)
        P, L = fab.P, fab.L
        self.rx0 = self.rng.normal(-1.0, 0.5, L)
        self.c = {m: self.rng.uniform(0, 1e12, P if AXIS[m] == "port" else P * NPRIO)
                  for m in AXIS if catalogue.is_counter(m)}
        self.bad = self.rng.choice(P, min(300, P // 2), replace=False)  # 1/3 FEC, 1/6 flaps, 1/2 optics
        n = len(self.bad)
        self.fec, self.flaps, self.optics = self.bad[:n // 3], self.bad[n // 3:n // 2], self.bad[n // 2:]
        self.t = 1_735_689_600_000

    def batch(self) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        fab, rng = self.fab, self.rng
        P, L = fab.P, fab.L
        self.t += 60_000
        out = {}
        for m, v in self.c.items():
            inc = {"port_rx_phy_bits_total": 400e9 * 60, "port_fec_corrected_bits_total": 400e9 * 60 * 1e-8,
                   "port_rx_bytes_total": 1.5e12, "port_rx_packets_total": 3.6e8,
                   "port_ecn_marked_packets_total": 1e4}.get(m, 0.0)
            v += inc
            if m == "port_fec_uncorrectable_codewords_total":
                v[self.fec] += 50
            if m == "port_link_down_events_total":
                v[self.flaps] += 8
            n = len(v)
            out[m] = (np.arange(n), np.full(n, self.t), v.copy())
        rx = self.rx0 + rng.normal(0, 0.15, L)
        bad_l = fab.lane_off[self.optics]
        rx[bad_l] -= 4.0
        for m, val, n in (("optic_rx_power_dbm", rx, L), ("optic_tx_power_dbm", rng.normal(1, 0.05, L), L),
                          ("optic_tx_bias_amperes", rng.normal(0.04, 1e-4, L), L),
                          ("optic_temperature_celsius", rng.normal(45, 0.3, P), P),
                          ("optic_voltage_volts", np.full(P, 3.3), P), ("port_oper_up", np.ones(P), P),
                          ("port_admin_up", np.ones(P), P)):
            out[m] = (np.arange(n), np.full(n, self.t), val)
        return out


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def backend_cpu_s(conn: Connection) -> float:
    """CPU seconds the connection's PostgreSQL backend has used (its /proc entry: the server on this machine)."""
    pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


_WAL = "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')"


class Clock:
    """Wall, this process's CPU and the backend's CPU time of a block, and the WAL the server wrote meanwhile
    (anyone's: run it on a quiet server), added up per label."""

    def __init__(self) -> None:
        self.spent: dict[str, list[tuple[float, float, float, float]]] = {}

    @contextlib.contextmanager
    def __call__(self, label: str, conn: Connection) -> Iterator[None]:
        w0 = float(conn.execute(text(_WAL)).scalar_one())
        b0, c0, t0 = backend_cpu_s(conn), time.process_time(), time.perf_counter()
        yield
        t, c, b = time.perf_counter() - t0, time.process_time() - c0, backend_cpu_s(conn) - b0
        w = float(conn.execute(text(_WAL)).scalar_one()) - w0
        self.spent.setdefault(label, []).append((t, c, b, w / 1e6))

    def report(self) -> None:
        print("per cycle, median (max):  wall s | client CPU s | server CPU s | WAL MB")
        for label, xs in self.spent.items():
            cols = np.asarray(xs)
            print(f"  {label:<22}" + " | ".join(f"{np.median(cols[:, i]):6.3f} ({cols[:, i].max():6.3f})"
                                                for i in range(4)))


def save_plain_npz(conn: Connection, name: str, st: FeatureState) -> None:
    """store.save_state as it was before 2026-12-04: the state as a plain (stored, not deflated) npz."""
    import io

    buf = io.BytesIO()
    np.savez(buf, **st.saved_arrays())
    _save_blob(conn, name, st, buf.getvalue())


def save_whole(conn: Connection, name: str, st: FeatureState) -> None:
    """store.save_state as it was from 2026-12-04 to 2026-12-06: the state with the training reservoir in it, all
    rewritten every cycle (then a deflated npz; today's container here)."""
    _save_blob(conn, name, st, st.to_bytes())


def _save_blob(conn: Connection, name: str, st: FeatureState, blob: bytes) -> None:
    conn.execute(text(
        "INSERT INTO detector_state (name, watermark_ms, last_cycle_ms, ports, saved_at, blob) "
        "VALUES (:n, :w, :c, :p, now(), :b) ON CONFLICT (name) DO UPDATE SET watermark_ms = excluded.watermark_ms, "
        "last_cycle_ms = excluded.last_cycle_ms, ports = excluded.ports, saved_at = now(), blob = excluded.blob"),
        {"n": name, "w": st.watermark_ms or 0, "c": st.last_cycle_ms, "p": st.fabric.P, "b": blob})


def state_io(url: str, gpus: int, cycles: int, reservoir_rows: int) -> None:
    """Load and save of the detector state per live cycle: whole every cycle vs kept in the process."""
    from sqlalchemy import create_engine

    from service.detection.features import IF_FEATURES
    from service.detection.models import DetectorReservoir, DetectorState
    from service.detection.store import StateCache, load_state, save_state

    admin = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1), isolation_level="AUTOCOMMIT")
    scratch = f"fw_bench_state_io_{os.getpid()}"
    with admin.connect() as c:
        c.execute(text(f"DROP DATABASE IF EXISTS {scratch}"))
        c.execute(text(f"CREATE DATABASE {scratch}"))
    db = create_engine(admin.url.set(database=scratch))
    try:
        with db.begin() as c:
            DetectorState.__table__.create(c)
            DetectorReservoir.__table__.create(c)
        fab = build(gpus)
        print(f"fabric: {fab.P:,} ports, {fab.L:,} lanes; training reservoir {reservoir_rows:,} rows to start; "
              f"load average {os.getloadavg()[0]:.1f}")
        syn, cfg, clock, cache = Synth(fab), Config(), Clock(), StateCache()
        rng = np.random.default_rng(1)
        modes = ("before", "whole", "reload", "after")
        engines = {mode: Engine() for mode in modes}
        for i in range(cycles + 1):  # the first cycle writes the first state (and the cache holds none yet)
            batch = syn.batch()
            for mode in modes:
                with db.begin() as conn:
                    with clock(f"{mode}: load", conn):
                        st = cache.take(conn, mode, fab, cfg) if mode == "after" else load_state(conn, mode, fab, cfg)
                    if st is None:
                        st = FeatureState(fab, cfg)
                        if reservoir_rows:  # a reservoir as full as a day-old live detector's
                            st.reservoir_new.append((rng.normal(size=(reservoir_rows, len(IF_FEATURES))),
                                                     rng.integers(0, len(fab.cohort_names), reservoir_rows)))
                    st.observe(batch)
                    st.watermark_ms = syn.t
                    engines[mode].run_cycle(st, syn.t)
                    with clock(f"{mode}: save", conn):
                        if mode == "before":
                            save_plain_npz(conn, mode, st)
                        elif mode == "whole":
                            save_whole(conn, mode, st)
                        elif mode == "reload":
                            save_state(conn, mode, st)
                        else:
                            cache.save(conn, mode, st)
            if i == 0:
                clock.spent.clear()
                with db.connect() as conn:
                    for name, size in conn.execute(text("SELECT name, length(blob) FROM detector_state ORDER BY 1")):
                        print(f"state blob ({name}): {size / 1e6:.1f} MB ({size / fab.P / 1e3:.2f} kB per port)")
        clock.report()
        print(f"states read from the database by the cache: {cache.loads} in {cycles} cycles; "
              f"load average now {os.getloadavg()[0]:.1f}")
    finally:
        db.dispose()
        with admin.connect() as c:
            c.execute(text(f"DROP DATABASE IF EXISTS {scratch}"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=100_000)
    ap.add_argument("--cycles", type=int, default=5)
    ap.add_argument("--state-io", metavar="POSTGRES_URL", help="measure the detector state's load and save instead")
    ap.add_argument("--reservoir-rows", type=int, default=0,
                    help="--state-io: training reservoir rows each state starts with (a day-old live detector's "
                         "with 16 cohorts: ~65,000)")
    args = ap.parse_args()
    if args.state_io:
        state_io(args.state_io, args.gpus, args.cycles, args.reservoir_rows)
        return
    t = time.perf_counter()
    fab = build(args.gpus)
    print(f"fabric: {fab.P:,} ports, {fab.L:,} lanes, {len(fab.dev_names):,} devices "
          f"(built in {time.perf_counter() - t:.1f} s)")
    cfg = Config()
    st = FeatureState(fab, cfg)
    eng = Engine()
    syn = Synth(fab)
    for _ in range(3):  # warm-up: baselines and counter references
        st.observe(syn.batch())
        eng.run_cycle(st, syn.t)
    t = time.perf_counter()
    X = if_matrix(compute(st, syn.t), st)
    rng = np.random.default_rng(1)
    rows = rng.choice(fab.P, min(fab.P, cfg.if_reservoir * len(fab.cohort_names)), replace=False)
    eng.models.retrain(X[rows], fab.cohort[rows], fab.cohort_names, syn.t, cfg)
    st.last_train_ms = st.first_cycle_ms = syn.t
    train_s = time.perf_counter() - t
    print(f"training {len(eng.models.models)} cohort forests ({cfg.if_trees} trees): {train_s:.1f} s (daily)")
    obs, cyc, cpu = [], [], []
    n_find = 0
    for _ in range(args.cycles):
        b = syn.batch()
        c0 = time.process_time()
        t = time.perf_counter()
        st.observe(b)
        t1 = time.perf_counter()
        found = eng.run_cycle(st, syn.t)
        t2 = time.perf_counter()
        cpu.append(time.process_time() - c0)
        obs.append(t1 - t)
        cyc.append(t2 - t1)
        n_find = len(found)
    # a cycle that also closes a 2 h trend bucket (Theil-Sen on candidates)
    st.next_bucket_ms = syn.t + 1
    b = syn.batch()
    t = time.perf_counter()
    st.observe(b)
    eng.run_cycle(st, syn.t)
    bucket_s = time.perf_counter() - t
    tot = [a + c for a, c in zip(obs, cyc, strict=True)]
    print("per cycle (observe + evaluate):", ", ".join(f"{x:.2f}" for x in tot))
    print(f"observe: median {np.median(obs):.2f} s; evaluate: median {np.median(cyc):.2f} s; "
          f"observe+evaluate: median {np.median(tot):.2f} s, max {max(tot):.2f} s")
    print(f"CPU time per cycle (unaffected by other load on a shared box): median {np.median(cpu):.2f} s, "
          f"max {max(cpu):.2f} s; load average now {os.getloadavg()[0]:.1f}")
    print(f"cycle with a trend-bucket close: {bucket_s:.2f} s")
    print(f"findings in the last cycle: {n_find}")
    t = time.perf_counter()
    blob = st.to_bytes()  # a live cycle's save serializes this (store.save_state)
    save_s = time.perf_counter() - t
    t = time.perf_counter()
    FeatureState.from_bytes(blob, fab, cfg)  # a cycle after a start or a pod move reads it back
    print(f"state blob: {len(blob) / 2**20:.1f} MiB, serialized in {save_s:.3f} s, read back in "
          f"{time.perf_counter() - t:.3f} s; peak RSS: {rss_mib():.0f} MiB")


if __name__ == "__main__":
    main()
