"""docker-compose.yml stays correct: every service from the one image runs a real fabricwatch command."""

from __future__ import annotations

import yaml
from typer.main import get_command

from service.cli import app
from service.shards.topology import ShardSettings
from service.worker import collect_queue, detect_queue
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


def _spools(services: dict[str, dict], base: dict[str, dict]) -> dict[str, str]:
    """Each collecting worker (a `fabricwatch worker` not given detect queues alone) -> the volume its spool
    directory is mounted from; an override's service keeps the base's volumes unless it names its own."""
    out = {}
    for name, s in services.items():
        command = s.get("command", [])
        if command[:2] != ["fabricwatch", "worker"]:
            continue
        queues = command[command.index("-Q") + 1].split(",") if "-Q" in command else []
        if queues and all(q.startswith("detect.") for q in queues):
            continue
        spool = s["environment"]["FABRICWATCH_SPOOL_DIR"]
        volumes = s.get("volumes") or base.get(name, {}).get("volumes", [])
        out[name] = next((v.split(":")[0] for v in volumes if v.split(":")[1] == spool), "")
    return out


def test_collecting_workers_spool_on_a_volume() -> None:
    """A worker's spool holds what it collected while PostgreSQL was away: in the container's own filesystem
    (the default, under /tmp for a non-root user) a worker recreated during an outage would lose it."""
    base = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    over = yaml.safe_load((REPO / "docker-compose.shards.yml").read_text())["services"]
    merged = {name: {**base.get(name, {}), **s, "environment": {**base.get(name, {}).get("environment", {}),
                                                                 **s.get("environment", {})}}
              for name, s in over.items()}
    for services in (base, {**base, **merged}):
        spools = _spools(services, base)
        assert spools and all(spools.values()), spools
        assert len(set(spools.values())) == len(spools), "one spool volume per collecting worker"
    assert "install -d -o fabricwatch -m 0700 /var/lib/fabricwatch/spool" in (REPO / "Dockerfile").read_text()


def test_two_shard_override_is_a_valid_topology() -> None:
    """docker-compose.shards.yml: every fabricwatch process gets the same topology, which the settings accept;
    each shard has its database, one worker consuming its collection queue and one its detection queue; the
    default worker leaves those queues to them."""
    base = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    over = yaml.safe_load((REPO / "docker-compose.shards.yml").read_text())["services"]
    cli = get_command(app)
    ours = {name for name, s in base.items() if s.get("image") == "fabricwatch:local"}
    ours |= {name for name, s in over.items() if s.get("image") == "fabricwatch:local"}
    envs = {name: over[name]["environment"] for name in ours}
    assert all(env == envs["api"] for env in envs.values()), "one topology for every process"
    env = envs["api"]
    shards = ShardSettings(urls=env["FABRICWATCH_SHARDS_URLS"], pods=env["FABRICWATCH_SHARDS_PODS"],
                           default=env["FABRICWATCH_SHARDS_DEFAULT"])  # the JSON the settings read, validated
    for shard, url in shards.urls.items():
        host = url.split("@", 1)[1].split(":", 1)[0]
        assert host in over and over[host]["image"].startswith("postgres:"), (shard, host)
    named = {tuple(s["command"]) for name, s in over.items() if name in ours and "-Q" in s.get("command", [])}
    for shard in shards.urls:
        assert ("fabricwatch", "worker", "-Q", detect_queue(shard), "-c", "1") in named
        assert ("fabricwatch", "worker", "-Q", collect_queue(shard)) in named
    assert over["worker"]["command"] == ["fabricwatch", "worker", "-Q", "fabricwatch"]
    for name in ours:
        command = over.get(name, {}).get("command") or base[name]["command"]
        assert command[1] in cli.commands, command  # type: ignore[attr-defined]
    for name, s in over.items():  # every service the override names exists in one of the files
        assert name in base or "image" in s, name
