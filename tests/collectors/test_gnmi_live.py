"""The gNMI collector against a real gRPC peer (simulator/gnmi_target.py) on 127.0.0.1."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from pygnmi.spec.v080 import gnmi_pb2, gnmi_pb2_grpc

from collectors.base import Target, get_collector
from collectors.gnmi import capabilities, collect_gnmi, stream_gnmi
from collectors.gnmi_decode import decode_typed_value, notification_leaves, path_to_proto
from collectors.gnmi_paths import map_notification
from service.telemetry.samples import Sample
from simulator.gnmi_target import Typed, serve_gnmi

IF = "/interfaces/interface[name={}]/state"
CH = "/components/component[name={} transceiver]/transceiver/physical-channels/channel[index={}]/state"
TEMP = "/components/component[name={}]/state/temperature/instant"
JUNOS_LANE = "/interfaces/interface[name=et-0/0/0]/optics/lanediags/lane[lane_number={}]"


def switch_data() -> dict[str, Any]:
    """One switch, using every TypedValue kind at least once."""
    return {
        IF.format("Ethernet1") + "/counters/in-octets": 2**40 + 1,                 # uint_val
        IF.format("Ethernet1") + "/counters/out-octets": "117389",                 # string_val (RFC 7951)
        IF.format("Ethernet1") + "/counters/in-errors": Typed("int_val", 7),       # int_val
        IF.format("Ethernet1") + "/counters/in-fcs-errors": Typed("uint_val", 3),
        IF.format("Ethernet1") + "/oper-status": "UP",
        IF.format("Ethernet1") + "/admin-status": Typed("bool_val", True),         # bool_val
        IF.format("Ethernet2") + "/oper-status": Typed("ascii_val", "DOWN"),       # ascii_val
        IF.format("Ethernet3") + "/counters": Typed("json_val", {"in-discards": 5, "out-discards": "6"}),
        IF.format("Ethernet4") + "/counters": Typed(                               # json_ietf_val
            "json_ietf_val", {"openconfig-interfaces:in-octets": "99", "out-octets": "100"}),
        CH.format("Ethernet1", 0) + "/input-power/instant": -2.5,                  # double_val
        CH.format("Ethernet1", 0) + "/output-power/instant": Typed("decimal_val", (115, 2)),  # decimal64
        CH.format("Ethernet1", 0) + "/laser-bias-current/instant": Typed("float_val", 6.5),   # float_val, mA
        CH.format("Ethernet1", 1): Typed("json_ietf_val", {                       # nested containers
            "openconfig-platform-transceiver:input-power": {"instant": "-1.25"},
            "output-power": {"instant": 0.5}}),
        TEMP.format("Ethernet1 transceiver"): Typed("decimal_val", (2709375, 5)),
        TEMP.format("TempSensor7"): Typed("decimal_val", (41168000000000006, 15)),
        JUNOS_LANE.format(1) + "/lane_laser_receiver_power_dbm": Typed("bytes_val", struct.pack(">f", -3.5)),
        JUNOS_LANE.format(2) + "/lane_laser_receiver_power_dbm": Typed("bytes_val", struct.pack(">d", -4.125)),
        "/system/state/tags": Typed("leaflist_val", ["a", 2, Typed("double_val", 0.5)]),  # leaflist_val
    }


def tgt(port: int, **kw: Any) -> Target:
    params = {"tls": {"enabled": False}, "sample_interval_s": 0.1, **kw.pop("params", {})}
    return Target(name=f"sw1-gnmi-{port}", device="sw1", protocol="gnmi", port=port,
                  params=params, timeout_s=kw.pop("timeout_s", 2.0), **kw)


def one(samples: list[Sample], metric: str, **labels: Any) -> float:
    hits = [s for s in samples if s.metric == metric and all(getattr(s, k) == v for k, v in labels.items())]
    assert len(hits) == 1, (metric, labels, hits)
    return hits[0].value


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def switch() -> Iterator[tuple[int, Any, dict[str, Any]]]:
    data = switch_data()
    with serve_gnmi(lambda: dict(data), clock_ns=lambda: 1_700_000_000_123_456_789) as (port, handle):
        yield port, handle, data


def test_every_typed_value_kind_round_trips_to_canonical_values(switch) -> None:
    port, _, _ = switch
    r = collect_gnmi(tgt(port), now_ms=0)
    assert r.ok, r.error
    s = r.samples
    assert one(s, "port_rx_bytes_total", port="Ethernet1") == 2**40 + 1
    assert one(s, "port_tx_bytes_total", port="Ethernet1") == 117389
    assert one(s, "port_rx_errors_total", port="Ethernet1") == 7
    assert one(s, "port_admin_up", port="Ethernet1") == 1
    assert one(s, "port_oper_up", port="Ethernet2") == 0
    assert one(s, "port_rx_discards_total", port="Ethernet3") == 5
    assert one(s, "port_tx_discards_total", port="Ethernet3") == 6
    assert one(s, "port_rx_bytes_total", port="Ethernet4") == 99
    assert one(s, "optic_rx_power_dbm", port="Ethernet1", lane=0) == -2.5           # double survives
    assert one(s, "optic_tx_power_dbm", port="Ethernet1", lane=0) == 1.15
    assert one(s, "optic_tx_bias_amperes", port="Ethernet1", lane=0) == pytest.approx(0.0065)
    assert one(s, "optic_rx_power_dbm", port="Ethernet1", lane=1) == -1.25
    assert one(s, "optic_tx_power_dbm", port="Ethernet1", lane=1) == 0.5
    assert one(s, "optic_temperature_celsius", port="Ethernet1") == 27.09375
    assert one(s, "device_temperature_celsius", port="TempSensor7") == 41.168000000000006
    assert {x.ts_ms for x in s} == {1_700_000_000_123}                             # device time, ns -> ms

    # bytes_val (Junos IEEE floats) and leaflist_val are outside the openconfig path set: Get them raw
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = gnmi_pb2_grpc.gNMIStub(ch)
        resp = stub.Get(gnmi_pb2.GetRequest(path=[path_to_proto("/interfaces/interface/optics"),
                                                  path_to_proto("/system/state/tags")]), timeout=2)
    leaves, problems = notification_leaves(resp.notification[0])
    m = map_notification(leaves, device="sw1")
    assert not problems and not m.problems
    assert one(m.samples, "optic_rx_power_dbm", port="et-0/0/0", lane=1) == -3.5
    assert one(m.samples, "optic_rx_power_dbm", port="et-0/0/0", lane=2) == -4.125
    assert decode_typed_value(resp.notification[1].update[0].val) == ["a", 2, 0.5]


@pytest.mark.serial
def test_get_poll_reports_paths_the_platform_lacks_as_warnings(switch) -> None:
    port, _, _ = switch
    r = get_collector("gnmi")(tgt(port), now_ms=0)
    assert r.ok and r.samples
    # e.g. the ethernet counters container is not served by this target
    assert any("/interfaces/interface/ethernet/state/counters" in w and "NOT_FOUND" in w for w in r.warnings)
    assert r.duration_s < 2.0


def test_capabilities(switch) -> None:
    port, _, _ = switch
    caps = capabilities(tgt(port))
    assert caps.version == "0.8.0" and "openconfig-interfaces" in caps.models and "JSON_IETF" in caps.encodings


def _collect_stream(t: Target, stop: threading.Event, **kw: Any) -> tuple[list[list[Sample]], list[str],
                                                                           threading.Thread]:
    batches: list[list[Sample]] = []
    errors: list[str] = []
    th = threading.Thread(target=stream_gnmi, args=(t, batches.append, stop),
                          kwargs={"on_error": errors.append, **kw}, daemon=True)
    th.start()
    return batches, errors, th


def _wait(cond: Any, timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return False


class Counting:
    """A provider whose in-octets grows by one per call and whose oper-status tests can flip."""

    def __init__(self) -> None:
        self.n = 0
        self.oper = "UP"
        self.lock = threading.Lock()

    def __call__(self) -> dict[str, Any]:
        with self.lock:
            self.n += 1
            return {IF.format("Ethernet1") + "/counters/in-octets": self.n,
                    IF.format("Ethernet1") + "/oper-status": self.oper}


def _values(batches: list[list[Sample]], metric: str) -> list[float]:
    return [s.value for b in list(batches) for s in b if s.metric == metric]


def test_stream_sample_mode_delivers_periodic_updates() -> None:
    prov = Counting()
    with serve_gnmi(prov) as (port, _):
        stop = threading.Event()
        batches, errors, th = _collect_stream(tgt(port, params={"sample_interval_s": 0.05}), stop)
        assert _wait(lambda: len(_values(batches, "port_rx_bytes_total")) >= 5), errors
        stop.set()
        th.join(3)
        assert not th.is_alive()
    vals = _values(batches, "port_rx_bytes_total")
    assert vals == sorted(vals) and len(set(vals)) >= 5
    ts = [s.ts_ms for b in batches for s in b if s.metric == "port_rx_bytes_total"]
    assert ts == sorted(ts)


def test_stream_on_change_delivers_oper_status_change() -> None:
    prov = Counting()
    with serve_gnmi(prov, change_poll_s=0.01) as (port, _):
        stop = threading.Event()
        # counters every 30 s: only the ON_CHANGE subscription can bring the flip in time
        batches, errors, th = _collect_stream(tgt(port, params={"sample_interval_s": 30}), stop)
        assert _wait(lambda: _values(batches, "port_oper_up") == [1.0]), errors
        with prov.lock:
            prov.oper = "LOWER_LAYER_DOWN"
        assert _wait(lambda: _values(batches, "port_oper_up") == [1.0, 0.0], timeout=2.0)
        stop.set()
        th.join(3)


def test_stream_reconnects_after_drop_and_loses_nothing_delivered() -> None:
    prov = Counting()
    with serve_gnmi(prov) as (port, handle):
        handle.drop_after = 4  # the first stream dies after 4 notifications
        stop = threading.Event()
        t0 = time.monotonic()
        batches: list[list[Sample]] = []
        at_drop: list[list[Sample]] = []

        errors: list[str] = []

        def on_error(msg: str) -> None:
            errors.append(msg)
            if not at_drop and "simulated stream drop" in msg:
                at_drop.extend(list(b) for b in batches)  # what had been delivered when it dropped

        th = threading.Thread(target=stream_gnmi, args=(tgt(port, params={"sample_interval_s": 0.05}),
                                                        batches.append, stop),
                              kwargs={"on_error": on_error, "backoff_initial_s": 0.2}, daemon=True)
        th.start()
        assert _wait(lambda: handle.streams_opened >= 2 and len(batches) >= 8), len(batches)
        reconnected_after = time.monotonic() - t0
        stop.set()
        th.join(3)
    assert any("simulated stream drop" in e and "unreachable" in e for e in errors)
    assert len(at_drop) == 4  # every notification sent before the drop reached the consumer
    assert batches[:4] == at_drop  # and none of it was retracted or reordered
    assert reconnected_after >= 0.2  # backed off before reconnecting
    vals = _values(batches, "port_rx_bytes_total")
    assert len(vals) >= 5 and vals == sorted(vals)  # the counter carries on after reconnect


def test_stream_backs_off_exponentially_while_target_is_down() -> None:
    t = tgt(free_port(), timeout_s=0.5)
    stop = threading.Event()
    _, errors, th = _collect_stream(t, stop, backoff_initial_s=0.1, backoff_max_s=1.0)
    time.sleep(1.0)
    stop.set()
    th.join(3)
    assert not th.is_alive()
    # attempts at ~0, 0.1, 0.3, 0.7 s: a handful, not a busy loop
    assert 2 <= len(errors) <= 6, errors
    assert all("unreachable" in e for e in errors)


def test_bad_password_is_a_clear_error_without_the_secret() -> None:
    with serve_gnmi(lambda: switch_data(), username="admin", password="s3cret") as (port, _):
        good = tgt(port, params={"username": "admin"}, secrets={"password": "s3cret"})
        bad = tgt(port, params={"username": "admin"}, secrets={"password": "hunter2"})
        assert collect_gnmi(good, now_ms=0).ok
        r = collect_gnmi(bad, now_ms=0)
    assert not r.ok and "authentication failed" in r.error and "'admin'" in r.error
    assert "hunter2" not in r.error and "hunter2" not in repr(bad)


@pytest.mark.serial
def test_unreachable_and_hanging_targets_time_out_and_do_not_stop_others() -> None:
    with serve_gnmi(lambda: switch_data()) as (good_port, _), \
            serve_gnmi(lambda: switch_data()) as (hang_port, hanging):
        hanging.hang = True
        targets = [tgt(free_port(), timeout_s=0.5), tgt(hang_port, timeout_s=0.5), tgt(good_port)]
        results = [collect_gnmi(t, now_ms=0) for t in targets]
    closed, hang, good = results
    assert "unreachable" in closed.error and closed.duration_s < 0.5
    assert "timed out after 0.5s" in hang.error and hang.duration_s < 0.5 + 0.3
    assert good.ok and good.samples


def test_garbled_value_becomes_a_warning_not_an_exception() -> None:
    data = {IF.format("Ethernet1") + "/counters/in-octets": "lots",
            IF.format("Ethernet1") + "/counters/out-octets": Typed("json_ietf_val", b"{broken"),
            IF.format("Ethernet1") + "/counters/in-errors": Typed("leaflist_val", [1, 2]),
            IF.format("Ethernet1") + "/counters/out-errors": 1}
    with serve_gnmi(lambda: data) as (port, _):
        r = collect_gnmi(tgt(port), now_ms=0)
    assert r.ok and one(r.samples, "port_tx_errors_total", port="Ethernet1") == 1
    text = "\n".join(r.warnings)
    assert "'lots' is not a number" in text and "json_ietf_val is not valid JSON" in text
    assert "list" in text


def _self_signed(tmp_path: Any) -> tuple[bytes, bytes, str]:
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sw1.test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=1)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("sw1.test")]), critical=False)
            .sign(key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    ca = tmp_path / "ca.pem"
    ca.write_bytes(cert_pem)
    return key_pem, cert_pem, str(ca)


def test_tls_with_ca_file_and_server_name(tmp_path: Any) -> None:
    key_pem, cert_pem, ca = _self_signed(tmp_path)
    with serve_gnmi(lambda: switch_data(), tls=(key_pem, cert_pem)) as (port, _):
        ok = tgt(port, params={"tls": {"enabled": True, "ca_file": ca, "server_name": "sw1.test"}})
        r = collect_gnmi(ok, now_ms=0)
        assert r.ok and one(r.samples, "optic_rx_power_dbm", port="Ethernet1", lane=0) == -2.5
        # plaintext against a TLS port fails cleanly, as does an unsupported skip_verify
        plain = collect_gnmi(tgt(port, timeout_s=1.0), now_ms=0)
        skip = collect_gnmi(tgt(port, params={"tls": {"skip_verify": True}}), now_ms=0)
    assert not plain.ok and "gNMI Get" in plain.error
    assert skip.error is not None and "skip_verify is not supported" in skip.error


def test_stream_from_a_stalled_target_is_dropped_and_retried() -> None:
    with serve_gnmi(lambda: switch_data()) as (port, hanging):
        hanging.hang = True
        stop = threading.Event()
        _, errors, th = _collect_stream(tgt(port, timeout_s=0.2, params={"sample_interval_s": 0.05}), stop,
                                        backoff_initial_s=0.05)
        assert _wait(lambda: len(errors) >= 2, timeout=3.0), errors
        stop.set()
        th.join(3)
    # the Get that discovers the paths before subscribing is the first to notice
    assert "timed out after 0.2s (target not answering)" in errors[0]
