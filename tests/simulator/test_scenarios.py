import numpy as np
import pytest

from tests.simulator.helpers import run, series

TOPO = {"topology": {"hosts": 2, "spines": 2}, "seed": 7}
H1, H2 = "host-p1-00001", "host-p1-00002"
LEAF = "leaf-p1-r0-01"


def rate(x: np.ndarray, dt: float) -> np.ndarray:
    return np.diff(x, axis=0) / dt


def test_dirty_connector_drops_only_its_lanes() -> None:
    sim, fr = run({**TOPO, "faults": [{"type": "dirty_connector", "device": LEAF, "port": "Ethernet1/1",
                                       "lanes": [1], "drop_db": 4.0, "at": "1h"}]}, end=7200)
    rx = series(sim, fr, "optic_rx_power_dbm", LEAF, "Ethernet1/1")  # (steps, lanes)
    before, after = rx[:55].mean(0), rx[65:].mean(0)
    drop = before - after
    assert drop[1] == pytest.approx(4.0, abs=0.3)
    assert np.all(np.abs(np.delete(drop, 1)) < 0.3)
    # the other end of the link is untouched
    other = series(sim, fr, "optic_rx_power_dbm", H1, "eth0")
    assert np.all(np.abs(other[:55].mean(0) - other[65:].mean(0)) < 0.3)


def test_decaying_laser_tx_declines_at_rate() -> None:
    sim, fr = run({**TOPO, "faults": [{"type": "decaying_laser", "device": H1, "port": "eth0", "lanes": [0],
                                       "rate_db_per_day": 0.5, "at": 0}]}, end=2 * 86400, step=1800)
    tx = series(sim, fr, "optic_tx_power_dbm", H1, "eth0")
    days = np.arange(len(tx)) * 1800 / 86400
    slope = np.polyfit(days, tx[:, 0], 1)[0]
    assert slope == pytest.approx(-0.5, abs=0.1)
    assert abs(np.polyfit(days, tx[:, 1], 1)[0]) < 0.1
    rx_peer = series(sim, fr, "optic_rx_power_dbm", LEAF, "Ethernet1/1")
    assert np.polyfit(days, rx_peer[:, 0], 1)[0] == pytest.approx(-0.5, abs=0.15)


def test_bias_rise_then_cliff_in_ground_truth() -> None:
    sim, fr = run({**TOPO, "faults": [{"type": "decaying_laser", "device": H1, "port": "eth0", "lanes": [0],
                                       "mode": "bias_rise", "bias_pct_per_day": 40, "plateau_days": 0.5,
                                       "at": 0}]}, end=3 * 86400, step=3600)
    bias = series(sim, fr, "optic_tx_bias_amperes", H1, "eth0")[:, 0]
    tx = series(sim, fr, "optic_tx_power_dbm", H1, "eth0")[:, 0]
    assert bias[40] > bias[1] * 1.5 and abs(tx[40] - tx[1]) < 0.5  # bias up at constant tx
    truth = sim.faults[0].truth(sim.m)
    fail_step = int((truth["hard_failure_unix"] - 1_735_689_600) / 3600)
    assert tx[fail_step + 1] == -40.0 and truth["end"] == "tx"


def test_congestion_raises_ecn_not_ber() -> None:
    base_spec = {**TOPO, "faults": []}
    spec = {**TOPO, "faults": [{"type": "congestion", "device": H1, "at": "20m", "duration": "30m",
                                "intensity": 2}]}
    s0, f0 = run(base_spec)
    s1, f1 = run(spec)
    ecn0 = rate(series(s0, f0, "port_ecn_marked_packets_total", H1, "eth0"), 60)[25:45]
    ecn1 = rate(series(s1, f1, "port_ecn_marked_packets_total", H1, "eth0"), 60)[25:45]
    assert ecn1.mean() > 5 * ecn0.mean() + 1
    cnp1 = rate(series(s1, f1, "port_cnp_sent_total", H1, "eth0"), 60)[25:45]
    assert cnp1.mean() > 0
    ber0 = series(s0, f0, "port_pre_fec_ber", H1, "eth0")[25:45]
    ber1 = series(s1, f1, "port_pre_fec_ber", H1, "eth0")[25:45]
    assert np.median(ber1 / ber0) == pytest.approx(1.0, rel=0.2)
    duty = rate(series(s1, f1, "port_pfc_tx_pause_seconds_total", H1, "eth0"), 60)[25:45]
    assert duty.max() <= 0.2
    assert s1.faults[0].truth(s1.m)["alert_expected"] is False


