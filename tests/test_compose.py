"""docker-compose.yml stays correct: every service from the one image runs a real fabricwatch command."""

from __future__ import annotations

import yaml
from typer.main import get_command

from service.cli import app
from tests.paths import REPO


def test_compose_services_and_commands() -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"postgres", "redis", "api", "worker", "beat", "grafana"} <= set(services)
    cli = get_command(app)
    ours = [s for s in services.values() if s.get("image") == "fabricwatch:local"]
    assert {tuple(s["command"][:2]) for s in ours} >= {("fabricwatch", "serve"), ("fabricwatch", "worker"),
                                                       ("fabricwatch", "beat"), ("fabricwatch", "db")}
    for s in ours:
        assert s["command"][1] in cli.commands, s["command"]  # type: ignore[attr-defined]
        assert s["environment"]["FABRICWATCH_DATABASE_URL"].startswith("postgresql://")
        assert s["environment"]["FABRICWATCH_REDIS_URL"].startswith("redis://")
        # every process that stores or sends webhook secrets needs the sealing key; compose refuses to start
        # without one rather than run with webhooks that cannot be saved
        assert s["environment"]["FABRICWATCH_SECRETS_KEY"].startswith("${FABRICWATCH_SECRETS_KEY:?")
    for volume in services["grafana"]["volumes"]:
        src = volume.split(":")[0]
        if src.startswith("./"):
            assert (REPO / src).exists(), src


def test_dockerfile_copies_every_package() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    for package in ("service", "collectors", "simulator", "migrations"):
        assert f"COPY {package} {package}" in dockerfile
