"""Executors: exact argv (never a shell), hostile values refused, webhook signed, and OFF by default."""

from __future__ import annotations

import hashlib
import hmac
import json
import subprocess
import sys
from typing import Any

import httpx
import pytest

from service.drains import executors
from service.drains.executors import CommandExecutor, TemplateError, WebhookExecutor, plan_commands, render
from service.drains.schemas import DrainSettings, drain_settings


def test_off_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(__import__("os").environ):
        if k.startswith("FABRICWATCH_DRAIN_"):
            monkeypatch.delenv(k)
    s = drain_settings()
    assert s.executor == "none" and s.command_shut_port is None
    assert isinstance(executors.get_executor(s), executors.NoExecutor)
    assert executors.get_executor(s).execute({"id": 1})["ok"] is False


def test_settings_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FABRICWATCH_DRAIN_MAX_PER_POD", "3")
    monkeypatch.setenv("FABRICWATCH_DRAIN_EXECUTOR", "command")
    monkeypatch.setenv("FABRICWATCH_DRAIN_COMMAND_SHUT_PORT", '["/usr/local/bin/port-shut", "{device}", "{port}"]')
    s = drain_settings()
    assert s.max_per_pod == 3 and s.executor == "command"
    assert s.command_shut_port == ["/usr/local/bin/port-shut", "{device}", "{port}"]
    monkeypatch.setenv("FABRICWATCH_DRAIN_COMMAND_SHUT_PORT", "port-shut {device} {port}")
    with pytest.raises(ValueError):
        drain_settings()   # a shell-like string is not a template


def test_slurm_and_kubernetes_argv() -> None:
    s = DrainSettings()
    slurm = plan_commands(action="slurm_drain", settings=s, host="host-p1-00001", incident="incident-7",
                          cause="connector_contamination")
    assert slurm == [{"argv": ["scontrol", "update", "NodeName=host-p1-00001", "State=DRAIN",
                               "Reason=fabricwatch: incident-7 connector_contamination"],
                      "display": "scontrol update NodeName=host-p1-00001 State=DRAIN "
                                 "'Reason=fabricwatch: incident-7 connector_contamination'"}]
    k8s = plan_commands(action="k8s_drain", settings=s, host="gpu-node-3")
    assert [c["argv"] for c in k8s] == [
        ["kubectl", "cordon", "gpu-node-3"],
        ["kubectl", "drain", "gpu-node-3", "--ignore-daemonsets", "--delete-emptydir-data"]]
    assert plan_commands(action="shut_ports", settings=s, ports=[("leaf-1", "Ethernet1/5")]) == []
    shut = DrainSettings(command_shut_port=["port-shut", "--device={device}", "{port}"])
    assert [c["argv"] for c in plan_commands(action="shut_ports", settings=shut,
                                             ports=[("leaf-1", "Ethernet1/5"), ("spine-1", "swp3")])] == [
        ["port-shut", "--device=leaf-1", "Ethernet1/5"], ["port-shut", "--device=spine-1", "swp3"]]


@pytest.mark.parametrize("value", ["-rf", "--all", "a b", "x;reboot", "$(id)", "a\nb", "`id`", "", "a'b"])
def test_hostile_values_are_refused(value: str) -> None:
    with pytest.raises(TemplateError, match="unsafe value"):
        render(["kubectl", "cordon", "{node}"], {"node": value})


def test_unknown_placeholder_is_refused() -> None:
    with pytest.raises(TemplateError, match="unknown placeholder"):
        render(["x", "{nope}"], {"node": "a"})


def test_command_executor_runs_argv_without_a_shell(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[list[str], dict[str, Any]]] = []
    real = subprocess.run

    def spy(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        seen.append((argv, kw))
        return real(argv, **kw)

    monkeypatch.setattr(executors.subprocess, "run", spy)
    argv = [sys.executable, "-c", "import sys, json; print(json.dumps(sys.argv[1:]))", "leaf-1", "Ethernet1/5"]
    out = CommandExecutor(DrainSettings()).execute({"id": 3, "commands": [{"argv": argv}]})
    assert out["ok"] and json.loads(out["results"][0]["stdout"]) == ["leaf-1", "Ethernet1/5"]
    assert seen[0][0] == argv and seen[0][1]["shell"] is False


def test_command_executor_stops_at_the_first_failure() -> None:
    fail = {"argv": [sys.executable, "-c", "raise SystemExit(3)"]}
    never = {"argv": [sys.executable, "-c", "print('ran')"]}
    out = CommandExecutor(DrainSettings()).execute({"commands": [fail, never]})
    assert not out["ok"] and len(out["results"]) == 1 and out["results"][0]["rc"] == 3


def test_webhook_executor_signs_the_body(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FW_TEST_DRAIN_KEY", "s3cret")
    got: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        got.append(request)
        return httpx.Response(202, text="queued")

    s = DrainSettings(executor="webhook", webhook_url="https://automation.example/drains",
                      webhook_secret_env="FW_TEST_DRAIN_KEY")
    ex = WebhookExecutor(s, client=httpx.Client(transport=httpx.MockTransport(handler)))
    out = ex.execute({"id": 9, "action": "slurm_drain", "commands": []})
    assert out == {"executor": "webhook", "ok": True, "status": 202, "response": "queued"}
    req = got[0]
    want = hmac.new(b"s3cret", req.content, hashlib.sha256).hexdigest()
    assert req.headers["x-fabricwatch-signature"] == f"sha256={want}"
    assert req.headers["idempotency-key"] == "drain-9"
    assert json.loads(req.content)["drain"]["action"] == "slurm_drain"