def test_pause_storm_signature() -> None:
    sim, fr = run({**TOPO, "faults": [{"type": "pause_storm", "device": H1, "port": "eth0", "at": "20m",
                                       "until": "40m"}]})
    duty = rate(series(sim, fr, "port_pfc_tx_pause_seconds_total", H1, "eth0"), 60)
    assert duty[21:38].min() > 0.98 and duty[:18].max() < 0.05
    rxb = rate(series(sim, fr, "port_rx_bytes_total", H1, "eth0"), 60)
    assert rxb[21:38].max() < 0.02 * rxb[:18].mean()
    storm = series(sim, fr, "port_pause_storm_error_events_total", H1, "eth0")
    assert storm[38] > storm[18] and storm[18] == storm[0]
    leaf_rx = rate(series(sim, fr, "port_pfc_rx_pause_seconds_total", LEAF, "Ethernet1/1"), 60)
    assert leaf_rx[21:38].min() > 0.98
    up = rate(series(sim, fr, "port_pfc_tx_pause_seconds_total", LEAF, "Ethernet1/3"), 60)  # an uplink
    assert up[21:38].min() > 0.3


def test_flap_storm_vs_single_flaps() -> None:
    sim, fr = run({**TOPO, "faults": [
        {"type": "flap_storm", "device": LEAF, "port": "Ethernet1/1", "at": "10m", "duration": "1m",
         "flaps_per_10s": 6},
        {"type": "single_flap", "device": "leaf-p1-r1-01", "port": "Ethernet1/1", "at": "5m", "count": 2,
         "spacing": "20m"}]}, end=1800, step=10)
    storm = np.diff(series(sim, fr, "port_link_down_events_total", LEAF, "Ethernet1/1")[:, 0])
    single = np.diff(series(sim, fr, "port_link_down_events_total", "leaf-p1-r1-01", "Ethernet1/1")[:, 0])
    assert storm.max() >= 5 and storm.sum() >= 30
    assert single.sum() == 2 and single.max() == 1


def test_slow_host_and_line_card_and_post_fec() -> None:
    sim, fr = run({**TOPO, "faults": [
        {"type": "slow_host", "device": H2, "gpus": [3], "at": "10m"},
        {"type": "line_card", "device": "leaf-p1-r5-01", "fraction": 1.0, "at": "10m", "flaps_per_hour": 0},
        {"type": "post_fec", "device": H1, "port": "eth6", "post_fec_ber": 1e-9, "at": "10m"}]}, end=1800)
    width = series(sim, fr, "gpu_pcie_link_width", H2)
    assert width[5, 3] == 16 and width[15, 3] == 8 and width[15, 2] == 16
    duty = rate(series(sim, fr, "port_pfc_tx_pause_seconds_total", H2, "eth3"), 60)[12:]
    assert 0.15 < duty.mean() < 0.5
    assert series(sim, fr, "port_pause_storm_warning_events_total", H2, "eth3").max() == 0
    ber = series(sim, fr, "port_pre_fec_ber", "leaf-p1-r5-01", "Ethernet1/1")[:, 0]
    ber2 = series(sim, fr, "port_pre_fec_ber", "leaf-p1-r5-01", "Ethernet1/2")[:, 0]
    assert ber[15:].mean() > 100 * ber[:8].mean() and ber2[15:].mean() > 100 * ber2[:8].mean()
    ucw = series(sim, fr, "port_fec_uncorrectable_codewords_total", H1, "eth6")[:, 0]
    rx = series(sim, fr, "optic_rx_power_dbm", H1, "eth6")
    assert ucw[-1] - ucw[11] > 0 and ucw[8] == ucw[0]
    assert abs(rx[:9].mean() - rx[12:].mean()) < 0.3


