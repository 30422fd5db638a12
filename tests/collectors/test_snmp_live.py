"""The SNMP collector against real peers on 127.0.0.1: snmpsim (v2c), net-snmp snmpd (v3)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from collectors.base import Target, get_collector
from collectors.snmp import collect_many, collect_snmp, parse_snmprec
from tests.snmp_peers import DATA, Peer, silent_udp_socket, start_snmpd, start_snmpsim, unstamped

RECORDINGS = {
    "arista": DATA / "arista_eos_4.20_dcs-7150s-24.snmprec",
    "cisco": DATA / "cisco_nxos_10.5_n9k-c93180yc-fx3.snmprec",
    "junos": DATA / "junos_evo_22.2_qfx5130-32cd.snmprec",
}
V3 = {"user": "fwuser", "auth_key": "fw-auth-key-1", "priv_key": "fw-priv-key-1"}


@pytest.fixture(scope="module")
def sim() -> Iterator[Peer]:
    peer = start_snmpsim(RECORDINGS)
    yield peer
    peer.close()


@pytest.fixture(scope="module")
def snmpd() -> Iterator[Peer]:
    peer = start_snmpd(user=V3["user"], auth_key=V3["auth_key"], priv_key=V3["priv_key"])
    yield peer
    peer.close()


@pytest.fixture()
def silent() -> Iterator[int]:
    sock, port = silent_udp_socket()
    yield port
    sock.close()


def v2c(name: str, port: int, **kw: object) -> Target:
    return Target(name=name, device=name, protocol="snmp", port=port, secrets={"community": name},
                  timeout_s=2.0, retries=1, **kw)  # type: ignore[arg-type]


def v3(port: int, auth_key: str, priv_key: str) -> Target:
    return Target(name="v3dut", device="v3dut", protocol="snmp", port=port, timeout_s=1.0, retries=0,
                  params={"version": "3", "user": V3["user"], "auth_protocol": "sha256",
                          "priv_protocol": "aes", "port_pattern": "."},
                  secrets={"auth_key": auth_key, "priv_key": priv_key})


def test_v2c_poll_equals_recording(sim: Peer) -> None:
    assert get_collector("snmp") is collect_snmp
    for community, path in RECORDINGS.items():
        # small max_repetitions forces many GETBULK rounds and partial last rows
        res = collect_snmp(v2c(community, sim.port, params={"max_repetitions": 7}), now_ms=1_700_000_000_000)
        assert res.ok, res.error
        want, neighbors = parse_snmprec(Path(path).read_text(), device=community, ts_ms=1_700_000_000_000)
        assert sorted(map(unstamped, res.samples)) == sorted(map(unstamped, want))
        assert res.neighbors == neighbors
    res = collect_snmp(v2c("arista", sim.port), now_ms=1)
    by = {(s.metric, s.port, s.lane): s for s in res.samples}
    # values as they stand in the recording (see test_snmp_mapping for the OIDs)
    assert by[("port_rx_bytes_total", "Ethernet1", None)].value == 6576944
    assert by[("port_rx_bytes_total", "Ethernet1", None)].counter_bits == 64
    assert by[("optic_tx_bias_amperes", "Ethernet21", 0)].value == pytest.approx(0.01656)
    assert by[("optic_tx_power_dbm", "Ethernet21", 0)].value == pytest.approx(-6.556077, abs=1e-6)
    assert ("Ethernet23", "switchname3", "Ethernet23") in [tuple(vars_) for vars_ in
                                                          ((n.local_port, n.remote_device, n.remote_port)
                                                           for n in res.neighbors)]


def test_samples_carry_when_the_agent_answered_not_when_the_poll_was_due(sim: Peer) -> None:
    """A poll that waited (a busy worker, a queue) must not stamp its counters with the time it was due:
    the same counter delta over a wrong interval is a wrong rate (a demo port read at 185 % of line rate)."""
    due = int(time.time() * 1000) - 30_000  # due 30 s ago, polled only now
    before = int(time.time() * 1000)
    res = collect_snmp(v2c("arista", sim.port, params={"max_repetitions": 7}), now_ms=due)
    after = int(time.time() * 1000)
    assert res.ok, res.error
    stamps = {s.metric: s.ts_ms for s in res.samples if s.port == "Ethernet1"}
    assert {"port_rx_bytes_total", "port_oper_up", "port_tx_packets_total"} <= stamps.keys()
    assert all(before <= ts <= after for ts in stamps.values()), (before, stamps, after)
    optics = [s.ts_ms for s in res.samples if s.metric.startswith("optic_")]
    assert optics and all(before <= ts <= after for ts in optics)


def test_poll_groups_narrow_the_walk(sim: Peer) -> None:
    full = collect_snmp(v2c("arista", sim.port), now_ms=1)
    state = collect_snmp(v2c("arista", sim.port, params={"poll_groups": ["state"]}), now_ms=1)
    assert state.ok, state.error
    metrics = {s.metric for s in state.samples}
    assert "port_oper_up" in metrics and "port_rx_bytes_total" not in metrics
    assert not any(m.startswith("optic_") for m in metrics)
    # Blind spots are reported for the groups polled only: no optics or counters gap on a state poll.
    assert not [w for w in state.warnings if w.startswith(("optics:", "counters:"))], state.warnings
    assert [w for w in full.warnings if w.startswith("counters:")]  # the recording has no dot3StatsFCSErrors
    assert state.neighbors == full.neighbors and state.neighbors
    counters = collect_snmp(v2c("arista", sim.port, params={"poll_groups": ["counters"]}), now_ms=1)
    assert counters.ok and not counters.neighbors
    assert "port_rx_bytes_total" in {s.metric for s in counters.samples}
    want = sorted(unstamped(s) for s in full.samples if s.metric == "port_rx_bytes_total")
    assert sorted(unstamped(s) for s in counters.samples if s.metric == "port_rx_bytes_total") == want


def test_wrong_community_times_out_clearly(sim: Peer) -> None:
    t = Target(name="nocomm", device="x", protocol="snmp", port=sim.port, secrets={"community": "nope"},
               timeout_s=0.3, retries=0)
    res = collect_snmp(t, now_ms=1)
    assert not res.ok and "nocomm" in res.error and "timeout" in res.error and "nope" not in res.error


def _eth_interfaces() -> dict[str, float]:
    """Ethernet interfaces of this host as snmpd will report them (ARPHRD_ETHER = 1)."""
    out = {}
    for d in Path("/sys/class/net").iterdir():
        try:
            if (d / "type").read_text().strip() == "1":
                out[d.name] = 1.0 if (d / "operstate").read_text().strip() == "up" else 0.0
        except OSError:
            continue
    return out


def test_v3_authpriv_against_snmpd(snmpd: Peer) -> None:
    res = collect_snmp(v3(snmpd.port, V3["auth_key"], V3["priv_key"]), now_ms=1)
    assert res.ok, res.error
    oper = {s.port: s.value for s in res.samples if s.metric == "port_oper_up"}
    assert oper == _eth_interfaces()
    assert "lo" not in oper  # softwareLoopback is not a port


def test_v3_engine_is_reused_across_polls(snmpd: Peer) -> None:
    from collectors import snmp

    for _ in range(2):
        res = collect_snmp(v3(snmpd.port, V3["auth_key"], V3["priv_key"]), now_ms=1)
        assert res.ok, res.error
    assert snmp._worker is not None
    engines = snmp._ENGINES[snmp._worker.loop]
    before = dict(engines)
    assert collect_snmp(v3(snmpd.port, V3["auth_key"], V3["priv_key"]), now_ms=2).ok
    assert engines == before  # same credentials: the same engine, nothing new built


@pytest.mark.serial
def test_v3_wrong_auth_key_reports_usm_failure(snmpd: Peer) -> None:
    t0 = time.monotonic()
    res = collect_snmp(v3(snmpd.port, "not-the-auth-key", V3["priv_key"]), now_ms=1)
    assert not res.ok
    assert "usmStatsWrongDigests" in res.error and "v3dut" in res.error
    assert "not-the-auth-key" not in res.error and V3["priv_key"] not in res.error
    assert time.monotonic() - t0 < 3


def test_v3_wrong_priv_key_is_a_clear_error(snmpd: Peer) -> None:
    res = collect_snmp(v3(snmpd.port, V3["auth_key"], "not-the-priv-key"), now_ms=1)
    # net-snmp drops what it cannot decrypt, so this surfaces as a timeout with a hint
    assert not res.ok and "privacy key" in res.error and "not-the-priv-key" not in res.error


@pytest.mark.serial
def test_hung_agent_times_out_within_budget(silent: int) -> None:
    t = Target(name="hung", device="hung", protocol="snmp", port=silent, secrets={"community": "public"},
               timeout_s=0.4, retries=1)
    t0 = time.monotonic()
    res = collect_snmp(t, now_ms=1)
    took = time.monotonic() - t0
    assert not res.ok and "hung" in res.error and "timeout" in res.error
    assert "0.4s x 2 tries" in res.error
    assert took < 0.4 * 2 + 3.0, took  # bounded by the timeout, with slack for a loaded CI machine


@pytest.mark.serial
def test_one_bad_target_does_not_stop_the_others(sim: Peer, silent: int) -> None:
    closed = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    closed.bind(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()  # nothing listens: ICMP port unreachable or silence
    targets = [v2c("arista", sim.port), v2c("cisco", sim.port), v2c("junos", sim.port),
               Target(name="hung", device="hung", protocol="snmp", port=silent,
                      secrets={"community": "public"}, timeout_s=0.5, retries=0),
               Target(name="gone", device="gone", protocol="snmp", port=closed_port,
                      secrets={"community": "public"}, timeout_s=0.5, retries=0),
               Target(name="badver", device="b", protocol="snmp", port=sim.port, params={"version": "1"},
                      secrets={"community": "arista"})]
    t0 = time.monotonic()
    results = {r.target: r for r in collect_many(targets, now_ms=1)}
    assert time.monotonic() - t0 < 20  # the hung and gone targets add their timeout, not a hang
    for good in ("arista", "cisco", "junos"):
        assert results[good].ok and results[good].samples, results[good].error
    for bad in ("hung", "gone", "badver"):
        assert not results[bad].ok and bad in results[bad].error
    assert "unsupported SNMP version" in results["badver"].error
