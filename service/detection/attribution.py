"""Layer 3: persistence (k of n observations), hysteresis state, cause/end/action, and grouping.

Persistence: each condition keeps its last observations per port (held or not, and when); it fires
when it held in >= k of the last n observations within Config.persist_window_ms of data time, and an
alert that fired stays "holding" while it held at least once in them (the leave condition). An
observation is a cycle that brought new data of the condition's inputs: a cycle without any leaves the
condition as it was (docs/detection.md, "Observations"). Attribution follows the signature tables F19/F22/F30:

| signature (at the receiver unless said)                 | cause            | fault end | action          |
|---------------------------------------------------------|------------------|-----------|-----------------|
| rx down on some lanes, far transmitter's tx down or bias up | TX_WEAROUT   | peer      | replace peer    |
| rx down with wobble, or both directions of the lane     | FIBER            | local     | replace cable   |
| rx down, far tx normal, stable                          | CONTAMINATION    | local     | clean           |
| bias rising at the transmitter (own DOM)                | TX_WEAROUT       | local     | replace local   |
| recoveries / error bursts / flaps, powers normal        | LOOSE_MODULE     | local     | reseat          |
| >= 5 flaps within 30 min of data time, not a loose module | FLAP_STORM      | link      | disable port    |
| the same (or a down link) under an open optical episode, or lit but weak | the optical cause's alert |  |  |
| >= 30 % of one device's ports at once                   | SHARED_COMPONENT | device    | escalate device |
| uncorrectable codewords / symbol errors, optics normal  | POST_FEC         | local     | replace cable/module |
| stall counters or ~100 % tx pause with rx ~0 (host)     | NIC_PAUSE_STORM  | host      | drain host      |
| PCIe width/gen drop (host)                              | HOST_SIDE        | host      | drain host      |
| ECN/pause without storm, BER unchanged                  | CONGESTION       | -         | review capacity |
| oper-down >= 2 min, admin up at both ends (one per link) | LINK_DOWN       | link      | check link      |

`device`/`port` of a Finding is always the end at fault; `end` says where that is relative
to the receiver whose telemetry showed the symptom ("local": the receiving end itself,
"peer": the far end of the link). Physical findings of ports that are members of a shared
component finding are folded into that one device-level finding.
"""

from __future__ import annotations

from dataclasses import replace as dc_replace
from datetime import UTC, datetime

import numpy as np

from service.detection import rules
from service.detection.features import Features, seg_reduce
from service.detection.findings import Action, Cause, Evidence, Finding, Severity
from service.detection.rules import Conditions, either_end
from service.detection.state import DEGRADED, EPOCH_MS, HIST, Config, Fabric, FeatureState

# kind -> (k, n): fire when the condition held in >= k of the last n observations within
# Config.persist_window_ms (n <= state.HIST)
KN: dict[str, tuple[int, int]] = {
    "optical_degradation": (3, 5), "post_fec_errors": (2, 3), "flap_storm": (1, 1), "loose_module": (1, 1),
    "pause_storm": (1, 2), "host_side": (3, 5), "congestion": (3, 5), "ber_degradation": (3, 5),
    "dom_threshold": (2, 3), "bias_drift": (2, 3), "anomaly": (4, 5), "link_down": (1, 1),
}
SHARED_KN = (2, 4)
# link-symmetric conditions both ends observe (each from its own polls): one finding per link, kept on the end that
# opened it for as long as the condition holds at either end
LINK_KINDS = ("flap_storm", "link_down")
assert max(n for _, n in (*KN.values(), SHARED_KN)) <= HIST
PHYSICAL_RAW = ("optical_degradation", "post_fec_errors", "flap_storm", "ber_degradation", "loose_module",
                "anomaly", "link_down")
SHARED_HITS = ("optical_degradation", "post_fec_errors", "flap_storm", "ber_degradation", "loose_module",
               "link_down")
# physical findings whose evidence carries the RoCE transport's retransmit/timeout/ICRC rates (#18)
ROCE_EVIDENCE = ("optical_degradation", "post_fec_errors", "flap_storm", "ber_degradation", "loose_module",
                 "dom_threshold", "bias_drift", "anomaly")
# a finding of the key kind on a port hides these kinds on the same port (one cause, one alert)
EXPLAINS = {
    "flap_storm": ("loose_module", "ber_degradation", "post_fec_errors", "anomaly"),
    "optical_degradation": ("ber_degradation", "post_fec_errors", "loose_module", "anomaly"),  # powers not normal
    "loose_module": ("ber_degradation", "post_fec_errors", "anomaly"),  # its bursts are intermittent errors
    "post_fec_errors": ("ber_degradation", "anomaly"),
    "pause_storm": ("congestion", "host_side"),
    "host_side": ("congestion",),
    "ber_degradation": ("anomaly",),
    "bias_drift": ("anomaly",),
}


