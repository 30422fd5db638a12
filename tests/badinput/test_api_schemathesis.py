"""schemathesis over the whole OpenAPI document, as served: auth on (an admin token), in-process ASGI, a small
seeded fabric, 100 examples per operation (positive and negative, a third of them on seeded ids).
No answer may be a 5xx, and every 4xx must be application/problem+json.

Left out: GET /api/v1/events, an endless stream (its `kinds` filter is tested in tests/api/test_openapi.py).
Nothing leaves the machine: webhook URLs may only name 127.0.0.0/8 (FABRICWATCH_WEBHOOK_DENY holds every
other address), and name lookups other than localhost fail here, as on a site without DNS; the one seeded
webhook points at a receiver on 127.0.0.1.

(The schemathesis pytest plugin does not load under this pytest, so operations are iterated here and each
one's strategies run with hypothesis directly, as in test_api_fuzz.py.)
"""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, text

from collectors.base import CollectResult, Neighbor
from service.auth.service import create_token
from service.config import load_settings
from service.telemetry.targets import record_neighbors, record_status
from tests.api import fabric_seed
from tests.badinput import full_app
from tests.faults.peers import load_inventory
from tests.receiver import Receiver

# About 2 CPU-minutes in all, split in PARTS (every PARTS-th operation) so that parallel test workers share it;
# the wall time doubles on a busy 2-core machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

EXAMPLES = 100
PARTS = 4
SKIP = {("GET", "/api/v1/events")}
# Every address but loopback: webhooks can be made and fired only towards 127.0.0.0/8.
_NOT_LOOPBACK = [*ipaddress.ip_network("0.0.0.0/0").address_exclude(ipaddress.ip_network("127.0.0.0/8")),
                 *ipaddress.ip_network("::/0").address_exclude(ipaddress.ip_network("::1/128"))]


@pytest.fixture()
def loopback_names_only(monkeypatch: pytest.MonkeyPatch) -> None:
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else str(host)
        if name not in ("localhost", "127.0.0.1", "::1"):
            raise socket.gaierror(socket.EAI_NONAME, f"{name}: no name lookups in this test")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


@pytest.fixture()
def receiver() -> Iterator[Receiver]:
    r = Receiver().start()
    yield r
    r.stop()


def _seed(db: Engine, db_url: str, client: TestClient, hook_url: str) -> tuple[dict[str, str], dict[str, Any]]:
    """A small fabric with telemetry, alerts, a drain, NCCL runs, incidents, targets with a status, LLDP,
    a silence, a maintenance window and a webhook. Returns an admin token's headers, and an id of each kind
    for the path parameters."""
    seeded = fabric_seed.seed_fabric(db)
    alerts = fabric_seed.seed_alerts(db, int(seeded.end_s * 1000))
    drain = fabric_seed.seed_drain(db, seeded.end_s, alerts[0])
    nccl = fabric_seed.seed_nccl_runs(db, seeded.end_s)
    incidents = fabric_seed.seed_incident_timeline(db, fabric_seed.INCIDENT_SCRIPT[:2])
    load_inventory(db_url, [{"name": "fz-leaf", "kind": "switch", "role": "leaf", "pod": "p1",
                             "ports": [{"name": "Ethernet1"}, {"name": "Ethernet2"}],
                             "endpoints": [{"protocol": "snmp", "community": {"env": "FZ_COMMUNITY"}},
                                           {"protocol": "gnmi", "port": 6030}]}])
    now = datetime.now(UTC)
    with db.begin() as conn:
        dev = conn.execute(text("SELECT id FROM devices WHERE name = 'fz-leaf'")).scalar_one()
        snmp, gnmi = conn.execute(text("SELECT id FROM endpoints WHERE device_id = :d ORDER BY protocol DESC"),
                                  {"d": dev}).scalars().all()
        record_status(conn, endpoint_id=snmp, result=CollectResult("fz-leaf/snmp", warnings=["a warning"],
                                                                   duration_s=0.2), stored=12, at=now)
        record_status(conn, endpoint_id=gnmi, result=CollectResult("fz-leaf/gnmi", error="timed out"),
                      stored=0, at=now)
        record_neighbors(conn, device_id=dev, at=now, result=CollectResult("fz-leaf/snmp", neighbors=[
            Neighbor("Ethernet1", "spine-01", "Ethernet1/9"), Neighbor("Ethernet2", "not-in-inventory", "x")]))
        headers = {"Authorization": f"Bearer {create_token(conn, name='schemathesis', scopes=['admin'])}"}
    until = (now + timedelta(days=1)).isoformat()
    silence = client.post("/api/v1/silences", headers=headers, json={
        "matchers": [{"name": "device", "value": "leaf-p1-r0-01"}], "ends_at": until, "comment": "seed"})
    window = client.post("/api/v1/maintenance", headers=headers, json={
        "device": "leaf-p1-r0-01", "ends_at": until, "comment": "seed"})
    hook = client.post("/api/v1/webhooks", headers=headers, json={"name": "seed", "url": hook_url})
    assert [r.status_code for r in (silence, window, hook)] == [201, 201, 201], (silence.text, window.text, hook.text)
    return headers, {"alert_id": alerts[0], "drain_id": drain, "run_id": nccl.latest_run_id,
                     "incident_id": incidents[0], "silence_id": silence.json()["id"], "window_id": window.json()["id"],
                     "webhook_id": hook.json()["id"], "name": "leaf-p1-r0-01"}


