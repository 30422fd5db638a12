"""Secret references resolve from env and files; errors name the reference, never the value."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine, select, text

from service.db import session_scope
from service.inventory import models
from service.inventory.loader import load_inventory_file
from service.inventory.schemas import Endpoint, SecretRef
from service.inventory.secrets import SecretError, resolve_secret, target_for
from service.inventory.service import upsert_inventory
from tests.paths import REPO

SECRET = "s3cr3t-Value-!@#"  # a value that must never appear in an error or in the database


def test_resolve_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FW_TEST_COMMUNITY", SECRET)
    assert resolve_secret(SecretRef(env="FW_TEST_COMMUNITY")) == SECRET
    monkeypatch.delenv("FW_TEST_COMMUNITY")
    with pytest.raises(SecretError) as info:
        resolve_secret(SecretRef(env="FW_TEST_COMMUNITY"))
    assert str(info.value) == "secret env:FW_TEST_COMMUNITY: environment variable FW_TEST_COMMUNITY is not set"
    monkeypatch.setenv("FW_TEST_COMMUNITY", "")
    with pytest.raises(SecretError, match="is empty"):
        resolve_secret(SecretRef(env="FW_TEST_COMMUNITY"))


def test_resolve_from_file(tmp_path: Path) -> None:
    path = tmp_path / "pw"
    path.write_text(SECRET + "\n")  # the trailing newline of `echo x > file` is not part of it
    assert resolve_secret(SecretRef(file=str(path))) == SECRET
    missing = tmp_path / "nope"
    with pytest.raises(SecretError) as info:
        resolve_secret(SecretRef(file=str(missing)))
    assert str(info.value) == f"secret file:{missing}: cannot read {missing}: No such file or directory"
    path.write_text("\n")
    with pytest.raises(SecretError, match="is empty"):
        resolve_secret(SecretRef(file=str(path)))


def test_target_for_schema_endpoints(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    key = tmp_path / "priv"
    key.write_text("priv-" + SECRET)
    monkeypatch.setenv("FW_AUTH", "auth-" + SECRET)
    ep = Endpoint.model_validate({
        "protocol": "snmp", "address": "10.0.0.2", "version": "3", "timeout_s": 3, "retries": 2,
        "v3": {"user": "fw", "auth_key": {"env": "FW_AUTH"}, "priv_key": {"file": str(key)}}})
    t = target_for(ep, "leaf2")
    assert (t.name, t.device, t.protocol, t.address, t.timeout_s, t.retries) == (
        "leaf2/snmp", "leaf2", "snmp", "10.0.0.2", 3.0, 2)
    assert t.secrets == {"auth_key": "auth-" + SECRET, "priv_key": "priv-" + SECRET}
    assert t.params["version"] == "3"
    assert "v3" not in t.params
    assert (t.params["user"], t.params["auth_protocol"], t.params["priv_protocol"]) == ("fw", "sha256", "aes")
    assert SECRET not in repr(t) and SECRET not in t.model_dump_json()

    monkeypatch.delenv("FW_AUTH")
    with pytest.raises(SecretError) as info:
        target_for(ep, "leaf2")
    assert "leaf2/snmp" in str(info.value) and "FW_AUTH" in str(info.value)
    assert SECRET not in str(info.value)


def test_targets_from_loaded_rows_keep_references_only(db: Engine, monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    monkeypatch.setenv("FABRICWATCH_SNMP_COMMUNITY", "community-" + SECRET)
    inv = load_inventory_file(REPO / "examples" / "inventory" / "small-fabric.yaml")
    with session_scope(db) as s:
        upsert_inventory(session=s, inventory=inv)
    with db.connect() as c:
        stored = c.execute(text("SELECT string_agg(config::text, ' ') FROM endpoints")).scalar_one()
    assert SECRET not in stored and '"env": "FABRICWATCH_SNMP_COMMUNITY"' in stored

    with session_scope(db) as s:
        rows = {r.target_name: r for r in s.scalars(select(models.Endpoint))}
        assert set(rows) == {"spine1/gnmi", "leaf1/snmp", "leaf2/snmp", "gpu-a01/host", "gpu-a02/host"}
        leaf1 = target_for(rows["leaf1/snmp"])
        assert leaf1.secrets == {"community": "community-" + SECRET}
        assert leaf1.params == {"version": "2c", "max_repetitions": 25, "intervals": {}}
        host = target_for(rows["gpu-a01/host"])
        assert (host.port, host.params["sysfs_root"], host.secrets) == (9910, "/sys", {})
        # the gNMI password file of the example does not exist here: a clear, value-free error
        with pytest.raises(SecretError, match=r"spine1/gnmi: secret file:/etc/fabricwatch/secrets/gnmi-password"):
            target_for(rows["spine1/gnmi"])