def _secs(ms: int | np.ndarray) -> np.ndarray:
    return np.asarray((np.asarray(ms, np.int64) - EPOCH_MS) // 1000, np.int64).clip(0, 2**32 - 1).astype(np.uint32)


def observe_history(hit: np.ndarray, t: np.ndarray, latched: np.ndarray, raw: np.ndarray, fresh: np.ndarray,
                    at_ms: int, k: int, n: int, window_ms: int, now: np.ndarray | None = None,
                    count: np.ndarray | None = None, hits: np.ndarray | None = None
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Shift this cycle's observations into the history of entities observed now; (firing, holding, count).

    `hit`/`t` (entities x HIST) are the newest observations, newest last; only `fresh` entities shift, so a
    cycle without new data neither counts as "absent" nor ages the history. `count` (default 1) is how many
    observations the cycle brought per entity (polls of a level), `hits` how many of them held (default: all,
    if `raw`), pushed misses first. Firing: held in >= k of the last n observations that are within
    `window_ms` of data time; holding: fired before and held at least once in them. `now` marks conditions
    strong enough to fire on one observation.
    """
    H = hit.shape[1]
    sec = int(_secs(at_ms))
    seen = bool(fresh.any())  # most replay cycles observe nothing: then nothing shifts, only the window ages
    if seen:
        m = fresh.astype(np.int64) if count is None else np.where(fresh, np.clip(count, 1, n), 0)
        h = np.where(raw, m, 0) if hits is None else np.clip(np.where(raw, hits, 0), 0, m)
        for c in np.unique(m[m > 0]).tolist():
            rows: np.ndarray | slice = np.flatnonzero(m == c)
            if len(rows) == len(m):  # every entity (a timed condition, each cycle): slices, not gathers
                rows = slice(None)
            hit[rows, :H - c] = hit[rows, c:]
            t[rows, :H - c] = t[rows, c:]
            t[rows, H - c:] = sec
            hit[rows, H - c:] = np.arange(c)[None, :] >= (c - h[rows])[:, None]  # the misses first, then the hits
    recent = (t[:, H - n:] >= np.uint32(max(sec - window_ms // 1000, 0))) & (t[:, H - n:] > 0)
    count_now = (hit[:, H - n:] & recent) @ np.ones(n, np.int64)  # per row; a third of .sum(axis=1)'s time here
    firing = count_now >= k
    if now is not None and seen:
        firing |= now & raw & fresh
    holding = latched & ~firing & (count_now >= 1)
    latched[:] = (latched | firing) & (count_now >= 1)
    return firing, holding, count_now


def persist(st: FeatureState, raw: dict[str, np.ndarray], fresh: dict[str, np.ndarray],
            obs_ms: dict[str, np.ndarray], at_ms: int, now: dict[str, np.ndarray] | None = None,
            polls: dict[str, np.ndarray] | None = None, hits: dict[str, np.ndarray] | None = None
            ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Persistence per condition over observations; returns (firing, holding, effective raw) and keeps onsets.

    A port whose inputs of a condition brought nothing new keeps that condition's previous raw value."""
    firing, holding, eff = {}, {}, {}
    now = now or {}
    win = st.cfg.persist_window_ms
    for kind, r in raw.items():
        k, n = KN.get(kind, (1, 1))
        fr = fresh.get(kind, np.ones(len(r), bool))
        seen = bool(fr.any())  # nothing observed (most replay cycles): the raw value and the onsets stay
        if seen:
            r = np.where(fr, r, st.last_raw[kind])
            st.last_raw[kind][fr] = r[fr]
        else:
            r = st.last_raw[kind].copy()
        eff[kind] = r
        firing[kind], holding[kind], count = observe_history(
            st.obs_hit[kind], st.obs_t[kind], st.latched[kind], r, fr, at_ms, k, n, win, now.get(kind),
            (polls or {}).get(kind), (hits or {}).get(kind))
        # onset: the data time of the observation where the condition first held, kept while any of its recent
        # observations held or its finding is open
        on = st.onset[kind]
        if seen:
            start = fr & r & (on == 0)
            on[start] = np.maximum(obs_ms.get(kind, np.zeros(len(r), np.int64))[start], 1)
            on[start & (on <= 1)] = at_ms
        live = firing[kind] | holding[kind]
        if kind in LINK_KINDS:  # the end that opened the link's finding keeps its onset while the far end holds
            live = either_end(live, st.fabric.peer)
        on[~live & (count == 0)] = 0
    return firing, holding, eff


def shared_devices(st: FeatureState, raw: dict[str, np.ndarray], f: Features) -> tuple[np.ndarray, np.ndarray]:
    """Devices where >= shared_frac of linked ports show a physical condition now (E4).

    Counts raw conditions, plus any flap in the window: a line card drops all its ports at once.
    The far ends of those ports see the same flaps, so a port whose link ends on a device with
    more hit ports that qualifies (or already holds a shared finding) is explained there, and a
    host cabled to a failing line card is not a second shared component.
    Returns (device raw mask (D,), hit ports (P,)).
    """
    fab, cfg = st.fabric, st.cfg
    D = len(fab.dev_names)
    hit = np.zeros(fab.P, bool)
    for k in SHARED_HITS:  # not the forest: its outliers are scattered by design
        if k in raw:
            hit |= raw[k]
    hit |= np.nan_to_num(f.flaps, nan=0.0) > 0
    linked = fab.peer >= 0
    hit &= linked
    n_ports = np.bincount(fab.dev, weights=linked, minlength=D)

    def qualify(h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n = np.bincount(fab.dev, weights=h, minlength=D)
        with np.errstate(invalid="ignore", divide="ignore"):
            frac = np.where(n_ports > 0, n / n_ports, 0.0)
        return (frac >= cfg.shared_frac) & (n >= cfg.shared_min_ports), n

    dev_raw, n_hit = qualify(hit)
    far = fab.dev[np.maximum(fab.peer, 0)]
    explained = hit & (dev_raw[far] | st.dev_latched[far]) & (n_hit[far] > n_hit[fab.dev]) & (far != fab.dev)
    if explained.any():
        hit &= ~explained
        dev_raw, _ = qualify(hit)
    return dev_raw, hit


def device_observations(st: FeatureState, eff: dict[str, np.ndarray], hit: np.ndarray, fresh: dict[str, np.ndarray],
                        hits: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The shared-component condition's observations this cycle, in data time: per device, whether any port
    brought new data, how many observations that is, and in how many of them the condition held.

    A device's observations are its counter polls, shorter ones merged into Config.rate_window_ms (a cycle of
    15 min over 60 s polls is 15 observations, as fifteen 60 s cycles are; 10 s polls at a 60 s step are one).
    A hit port holds in as many of them as its condition did: post-FEC in its polls with errors, BER in its rate
    windows at the condition's rate, a flap in its polls with a flap; a level or a data-time condition (optics,
    storm, loose module, link down), or one held from an earlier cycle, in all. The device holds in the
    observations that enough of its hit ports held in (the `need`-th most among them): the per-poll truth that a
    15 min cycle's sums would hide."""
    fab, cfg = st.fabric, st.cfg
    P, D = fab.P, len(fab.dev_names)
    n_polls = np.zeros(P, np.int64)
    data_ms = np.zeros(P, np.int64)
    for c in st.counters.values():
        if len(c.acc_n) == P:  # port counters (not the per-priority ones)
            n_polls = np.maximum(n_polls, c.acc_n)
            data_ms = np.maximum(data_ms, c.acc_ms)
    obs = np.minimum(n_polls, np.maximum(np.rint(data_ms / max(cfg.rate_window_ms, 1)), 1).astype(np.int64))
    obs = np.where(rules.polled(st), np.maximum(obs, 1), 0)
    dev_obs = np.zeros(D, np.int64)
    np.maximum.at(dev_obs, fab.dev, obs)
    m = dev_obs[fab.dev]
    flap_polls = np.maximum(st.nz_m.get("port_link_down_events_total", np.zeros(P, np.int32)),
                            st.nz_m.get("port_carrier_changes_total", np.zeros(P, np.int32)))
    fl_fresh = st.fresh_m["port_link_down_events_total"] | st.fresh_m["port_carrier_changes_total"]
    h = np.where(np.nan_to_num(st.counters["port_link_down_events_total"].held(), nan=0.0) > 0,
                 np.where(fl_fresh, flap_polls, m), 0)
    for k in SHARED_HITS:
        if k not in eff:
            continue
        counted = hits.get(k) if k in ("post_fec_errors", "ber_degradation") else None
        own = np.where(fresh.get(k, True), counted, m) if counted is not None else m
        h = np.maximum(h, np.where(eff[k], own, 0))
    h = np.where(hit, np.minimum(h, m), 0)
    n_ports = np.bincount(fab.dev, weights=fab.peer >= 0, minlength=D)
    need = np.maximum(np.ceil(cfg.shared_frac * n_ports - 1e-9), cfg.shared_min_ports).astype(np.int64)
    dev_hits = np.zeros(D, np.int64)
    for d in np.unique(fab.dev[hit]).tolist():
        hs = np.sort(h[(fab.dev == d) & hit])[::-1]
        if len(hs) >= need[d]:
            dev_hits[d] = hs[need[d] - 1]
    return dev_obs > 0, dev_obs, dev_hits


def _dom_crossed(f: Features, st: FeatureState, p: int) -> list[Evidence]:
    """What of port p's module reads beyond its own alarm thresholds now (the rule's inputs, rules.evaluate)."""
    th, off = st.fabric.th, st.fabric.lane_off
    out = []
    if f.temp[p] >= th["temp_ha"][p]:
        out.append(_ev("temperature_c", f.temp[p], None, None, "C", f"high alarm {th['temp_ha'][p]:g} C"))
    if f.volt[p] >= th["volt_ha"][p]:
        out.append(_ev("voltage_v", f.volt[p], None, None, "V", f"high alarm {th['volt_ha'][p]:g} V"))
    if f.volt[p] <= th["volt_la"][p]:
        out.append(_ev("voltage_v", f.volt[p], None, None, "V", f"low alarm {th['volt_la'][p]:g} V"))
    for lane, i in enumerate(range(off[p], off[p + 1])):
        if f.bias[i] >= th["bias_ha"][p]:
            out.append(_ev("tx_bias_a", f.bias[i], None, None, "A", f"lane {lane}: high alarm {th['bias_ha'][p]:g} A"))
        if f.tx[i] <= th["tx_la"][p]:
            out.append(_ev("tx_power_dbm", f.tx[i], None, None, "dBm",
                           f"lane {lane}: low alarm {th['tx_la'][p]:g} dBm"))
    return out


def _ev(name: str, value: float, baseline: float | None = None, cohort: float | None = None, unit: str = "",
        note: str = "") -> Evidence:
    def clean(v: float | None) -> float | None:
        return None if v is None or not np.isfinite(v) else round(float(v), 4)
    return Evidence(name, clean(value) if np.isfinite(value) else float("nan"), clean(baseline), clean(cohort),
                    unit, note)


class Builder:
    """Turns persisted conditions into Finding objects for one cycle."""

    def __init__(self, st: FeatureState, f: Features, cond: Conditions, at_ms: int) -> None:
        self.st, self.f, self.cond, self.at = st, f, cond, at_ms
        self.fab = st.fabric
        self.out: list[Finding] = []

    def _names(self, p: int) -> tuple[str, str]:
        return self.fab.dev_names[self.fab.dev[p]], self.fab.port_names[p]

    def _peer_names(self, p: int) -> tuple[str | None, str | None]:
        q = int(self.fab.peer[p])
        return self._names(q) if q >= 0 else (None, None)

    def add(self, kind: str, p: int, cause: Cause, sev: Severity, action: Action, state: str, score: float,
            summary: str, *, scope: str = "port", end: str | None = "local", ttt: float | None = None,
            evidence: list[Evidence] | None = None, fault_port: int | None = None) -> None:
        fp = p if fault_port is None else fault_port
        dev, port = self._names(fp)
        q = int(self.fab.peer[fp])
        pdev, pport = self._names(q) if q >= 0 else (None, None)
        evidence = (evidence or []) + self.context(kind, p)
        self.out.append(Finding(
            kind=kind, scope=scope, device=dev, port=port, lane=None, cause=cause, severity=sev, action=action,
            state=state, score=round(float(score), 4) if np.isfinite(score) else 0.0, at_ms=self.at, summary=summary,
            peer_device=pdev, peer_port=pport, end=end,
            ttt_hours=None if ttt is None or not np.isfinite(ttt) else round(float(ttt), 1),
            evidence=evidence or []))

    def context(self, kind: str, p: int) -> list[Evidence]:
        """Evidence every finding carries: when its condition first held (onset_ms, data time), and what its rule
        ran without on this port (one `degraded_input` per missing input)."""
        ev = []
        on = int(self.st.onset[kind][p]) if kind in self.st.onset else 0
        if on > 0:
            ev.append(Evidence("onset_ms", float(on), None, None, "ms", f"condition first held at {_utc(on)}"))
        bits = int(self.cond.degraded[kind][p]) if kind in self.cond.degraded else 0
        ev += [Evidence("degraded_input", float("nan"), None, None, "", why)
               for i, why in enumerate(DEGRADED) if bits >> i & 1]
        if kind in ROCE_EVIDENCE:
            ev += self.roce(p)
        return ev

    def roce(self, p: int) -> list[Evidence]:
        """What the link costs RDMA: the RoCE retransmit, timeout and ICRC rates of the host NIC at either end of
        port p's link (what that NIC reports; none on a switch-to-switch link)."""
        fab, f = self.fab, self.f
        q = int(fab.peer[p])
        nic = p if fab.is_host[p] else q if q >= 0 and fab.is_host[q] else -1
        if nic < 0:
            return []
        where = "{}:{} (RoCE transport)".format(*self._names(nic))
        return [_ev(name, float(x[nic]), None, None, "per s", where)
                for name, x in (("roce_retransmits_per_s", f.roce_retx_rate),
                                ("roce_timeouts_per_s", f.roce_timeout_rate),
                                ("roce_icrc_errors_per_s", f.icrc_rate)) if np.isfinite(x[nic])]

    def symptom(self, kind: str, p: int) -> None:
        """Add to the optical finding just built the flap storm or down link (`kind`, on port p's link) it explains:
        its summary and evidence, and PAGE (the link is dropping traffic)."""
        opt = self.out.pop()
        summary, ev = _summary(self, kind, p)
        self.out.append(dc_replace(opt, severity=Severity.PAGE, summary=f"{opt.summary}. It takes the link down: "
                                   f"{summary}", evidence=opt.evidence + ev))

    # -- optical ----------------------------------------------------------------------------
    def as_link_down(self, opt: Finding, p: int) -> Finding:
        """Receiver `opt`'s optical finding as the link-down alert of p's end of its link (kind link_down, p's
        identity): the loss took that link down, and what the link's ends show after is that alert's."""
        (dev, port), (pdev, pport) = self._names(p), self._peer_names(p)
        return dc_replace(opt, kind="link_down", scope="link", device=dev, port=port, peer_device=pdev,
                          peer_port=pport)

    def optical(self, p: int, state: str, kind: str = "optical_degradation", lane_deg: np.ndarray | None = None
                ) -> None:
        """The optical finding of receiver p (`kind`: post_fec_errors when it carries a post-FEC alert that the
        optics now explain, so that alert keeps its identity and takes the optical cause; `lane_deg`: the degraded
        lanes, when not the optical rule's)."""
        f, fab, cfg = self.f, self.fab, self.st.cfg
        lanes = np.arange(fab.lane_off[p], fab.lane_off[p + 1])
        if lane_deg is None:
            lane_deg = self.cond.lane_deg
        deg = lanes[lane_deg[lanes]] if lane_deg is not None else lanes[:0]
        if not len(deg):  # held from an earlier observation (this one not judged): the lanes its light reads weak
            deg = lanes[weak_lanes(f, cfg, lanes)]
        if not len(deg):
            deg = lanes[np.argsort(np.nan_to_num(f.rx_margin_warn[lanes], nan=np.inf))[:1]]
        lane_nos = (deg - fab.lane_off[p]).tolist()
        rx_d = f.rx_delta[deg]
        with np.errstate(invalid="ignore"):
            drop = np.nanmin(rx_d) if np.isfinite(rx_d).any() else np.nan
            ptx = f.peer_tx_delta[deg]
            pbias = f.peer_bias_drift[deg]
            ptx_min = np.nanmin(ptx) if np.isfinite(ptx).any() else np.nan
            pbias_max = np.nanmax(pbias) if np.isfinite(pbias).any() else np.nan
            need = min(-0.3, 0.35 * drop) if np.isfinite(drop) else -cfg.tx_drop_db
            explained = bool(np.isfinite(ptx_min) and ptx_min <= need)
            tx_fault = explained or ptx_min <= -cfg.tx_drop_db or pbias_max >= cfg.bias_drift_frac
            prx = f.peer_rx_delta[deg]
            both = bool(np.isfinite(prx).any() and np.nanmin(prx) <= -cfg.rx_drop_db)
            # wobble: since the drop, the degraded lanes moved from reading to reading clearly more than the
            # port's other lanes over the same readings (the temperature drift all lanes share cancels, at any
            # optics poll), over enough readings to tell; until then, stable. With every lane degraded, more
            # than they did before the drop (a noisy module's reading noise is not a wobble)
            wn = self.st.wob_n[lanes]
            wmean = np.where(wn > 0, self.st.wob_sum[lanes] / np.maximum(wn, 1), np.nan)
            in_deg = np.isin(lanes, deg)
            jit = wmean[in_deg]
            others = wmean[~in_deg]
            jmax = np.nanmax(jit) if np.isfinite(jit).any() else np.nan
            n_read = int(wn[in_deg].min())
            if np.isfinite(others).any():  # a lane that moved more than the others
                jit_ref, moved, margin = np.nanmedian(others), jmax, 0.12
            else:  # no other lane to compare with (all degraded): all their differences together against
                # the lanes' own jitter before the drop, over 3 sd of such a mean of noise alone (|normal
                # difference|: sd 0.76 x its mean), so a noisy module's first few readings are no wobble
                before = self.st.wob_ref[deg]
                jit_ref = max(0.15, float(np.nanmean(before))) if np.isfinite(before).any() else 0.15
                n_all = int(wn[in_deg].sum())
                moved = float(self.st.wob_sum[deg].sum()) / n_all if n_all else np.nan
                margin = max(0.12, 3 * 0.76 * jit_ref / np.sqrt(max(n_all, 1)))
            enough = n_read >= cfg.wobble_min_readings
            wobble = bool(enough and np.isfinite(moved) and moved >= cfg.wobble_db and moved - jit_ref >= margin)
        ttw = self.st.lane_trend["ttt_warn"][deg]
        tta = self.st.lane_trend["ttt_alarm"][deg]
        slope = self.st.lane_trend["rx_slope"][deg] * 24
        ttt = float(np.nanmin(ttw)) if np.isfinite(ttw).any() else None
        tta_min = float(np.nanmin(tta)) if np.isfinite(tta).any() else np.inf
        margin_alarm = f.rx_margin_alarm_min[p]
        post_fec = bool(np.nan_to_num(f.post_fec[p], nan=0.0) > 0)
        sev = Severity.PAGE if (margin_alarm < 0 or tta_min <= 24 or post_fec) else Severity.TICKET
        lane_txt = "lane " + ",".join(map(str, lane_nos)) if len(lane_nos) < 4 else f"{len(lane_nos)} lanes"
        dev, port = self._names(p)
        q = int(fab.peer[p])
        ev = [_ev("rx_power_dbm", float(np.nanmin(f.rx[deg])) if np.isfinite(f.rx[deg]).any() else np.nan,
                  float(np.nanmin(f.rx_base[deg])) if np.isfinite(f.rx_base[deg]).any() else None,
                  float(f.rx_margin_cohort_med[p] + fab.th["rx_lw"][p]), "dBm", lane_txt),
              _ev("rx_margin_low_warn_db", float(f.rx_margin_min[p]), None, float(f.rx_margin_cohort_med[p]), "dB"),
              _ev("rx_delta_baseline_db", drop, 0.0, None, "dB"),
              _ev("peer_tx_delta_db", ptx_min, 0.0, None, "dB", "far transmitter"),
              _ev("peer_bias_drift", pbias_max, 0.0, None, "fraction"),
              _ev("rx_jitter_db", float(np.nanmax(jit)) if np.isfinite(jit).any() else np.nan, jit_ref, None, "dB"),
              _ev("log10_pre_fec_ber", float(f.log_ber[p]), float(self.st.base["logber"].loc[p]), None, "log10")]
        if post_fec:
            ev.append(_ev("post_fec_errors", float(f.post_fec[p]), 0.0, None, "count", "traffic is being lost"))
        if ttt is not None:
            ev.append(_ev("rx_slope_db_per_day", float(np.nanmin(slope)), 0.0, None, "dB/day"))
            ev.append(_ev("time_to_low_warning_h", ttt, None, None, "h"))
        when = ""
        if ttt is not None and ttt > 0:
            when = f"; rx reaches low-warning in about {ttt / 24:.1f} days" if ttt >= 48 else \
                f"; rx reaches low-warning in about {ttt:.0f} h"
        if tx_fault and q >= 0:
            pdev, pport = self._names(q)
            summary = (f"transmitter wear-out at {pdev}:{pport}: rx at {dev}:{port} {lane_txt} down "
                       f"{-drop if np.isfinite(drop) else 0:.1f} dB with the far tx down/bias up; replace the "
                       f"module at {pdev}:{pport}{when}")
            self.add(kind, p, Cause.TX_WEAROUT, sev, Action.REPLACE_PEER, state,
                     self.cond.score["optical_degradation"][p], summary, end="peer", ttt=ttt, evidence=ev,
                     fault_port=q)
        elif wobble or both:
            why = "both directions" if both else "wobbling"
            summary = (f"fiber damage on {dev}:{port} {lane_txt}: rx down {-drop if np.isfinite(drop) else 0:.1f} dB, "
                       f"{why}, far tx normal; replace the cable{when}")
            self.add(kind, p, Cause.FIBER, sev, Action.REPLACE_CABLE, state,
                     self.cond.score["optical_degradation"][p], summary, scope="link", ttt=ttt, evidence=ev)
        else:
            summary = (f"connector contamination at {dev}:{port} {lane_txt}: rx down "
                       f"{-drop if np.isfinite(drop) else 0:.1f} dB, stable, far tx normal; clean the connectors"
                       f"{when}")
            self.add(kind, p, Cause.CONTAMINATION, sev, Action.CLEAN, state,
                     self.cond.score["optical_degradation"][p], summary, ttt=ttt, evidence=ev)


def weak_lanes(f: Features, cfg: Config, lanes: np.ndarray | slice) -> np.ndarray:
    """Which of `lanes` read >= rx_drop_db under their baseline, or under the module's low-warning (NaN: not)."""
    with np.errstate(invalid="ignore"):
        return (f.rx_delta[lanes] <= -cfg.rx_drop_db) | (f.rx_margin_warn[lanes] < 0)


def lit_but_weak(st: FeatureState, f: Features, p: int) -> tuple[int, np.ndarray | None]:
    """The receiver of p's link whose light arrives (lit) but >= rx_drop_db under its baseline, or under the
    module's low-warning, on some lane: an optical loss that took the link down, not a dark end (-1 if neither);
    and its weak lanes."""
    fab, cfg = st.fabric, st.cfg
    q = int(fab.peer[p])
    best, lanes_out, worst = -1, None, 0.0
    for x in (p, q) if q >= 0 else (p,):
        if not f.lit[x]:
            continue
        lanes = slice(fab.lane_off[x], fab.lane_off[x + 1])
        with np.errstate(invalid="ignore"):
            weak = weak_lanes(f, cfg, lanes) & (f.rx[lanes] > cfg.lit_dbm)
        if weak.any():
            drop = float(np.nanmin(np.where(weak, np.fmin(f.rx_delta[lanes], f.rx_margin_warn[lanes]), np.inf)))
            if best < 0 or drop < worst:
                best, worst = x, drop
                lanes_out = np.zeros(fab.L, bool)
                lanes_out[lanes] = weak
    return best, lanes_out


def optical_symptoms(st: FeatureState, f: Features, active: dict[str, np.ndarray], opt_open: np.ndarray,
                     down: np.ndarray) -> dict[int, tuple[str, int]]:
    """Flap storms and down links that an optical loss explains: {receiver: (kind, port of the storm or down link)}.

    A storm's link is explained when either end has an open optical episode, or when the link is not down (`down`)
    and light still arrives, weak, at one end (lit_but_weak: a fiber or connector loss wobbling across the
    receiver's loss of signal; a down link's observation can mix dark and lit readings); a down link only when an
    episode was open (a link that an optical loss takes down at once stays a link-down finding with the optical
    cause). The receiver is the weak end, else the end whose episode is open."""
    fab = st.fabric
    out: dict[int, tuple[str, int]] = {}
    for kind in LINK_KINDS:
        for p in np.flatnonzero(active[kind]).tolist():
            q = int(fab.peer[p])
            ends = (p, q) if q >= 0 else (p,)
            if any(x in out for x in ends):
                continue
            r, _ = lit_but_weak(st, f, p)
            opened = [x for x in ends if opt_open[x]]
            if r < 0 or ((kind == "link_down" or down[p]) and not opt_open[r]):
                if not opened:
                    continue
                r = r if r >= 0 and opt_open[r] else opened[0]
            out[r] = (kind, p)
    return out


def link_dedupe(mask: np.ndarray, score: np.ndarray, peer: np.ndarray, onset: np.ndarray | None = None,
                by_score: bool = True) -> np.ndarray:
    """Keep one end per link for link-symmetric conditions: the end where the condition held first (so the
    finding does not hop between ends as their scores cross), then (`by_score`) the higher score, ties to the lower
    index. Without `by_score`, equal onsets go to the lower index: a choice no later cycle changes (both ends of
    a link count its flaps, each from its own polls, so their scores cross)."""
    keep = mask.copy()
    idx = np.flatnonzero(mask)
    q = peer[idx]
    both = (q >= 0) & mask[np.maximum(q, 0)]
    s, sq = score[idx], score[np.maximum(q, 0)]
    if onset is None:
        onset = np.zeros(len(mask), np.int64)
    o = np.where(onset[idx] > 0, onset[idx], np.iinfo(np.int64).max)
    oq = onset[np.maximum(q, 0)]
    oq = np.where(oq > 0, oq, np.iinfo(np.int64).max)
    if not by_score:
        s = sq = np.zeros(len(idx))
    lose = both & ((oq < o) | ((oq == o) & ((sq > s) | ((sq == s) & (q < idx)))))
    keep[idx[lose]] = False
    return keep


def _host_link(fab: Fabric, p: int) -> bool:
    q = int(fab.peer[p])
    return bool(fab.is_host[p] or (q >= 0 and fab.is_host[q]))


def _utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _duration(ms: float) -> str:
    """'45 s', '15 min', '2 h 05 min', '3 d 04 h': how long, for people."""
    s = int(ms // 1000)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 86400} d {s % 86400 // 3600:02d} h"


def _best_rx(f: Features, fab: Fabric, p: int) -> float:
    """The strongest lane's rx power at port p (dBm); NaN when there is no reading."""
    rx = f.rx[fab.lane_off[p]:fab.lane_off[p + 1]]
    return float(np.nanmax(rx)) if np.isfinite(rx).any() else np.nan


_SIMPLE: dict[str, tuple[Cause, Severity, Action, str, str | None]] = {
    # kind -> cause, severity, action, scope, end
    "flap_storm": (Cause.FLAP_STORM, Severity.PAGE, Action.DISABLE_PORT, "link", "local"),
    "loose_module": (Cause.LOOSE_MODULE, Severity.TICKET, Action.RESEAT, "port", "local"),
    "pause_storm": (Cause.NIC_PAUSE_STORM, Severity.PAGE, Action.DRAIN_HOST, "host", "local"),
    "host_side": (Cause.HOST_SIDE, Severity.TICKET, Action.DRAIN_HOST, "host", "local"),
    "congestion": (Cause.CONGESTION, Severity.INFO, Action.REVIEW_CAPACITY, "port", None),
    "ber_degradation": (Cause.UNKNOWN_PHYSICAL, Severity.TICKET, Action.RESEAT, "port", "local"),
    "dom_threshold": (Cause.MODULE_ALARM, Severity.TICKET, Action.REPLACE_LOCAL, "port", "local"),
    "bias_drift": (Cause.TX_WEAROUT, Severity.TICKET, Action.REPLACE_LOCAL, "port", "local"),
    "anomaly": (Cause.UNKNOWN_PHYSICAL, Severity.INFO, Action.NONE, "port", "local"),
}


def _summary(b: Builder, kind: str, p: int) -> tuple[str, list[Evidence]]:
    f, st = b.f, b.st
    dev, port = b._names(p)
    if kind == "post_fec_errors":
        what = "FCS/CRC errors" if f.post_fec_from_fcs[p] else "uncorrectable codewords/symbol errors"
        return (f"post-FEC errors on {dev}:{port}: {f.post_fec[p]:.0f} {what} in the last poll (any is too many)",
                [_ev("post_fec_errors", f.post_fec[p], 0.0, None, "count"),
                 _ev("fcs_errors", f.fcs_errors[p], 0.0, None, "frames"),
                 _ev("log10_pre_fec_ber", f.log_ber[p], st.base["logber"].loc[p], None, "log10"),
                 _ev("rx_margin_low_warn_db", f.rx_margin_min[p], None, f.rx_margin_cohort_med[p], "dB")])
    if kind == "link_down":
        fab = st.fabric
        since = int(st.down_since[p])
        q = int(fab.peer[p])
        pdev, pport = b._peer_names(p)
        host = fab.dev_names[fab.dev[p]] if fab.is_host[p] else pdev if q >= 0 and fab.is_host[q] else None
        impact = (f"{host} has lost this rail path" if host else "its traffic is on the device's other links")
        return (f"link down: {dev}:{port} <-> {pdev}:{pport} oper-down since {_utc(since)} "
                f"({_duration(f.at_ms - since)}), admin up at both ends; {impact}. Check that {pdev} is up and its "
                f"port enabled, then the modules and the cable",
                [_ev("down_for_s", (f.at_ms - since) / 1000, 0.0, None, "s", f"since {_utc(since)}"),
                 _ev("down_since_ms", since, None, None, "ms", "data time of the first down reading"),
                 _ev("rx_power_dbm", _best_rx(f, fab, p), None, None, "dBm", "strongest lane, this end"),
                 _ev("peer_rx_power_dbm", _best_rx(f, fab, q) if q >= 0 else np.nan, None, None, "dBm",
                     "strongest lane, far end")])
    if kind == "flap_storm":
        win = st.cfg.flap_storm_window_s
        q = int(st.fabric.peer[p])
        n = int(max(f.flaps_window[p], f.flaps_window[q] if q >= 0 else 0))  # either end's count: the link's storm
        many = f"{n}" if n < st.flaps.t.shape[1] else f"{n} or more"
        since = max(int(st.down_since[p]), int(st.down_since[q]) if q >= 0 else 0)
        down = f"; the link is down since {_utc(since)}" if since > 0 else ""
        if since > 0 and n < st.cfg.flap_storm_count:  # the storm's flaps have left the window: still down
            return (f"link down after a flap storm on {dev}:{port}: down since {_utc(since)} "
                    f"({_duration(f.at_ms - since)}); {many} flaps within the last {win / 60:.0f} min now",
                    [_ev("flaps_in_window", float(n), 0.0, None, f"per {win / 60:.0f} min"),
                     _ev("down_for_s", (f.at_ms - since) / 1000, 0.0, None, "s", f"since {_utc(since)}")])
        return (f"link flap storm on {dev}:{port}: {many} flaps within the last {win / 60:.0f} min "
                f"({st.cfg.flap_storm_count} or more is a storm){down}",
                [_ev("flaps_in_window", float(n), 0.0, None, f"per {win / 60:.0f} min"),
                 _ev("flaps_last_poll", f.flaps[p], None, None, "count")])
    if kind == "loose_module":
        return (f"loose or bad module at {dev}:{port}: repeated link recoveries/error bursts with normal optical "
                f"power; reseat it",
                [_ev("recovery_penalty", f.recovery_pen[p], 0.0, None), _ev("burst_penalty", f.burst_pen[p], 0.0),
                 _ev("flap_penalty", f.flap_pen[p], 0.0), _ev("post_fec_errors", f.post_fec[p], 0.0, None, "count"),
                 _ev("rx_delta_baseline_db", f.rx_delta_min[p], 0.0, None, "dB")])
    if kind == "pause_storm":
        return (f"NIC pause storm at {dev}:{port}: tx pause duty {f.tx_pause_duty[p]:.0%}, rx utilisation "
                f"{np.nan_to_num(f.rx_util[p]):.1%}, stall events {np.nan_to_num(f.storm_events[p]):.0f}; "
                f"isolate the host",
                [_ev("tx_pause_duty", f.tx_pause_duty[p], 0.0, None, "fraction"),
                 _ev("rx_util", f.rx_util[p], None, None, "fraction"),
                 _ev("pause_storm_events", f.storm_events[p], 0.0, None, "count")])
    if kind == "host_side":
        return (f"host-side slowdown at {dev}:{port}: PCIe x{f.pcie_width[p]:.0f} gen{f.pcie_gen[p]:.0f}, "
                f"tx pause duty {np.nan_to_num(f.tx_pause_duty[p]):.0%}; not a network fault",
                [_ev("pcie_link_width", f.pcie_width[p]), _ev("pcie_link_generation", f.pcie_gen[p]),
                 _ev("tx_pause_duty", f.tx_pause_duty[p], 0.0, None, "fraction")])
    if kind == "congestion":
        return (f"congestion at {dev}:{port}: ECN-marked {np.nan_to_num(f.ecn_frac[p]):.1%} of rx packets, "
                f"tx pause duty {np.nan_to_num(f.tx_pause_duty[p]):.0%}, BER unchanged",
                [_ev("ecn_frac", f.ecn_frac[p], None, None, "fraction"),
                 _ev("tx_pause_duty", f.tx_pause_duty[p], 0.0, None, "fraction"),
                 _ev("rx_util", f.rx_util[p], None, None, "fraction"),
                 _ev("log10_pre_fec_ber", f.log_ber[p], st.base["logber"].loc[p], None, "log10")])
    if kind == "ber_degradation":
        return (f"pre-FEC BER degraded on {dev}:{port}: log10 BER {f.log_ber[p]:.1f}, "
                f"{f.ber_margin_dec[p]:.1f} decades from the FEC limit, optical power normal",
                [_ev("log10_pre_fec_ber", f.log_ber[p], st.base["logber"].loc[p], None, "log10"),
                 _ev("pre_fec_margin_dec", f.ber_margin_dec[p], None, None, "decades")])
    if kind == "dom_threshold":
        crossed = _dom_crossed(f, st, p)
        said = "; ".join(f"{e.feature} {e.value:g} {e.unit} ({e.note})" for e in crossed)
        return (f"module DOM beyond its alarm threshold at {dev}:{port}: {said or 'held from an earlier poll'}",
                crossed or [_ev("temperature_c", f.temp[p], st.base["temp"].loc[p], None, "C"),
                            _ev("voltage_v", f.volt[p], None, None, "V")])
    if kind == "bias_drift":
        off = st.fabric.lane_off
        bd = f.bias_drift[off[p]:off[p + 1]]
        bs = st.lane_trend["bias_slope"][off[p]:off[p + 1]] * 24
        return (f"laser wear-out at {dev}:{port}: bias up {np.nanmax(bd) if np.isfinite(bd).any() else 0:.0%} "
                f"over its baseline, rising {np.nanmax(bs) if np.isfinite(bs).any() else 0:.1%}/day; replace the "
                f"module",
                [_ev("bias_drift", np.nanmax(bd) if np.isfinite(bd).any() else np.nan, 0.0, None, "fraction"),
                 _ev("bias_slope_per_day", np.nanmax(bs) if np.isfinite(bs).any() else np.nan, 0.0, None,
                     "fraction/day")])
    return (f"unusual physical-layer features on {dev}:{port} for its cohort "
            f"({st.fabric.cohort_names[st.fabric.cohort[p]]})", [])


def build(st: FeatureState, f: Features, cond: Conditions, firing: dict[str, np.ndarray],
          holding: dict[str, np.ndarray], dev_fire: np.ndarray, dev_hold: np.ndarray, dev_pending: np.ndarray,
          members: np.ndarray, at_ms: int) -> list[Finding]:
    """All findings of one cycle, in a deterministic order (kind order, then port index).

    `dev_pending`: devices whose shared-component condition holds in their newest observation but has not
    persisted yet; their ports' physical findings wait for it (one device finding, not a page per port first)."""
    fab = st.fabric
    b = Builder(st, f, cond, at_ms)
    active = {k: firing[k] | holding[k] for k in firing}
    # a down link explains whatever else its two ends show (dark rx, no traffic, the flaps that took it down)
    link_down = either_end(active["link_down"], fab.peer)
    # a link that went down at the end of a flap storm: the storm is the cause (a 15 min cycle reads the storm and
    # the down run at once; a 60 s one saw the storm first), and its finding says the link is down for as long as
    # it stays down, after its flaps have left the window too: one alert, not a storm page then a link-down page.
    # (First: the ports with an optical episode open, before a down link hides it; a post-FEC alert carrying one too)
    # (and an episode whose link it took down, for as long as that stays down: a down link makes no optical
    # observation, so the episode's own would age out of the persistence window and a second, link-down alert open)
    st.down_carry &= link_down
    opt_open = active["optical_degradation"] | st.latched["optical_degradation"] | \
        (st.onset["optical_degradation"] > 0) | st.pf_carry | st.down_carry
    # a link-down alert that named an optical loss (light arriving weak) goes on as that loss's alert: the errors
    # and the optical episode at its link's ends after the link came back are the same fault, and join it (one
    # alert that sharpens, not a second one at the receiver), until the link's light and errors are clean again
    ld_end = np.full(fab.P, -1)  # the end whose link-down alert carries this port's link (-1: none)
    if st.ld_carry.any():  # most cycles carry nothing: no per-lane work then
        weak_or_open = opt_open | (seg_reduce(np.maximum, weak_lanes(f, st.cfg, slice(None)).astype(float),
                                              fab.lane_off, 0.0) > 0)
        st.ld_carry &= either_end(weak_or_open | active["post_fec_errors"], fab.peer) | link_down
        peer_carries = (fab.peer >= 0) & st.ld_carry[np.maximum(fab.peer, 0)]
        ld_end = np.where(st.ld_carry, np.arange(fab.P), np.where(peer_carries, fab.peer, -1))
    st.storm_down &= link_down
    storm_left = st.storm_down & ~active["flap_storm"]
    if storm_left.any():
        firing = {**firing, "flap_storm": firing["flap_storm"] | (storm_left & either_end(firing["link_down"],
                                                                                           fab.peer))}
        active["flap_storm"] = active["flap_storm"] | storm_left
    if "link_down" in active:
        active["link_down"] = active["link_down"] & ~either_end(active["flap_storm"], fab.peer)
        down = either_end(active["link_down"], fab.peer)
        for k in active:
            if k != "link_down":
                active[k] = active[k] & ~down
    # a flap storm (or a down link) that an optical loss explains is that optical episode's symptom, not a fault of
    # its own: a lane wobbling across loss of signal drops the link at every poll that catches it under (10 s polls
    # see a storm). It joins the optical alert of the receiver, with the storm as evidence, at neither end a page
    joined = optical_symptoms(st, f, active, opt_open, link_down)
    if joined:  # the caller's arrays stay as they were
        firing = {**firing, "optical_degradation": firing["optical_degradation"].copy()}
    for x, (kind, _) in joined.items():
        ends = [x, int(fab.peer[x])] if fab.peer[x] >= 0 else [x]
        for k in LINK_KINDS:
            active[k][ends] = False
        st.storm_down[ends] = storm_left[ends] = False
        st.down_carry[x] = bool(link_down[x])
        active["optical_degradation"][x] = True
        if firing[kind][ends].any():
            firing["optical_degradation"][x] = True
    # a BER rise seen before the optics have been read since it began waits for that reading (at most one optics
    # poll: a DOM poll every 15 min trails counters every 10 s), so a dirty connector is called by its rx drop
    if "ber_degradation" in active:
        rx_ts = seg_reduce(np.maximum, st.gauges["optic_rx_power_dbm"].h_ts.astype(float), fab.lane_off, 0.0)
        waiting = (rx_ts > 0) & (rx_ts < st.onset["ber_degradation"]) & (at_ms - rx_ts <= st.cfg.stale_ms)
        # and a BER rise with the rx already down (the optical condition awaiting its persistence) is optical
        active["ber_degradation"] = active["ber_degradation"] & ~waiting & ~st.last_raw["optical_degradation"]
    # post-FEC errors that alerted before the optics were read (counters every 5 min, DOM every 15) and that the
    # rx drop now explains keep their alert, with the optical cause, instead of giving way to a second one
    # (for the whole optical episode: when the errors stop, the alert goes on with the optics' state)
    carried = np.zeros(fab.P, bool)
    opt_state = firing["optical_degradation"].copy(), holding["optical_degradation"].copy()
    if "post_fec_errors" in active and "optical_degradation" in active:
        on_pf, on_opt = st.onset["post_fec_errors"], st.onset["optical_degradation"]
        opt_on = active["optical_degradation"] | st.last_raw["optical_degradation"] | (on_opt > 0)
        st.pf_carry |= active["post_fec_errors"] & st.last_raw["optical_degradation"] & (on_pf > 0) & \
            ((on_opt == 0) | (on_pf < on_opt))
        # errors that came and went before the optics were read (counters every 60 s, DOM every 15 min): the rx
        # drop read since explains them, so the optical episode, still pending, goes on as that alert
        pending = st.last_raw["optical_degradation"] & ~active["optical_degradation"] & \
            ~st.latched["optical_degradation"] & (on_opt > 0)
        st.pf_carry |= pending & (st.pf_last_ms > 0) & (st.pf_last_ms >= on_opt - st.cfg.stale_ms)
        st.pf_carry &= opt_on | active["post_fec_errors"]
        carried = st.pf_carry.copy()
        active["optical_degradation"] = active["optical_degradation"] & ~carried
        active["post_fec_errors"] = active["post_fec_errors"] | carried
    # one cause, one alert: hide kinds explained by another active kind on the same port. A post-FEC alert carrying
    # an optical episode is that episode: it hides what the optics hide and is hidden by nothing the optics are not.
    # An optical loss explains a loose module at either end: the recoveries and flaps it causes are the link's
    for k, hides in EXPLAINS.items():
        if k in active:
            by = active[k] | carried if k == "optical_degradation" else active[k]
            for h in hides:
                if h in active:
                    hide = by & ~carried if h == "post_fec_errors" else by
                    if k == "optical_degradation" and h == "loose_module":
                        hide = either_end(hide, fab.peer)
                    active[h] = active[h] & ~hide
    # one device ticket, not N link tickets: every physical finding on a port of a device under (or awaiting)
    # a shared-component finding, or at the far end of such a port's link, is folded into the device's
    shared_links = either_end((dev_fire | dev_hold | dev_pending)[fab.dev], fab.peer)
    for k in PHYSICAL_RAW:
        if k in active and k != "flap_storm":
            active[k] = active[k] & ~shared_links
    for k in ("flap_storm", "loose_module", "link_down"):
        if k in active:
            m = active[k] & ~storm_left if k == "flap_storm" else active[k]
            if k in LINK_KINDS:  # the end that opened it (its onset kept) goes on while either end holds
                opened = either_end(m, fab.peer) & (st.onset[k] > 0) & ~active[k]
                m = m | opened
                firing = {**firing, k: firing[k] | (opened & either_end(firing[k], fab.peer))}
            active[k] = link_dedupe(m, cond.score[k], fab.peer, st.onset[k], by_score=k not in LINK_KINDS)
    active["flap_storm"] |= storm_left  # the end whose storm alert goes on
    st.storm_down |= active["flap_storm"] & link_down
    for d in np.flatnonzero(dev_fire | dev_hold).tolist():
        ports = np.flatnonzero((fab.dev == d) & members)
        names = [fab.port_names[p] for p in ports.tolist()]
        n_linked = int(((fab.dev == d) & (fab.peer >= 0)).sum())
        ev = [_ev("affected_port_frac", len(names) / max(n_linked, 1), 0.0, None, "fraction"),
              _ev("worst_log10_pre_fec_ber", float(np.nanmax(f.log_ber[ports])) if len(ports) and
                  np.isfinite(f.log_ber[ports]).any() else np.nan, None, None, "log10"),
              _ev("post_fec_ports", float((np.nan_to_num(f.post_fec[ports]) > 0).sum()), 0.0, None, "ports")]
        if st.dev_onset[d] > 0:
            ev.append(Evidence("onset_ms", float(st.dev_onset[d]), None, None, "ms",
                               f"condition first held at {_utc(int(st.dev_onset[d]))}"))
        b.out.append(Finding(
            kind="shared_component", scope="device", device=fab.dev_names[d], port=None, lane=None,
            cause=Cause.SHARED_COMPONENT, severity=Severity.PAGE, action=Action.ESCALATE_DEVICE,
            state="firing" if dev_fire[d] else "holding", score=round(len(names) / max(n_linked, 1), 4), at_ms=at_ms,
            summary=f"shared component on {fab.dev_names[d]}: {len(names)} of {n_linked} ports degraded at once; "
                    f"one device ticket (line card/ASIC/PSU)",
            end="local", evidence=ev, members=names))
    for kind in ("link_down", "optical_degradation", "post_fec_errors", "flap_storm", "loose_module", "pause_storm",
                 "host_side", "bias_drift", "dom_threshold", "ber_degradation", "anomaly", "congestion"):
        if kind not in active:
            continue
        for p in np.flatnonzero(active[kind]).tolist():
            state = "firing" if firing[kind][p] else "holding"
            if kind in ("optical_degradation", "post_fec_errors") and ld_end[p] >= 0:
                q = int(fab.peer[p])  # the optics of the end whose light is weak, whichever end the errors are at
                r = q if q >= 0 and not weak_or_open[p] and weak_or_open[q] else p
                b.optical(r, "firing" if firing[kind][p] or opt_state[0][p] else "holding")
                if p in joined:
                    b.symptom(*joined[p])
                b.out.append(b.as_link_down(b.out.pop(), int(ld_end[p])))
                continue
            if kind == "optical_degradation":
                b.optical(p, state)
                if p in joined:
                    b.symptom(*joined[p])
                continue
            if kind == "post_fec_errors":
                if carried[p]:  # the optics explain the errors that alerted first: that alert, their cause
                    both = firing[kind][p] or opt_state[0][p]
                    b.optical(p, "firing" if both else "holding", kind="post_fec_errors")
                    if p in joined:
                        b.symptom(*joined[p])
                    continue
                if st.last_raw["optical_degradation"][p]:  # the optics explain the errors: name their cause
                    b.optical(p, state)
                    continue
                copper = bool(fab.copper[p])
                st.pf_last_ms[p] = at_ms  # a post-FEC alert of its own (not errors the optics already explain)
                summary, ev = _summary(b, kind, p)
                sev = Severity.PAGE
                b.add(kind, p, Cause.POST_FEC, sev, Action.REPLACE_CABLE if copper else Action.REPLACE_LOCAL, state,
                      cond.score[kind][p], summary + ("; replace the cable" if copper else "; replace the module"),
                      evidence=ev)
                continue
            if kind == "link_down":
                # a host link down cuts a GPU off its rail now: page; a switch link's traffic takes the others
                summary, ev = _summary(b, kind, p)
                sev = Severity.PAGE if _host_link(fab, p) else Severity.TICKET
                r, weak = lit_but_weak(st, f, p)
                if r >= 0:  # light arrives, too weak to hold the link: the optical cause took it down
                    b.optical(r, state, lane_deg=weak)
                    opt = b.out.pop()
                    b.out.append(dc_replace(
                        b.as_link_down(opt, p), severity=Severity.PAGE if Severity.PAGE in (sev, opt.severity) else sev,
                        summary=f"{opt.summary}. It took the {summary}",
                        evidence=[e for e in opt.evidence if e.feature not in ("onset_ms", "degraded_input")]
                        + ev + b.context(kind, p), score=round(float(cond.score[kind][p]), 4)))
                    st.ld_carry[p] = True
                    continue
                b.add(kind, p, Cause.LINK_DOWN, sev, Action.CHECK_LINK, state, cond.score[kind][p], summary,
                      scope="link", end=None, evidence=ev)
                continue
            cause, sev, action, scope, end = _SIMPLE[kind]
            summary, ev = _summary(b, kind, p)
            score = cond.score[kind][p] if kind in cond.score else 0.0
            b.add(kind, p, cause, sev, action, state, score, summary, scope=scope, end=end, evidence=ev)
    return b.out