def _operations(app: Any) -> list[Any]:
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    ops = [result.ok() for result in schema.get_all_operations()]
    return [op for op in ops if (op.method.upper(), op.path) not in SKIP]


def test_schemathesis_reaches_every_operation(db_url: str) -> None:
    """The document the parts below share out (each takes every PARTS-th operation) lists them all."""
    assert len(_operations(full_app(load_settings(database_url=db_url)))) >= 55


@pytest.mark.parametrize("part", range(PARTS))
def test_schemathesis_finds_no_5xx_and_only_problem_4xx(db: Engine, db_url: str, loopback_names_only: None,
                                                        receiver: Receiver, monkeypatch: pytest.MonkeyPatch,
                                                        part: int) -> None:
    # service.notify reads its settings from the environment, afresh each time
    monkeypatch.setenv("FABRICWATCH_WEBHOOK_ALLOW", "127.0.0.0/8")
    monkeypatch.setenv("FABRICWATCH_WEBHOOK_DENY", ",".join(map(str, _NOT_LOOPBACK)))
    monkeypatch.setenv("FABRICWATCH_WEBHOOK_TIMEOUT_S", "2")
    app = full_app(load_settings(database_url=db_url))
    with TestClient(app) as client:
        headers, ids = _seed(db, db_url, client, receiver.url + "/hook")
    failures: list[str] = []
    statuses: dict[int, int] = {}
    operations, slowest = 0, (0.0, "")
    t_all = time.monotonic()
    for op in _operations(app)[part::PARTS]:
        operations += 1
        strategies = [op.as_strategy(schemathesis.GenerationMode.POSITIVE),
                      op.as_strategy(schemathesis.GenerationMode.NEGATIVE)]
        known = {p.name: ids[p.name] for p in op.path_parameters if p.name in ids}
        if known:  # reach the handlers behind the 404s with ids that exist
            strategies.append(op.as_strategy(schemathesis.GenerationMode.POSITIVE, path_parameters=known))

        @given(case=st.one_of(strategies))
        @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        def check(case: schemathesis.Case) -> None:
            # Our token, not one the negative mode made up (tests/api/test_api_edge.py covers bad tokens).
            case.headers = {**{k: v for k, v in (case.headers or {}).items() if k.lower() != "authorization"},
                            **headers}
            try:
                r = case.call()
            except Exception as exc:  # the in-process client re-raises what would be a 500
                first = str(exc).splitlines()[0][:160] if str(exc) else ""
                failures.append(f"{case.method} {case.formatted_path} -> 500 {type(exc).__name__}: {first}")
                return
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            ctype = r.headers.get("content-type", "")
            ctype = ctype[0] if isinstance(ctype, list) else ctype
            if r.status_code >= 500 or (400 <= r.status_code < 500 and not ctype.startswith("application/problem")):
                failures.append(f"{case.method} {case.formatted_path} -> {r.status_code} {ctype} {r.text[:200]!r}")

        t0 = time.monotonic()
        check()
        slowest = max(slowest, (time.monotonic() - t0, f"{op.method.upper()} {op.path}"))
    elapsed = time.monotonic() - t_all
    print(f"\nschemathesis: {operations} operations x {EXAMPLES} examples in {elapsed:.0f} s "
          f"(slowest {slowest[1]} {slowest[0]:.0f} s); statuses {dict(sorted(statuses.items()))}")
    assert operations >= 55 // PARTS
    assert statuses.get(200, 0) + statuses.get(201, 0) > operations  # the seeded ids reach the handlers
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(sorted(set(failures))[:40])
