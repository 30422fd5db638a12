"""Small helpers that put inventory rows straight into the test database."""

from __future__ import annotations

from sqlalchemy import Engine, text


def add_hosts(engine: Engine, hosts: int, ports: int = 8, prefix: str = "h") -> list[str]:
    """Insert `hosts` GPU hosts with ports eth0..eth{ports-1}; returns the device names."""
    names = [f"{prefix}-{i:03d}" for i in range(hosts)]
    with engine.begin() as conn:
        for name in names:
            dev_id = conn.execute(text(
                "INSERT INTO devices (name, kind, role, gpus) VALUES (:n, 'host', 'host', 8) RETURNING id"),
                {"n": name}).scalar_one()
            conn.execute(text("INSERT INTO ports (device_id, name, rail, gpu) VALUES (:d, :p, :r, :r)"),
                         [{"d": dev_id, "p": f"eth{j}", "r": j} for j in range(ports)])
    return names