def test_hotspot_raises_ecn_on_uplink() -> None:
    s1, f1 = run({**TOPO, "faults": [{"type": "ecmp_hotspot", "device": LEAF, "ports": ["Ethernet1/3"],
                                      "at": 0}]})
    hot = rate(series(s1, f1, "port_ecn_marked_packets_total", LEAF, "Ethernet1/3"), 60)
    cold = rate(series(s1, f1, "port_ecn_marked_packets_total", LEAF, "Ethernet1/4"), 60)
    assert hot.mean() > 5 * (cold.mean() + 1)
    duty = rate(series(s1, f1, "port_pfc_tx_pause_seconds_total", LEAF, "Ethernet1/3"), 60)
    assert duty.mean() > 0.05


def test_artefacts() -> None:
    sim, fr = run({**TOPO, "artefacts": {"missing_fraction": 0.0}, "faults": [
        {"type": "counter_reset", "device": H1, "at": "20m"},
        {"type": "counter_wrap", "device": LEAF, "bits": 32},
        {"type": "missing", "device": "leaf-p1-r2-01", "at": "10m", "until": "15m"},
        {"type": "admin_down", "device": "leaf-p1-r4-01", "port": "Ethernet1/1", "at": "30m"},
        {"type": "saturate", "device": "leaf-p1-r6-01", "bits": 4, "metrics": ["port_rx_packets_total"]}]})
    rxb = series(sim, fr, "port_rx_bytes_total", H1, "eth0")[:, 0]
    assert rxb[20] < rxb[18] and rxb[20] < 1e13  # reset: back near zero
    pk = series(sim, fr, "port_rx_packets_total", LEAF, "Ethernet1/1")[:, 0]
    assert pk.max() < 2**32 and (np.diff(pk) < 0).any()  # wrapped
    gap = series(sim, fr, "port_rx_bytes_total", "leaf-p1-r2-01", "Ethernet1/1")[:, 0]
    assert np.isnan(gap[9:14]).all() and not np.isnan(gap[:9]).any() and not np.isnan(gap[14:]).any()
    rx = series(sim, fr, "optic_rx_power_dbm", "leaf-p1-r4-01", "Ethernet1/1")
    assert (rx[31:] == -40.0).all()
    assert series(sim, fr, "port_admin_up", "leaf-p1-r4-01", "Ethernet1/1")[31:].max() == 0
    assert series(sim, fr, "optic_rx_power_dbm", H1, "eth4")[31:].max() == -40.0  # the far end goes dark
    sat = series(sim, fr, "port_rx_packets_total", "leaf-p1-r6-01", "Ethernet1/1")[:, 0]
    assert sat.max() == 15 and sim.block["port_rx_packets_total"].saturating.any()


def test_determinism() -> None:
    spec = {**TOPO, "artefacts": {"missing_fraction": 0.05},
            "faults": [{"type": "loose_transceiver", "device": H1, "port": "eth2", "bursts_per_hour": 30}]}
    _, a = run(spec, end=900)
    _, b = run(spec, end=900)
    _, c = run({**spec, "seed": 8}, end=900)
    for n in a:
        assert all(np.array_equal(x, y, equal_nan=True) for x, y in zip(a[n], b[n], strict=True)), n
    assert not all(np.array_equal(x, y, equal_nan=True) for x, y in
                   zip(a["optic_rx_power_dbm"], c["optic_rx_power_dbm"], strict=True))


def test_loose_transceiver_onset_is_its_first_burst() -> None:
    # one burst a day on average: any recovery in the onset's own step comes from the onset burst
    spec = {**TOPO, "faults": [{"type": "loose_transceiver", "device": H1, "port": "eth2", "at": "10m",
                                "bursts_per_hour": 1 / 24}]}
    sim, fr = run(spec, end=1800)
    rec = series(sim, fr, "port_link_error_recovery_total", H1, "eth2")[:, 0]
    steps = np.flatnonzero(np.diff(rec) > 0) + 1
    assert steps.size and steps[0] == 10  # row k closes at (k + 1) min: row 10 is (10, 11] min, the onset's
    assert rec[:10].max() == rec[0]
