"""The gNMI collector against a second server not written here: finsy's test server (PyPI finsy).

Its answers are Stratum's (ONF's NOS on a bmv2 switch, ports s1-eth1 and s1-eth2), recorded by
finsy's author, and it cannot be configured (tests/collectors/gnmi_servers.py says what it does).
It is the kind of target a new user meets: it advertises `openconfig-interfaces-stratum` and
PROTO only, answers every Get with the same `state/ifindex` leaves, and after five SAMPLE
notifications keeps the stream open and sends nothing more. The collector must say all of that
instead of reporting itself healthy.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from collectors.base import Target
from collectors.gnmi import collect_gnmi, stream_gnmi
from service.telemetry.samples import Sample
from tests.collectors.gnmi_servers import stratum_server


@pytest.fixture(scope="module")
def stratum() -> Iterator[int]:
    with stratum_server() as port:
        yield port


def tgt(port: int, **kw: float) -> Target:
    return Target(name="s1/gnmi", device="s1", protocol="gnmi", port=port, timeout_s=kw.get("timeout_s", 2.0),
                  params={"tls": False, "sample_interval_s": kw.get("interval", 0.5)})


def test_poll_that_answers_only_unrelated_leaves_fails_with_every_path_named(stratum: int) -> None:
    r = collect_gnmi(tgt(stratum), now_ms=1_000)
    assert not r.ok and not r.samples
    assert "no path answered" in (r.error or "")
    # what Stratum advertises is read and used: PROTO is the only encoding it offers
    caps = r.discovery["capabilities"]
    assert caps == {"version": "0.7.0", "encodings": ["PROTO"], "models": ["openconfig-interfaces-stratum"]}
    assert r.discovery["encoding"] == "PROTO"
    # each path of the set is named, with the model the target advertises instead
    counters = next(w for w in r.warnings if w.startswith("/interfaces/interface/state/counters: "))
    assert "nothing answered, as written, with wildcard keys or at a parent prefix" in counters
    assert "advertises openconfig-interfaces-stratum" in counters
    assert any(w.startswith("/interfaces/interface/state/oper-status: nothing answered") for w in r.warnings)
    # remembered as answering nothing, so the next poll does not rediscover them at once
    assert r.discovery["paths"]["/interfaces/interface/state/counters"]["path"] is None


def test_stream_delivers_stratum_counters_then_is_stalled_and_reconnected(stratum: int) -> None:
    samples: list[Sample] = []
    states: list[tuple[str, str]] = []
    errors: list[str] = []
    stop = threading.Event()
    target = tgt(stratum, timeout_s=1.0, interval=0.2)
    th = threading.Thread(target=stream_gnmi, args=(target, samples.extend, stop), daemon=True,
                          kwargs={"on_error": errors.append, "on_state": lambda s, r: states.append((s, r)),
                                  "backoff_initial_s": 0.2})
    th.start()
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and [s for s, _ in states].count("streaming") < 2:
            time.sleep(0.05)
    finally:
        stop.set()
        th.join(5)
    kinds = [s for s, _ in states]
    # data, then silence on an open stream (stalled, not alive), then a new stream with data again
    assert kinds[0] == "streaming" and "stalled" in kinds, (states, errors[-3:])
    first_stall = kinds.index("stalled")
    assert "streaming" in kinds[first_stall:], (states, errors[-3:])
    stalled = states[first_stall][1]
    assert "no data for 1.6s" in stalled and "0 notifications without samples" in stalled
    # Stratum's recorded in-octets: 1196 on both ports, at the notification's own timestamps
    first = samples[:5]
    assert [(s.metric, s.port, s.value) for s in first] == \
        [("port_rx_bytes_total", p, 1196.0) for p in ("s1-eth1", "s1-eth2", "s1-eth1", "s1-eth2", "s1-eth1")]
    assert first[0].ts_ms == 1656728002678 and first[0].device == "s1"
    # the paths nothing answered with Get are said once per connection, not silently subscribed
    assert any(e.startswith("/interfaces/interface/state/counters: nothing answered") for e in errors)
