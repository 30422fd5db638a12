"""Executors: exact argv (never a shell), hostile values refused, webhook signed, and OFF by default."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from service.config import SettingsError, get_settings
from service.drains import executors
from service.drains.executors import CommandExecutor, TemplateError, WebhookExecutor, plan_commands, render
from service.drains.schemas import DrainSettings, drain_settings
from service.notify.signing import verify
from tests.receiver import Receiver


def _steps() -> tuple[list[list[dict[str, Any]]], Any]:
    """A progress callback that keeps every report (a copy of the steps as they were)."""
    seen: list[list[dict[str, Any]]] = []
    return seen, lambda steps: seen.append([dict(s) for s in steps])


def test_off_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(__import__("os").environ):
        if k.startswith("FABRICWATCH_DRAIN_"):
            monkeypatch.delenv(k)
    s = drain_settings()
    assert s.executor == "none" and s.command_shut_port is None
    assert isinstance(executors.get_executor(s), executors.NoExecutor)
    assert executors.get_executor(s).execute({"id": 1}, lambda steps: None)["ok"] is False


def test_settings_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FABRICWATCH_DRAIN_MAX_PER_POD", "3")
    monkeypatch.setenv("FABRICWATCH_DRAIN_EXECUTOR", "command")
    monkeypatch.setenv("FABRICWATCH_DRAIN_COMMAND_SHUT_PORT", '["/usr/local/bin/port-shut", "{device}", "{port}"]')
    s = drain_settings()
    assert s.max_per_pod == 3 and s.executor == "command"
    assert s.command_shut_port == ["/usr/local/bin/port-shut", "{device}", "{port}"]
    monkeypatch.setenv("FABRICWATCH_DRAIN_COMMAND_SHUT_PORT", "port-shut {device} {port}")
    get_settings.cache_clear()  # settings are read once per process
    with pytest.raises(SettingsError, match="^setting FABRICWATCH_DRAIN_COMMAND_SHUT_PORT: "):
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
    with pytest.raises(TemplateError, match=r"^setting FABRICWATCH_DRAIN_COMMAND_K8S_CORDON: unknown placeholder "
                                            r"\{nope\} \(known: host, node\)$"):
        plan_commands(action="k8s_drain", settings=DrainSettings(command_k8s_cordon=["kubectl", "{nope}"]),
                      host="gpu-1")


def test_command_executor_runs_argv_without_a_shell(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[list[str], dict[str, Any]]] = []
    real = subprocess.run

    def spy(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        seen.append((argv, kw))
        return real(argv, **kw)

    monkeypatch.setattr(executors.subprocess, "run", spy)
    argv = [sys.executable, "-c", "import sys, json; print(json.dumps(sys.argv[1:]))", "leaf-1", "Ethernet1/5"]
    reports, progress = _steps()
    out = CommandExecutor(DrainSettings()).execute({"id": 3, "commands": [{"argv": argv}]}, progress)
    assert out["ok"] and out["known"] and out["rc"] == 0
    # reported before it ran (started, no end) and after (its exit status and output)
    assert "rc" not in reports[0][0] and reports[0][0]["argv"] == argv and "started_at" in reports[0][0]
    assert json.loads(reports[-1][0]["stdout"]) == ["leaf-1", "Ethernet1/5"] and "finished_at" in reports[-1][0]
    assert seen[0][0] == argv and seen[0][1]["shell"] is False


def test_command_executor_stops_at_the_first_failure() -> None:
    fail = {"argv": [sys.executable, "-c", "raise SystemExit(3)"]}
    never = {"argv": [sys.executable, "-c", "print('ran')"]}
    reports, progress = _steps()
    out = CommandExecutor(DrainSettings()).execute({"commands": [fail, never]}, progress)
    assert not out["ok"] and out["known"] and out["rc"] == 3 and (out["steps_run"], out["steps_total"]) == (1, 2)
    assert len(reports[-1]) == 1


def test_a_command_killed_at_its_time_out_is_not_known_to_have_failed() -> None:
    """Killed half-way, a command may have done its work: the outcome says it is not known."""
    hang = {"argv": [sys.executable, "-c", "import time; print('cordoned', flush=True); time.sleep(30)"]}
    reports, progress = _steps()
    out = CommandExecutor(DrainSettings(command_timeout_s=1)).execute({"commands": [hang]}, progress)
    assert not out["ok"] and out["known"] is False and "timed out after 1 s" in out["error"]
    assert reports[-1][0]["rc"] is None and reports[-1][0]["stdout"].startswith("cordoned")


def test_webhook_executor_signs_as_notifications_do(monkeypatch: pytest.MonkeyPatch) -> None:
    """A real receiver on 127.0.0.1: the v1 timestamped signature of service/notify/signing.py (verify() takes
    it, and refuses it once it is older than the tolerance), and the execution's idempotency key."""
    monkeypatch.setenv("FW_TEST_DRAIN_KEY", "s3cret")
    receiver = Receiver().start()
    receiver.script.append((202, {}))
    try:
        s = DrainSettings(executor="webhook", webhook_url=receiver.url + "/drains",
                          webhook_secret_env="FW_TEST_DRAIN_KEY")
        reports, progress = _steps()
        out = WebhookExecutor(s).execute({"id": 9, "action": "slurm_drain", "commands": [], "execution_id": 4,
                                          "idempotency_key": "drain-9-1"}, progress)
        req = receiver.wait_for(1, timeout_s=10)[0]
    finally:
        receiver.stop()
    assert out["ok"] and out["known"] and out["status"] == 202 and reports[-1][0]["status"] == 202
    h = req.headers
    assert verify("s3cret", h["x-fabricwatch-timestamp"], h["x-fabricwatch-signature"], req.body)
    assert h["x-fabricwatch-signature"].startswith("v1=")
    assert not verify("s3cret", h["x-fabricwatch-timestamp"], h["x-fabricwatch-signature"], req.body,
                      now=int(h["x-fabricwatch-timestamp"]) + 301)   # a replay ages out
    assert h["idempotency-key"] == "drain-9-1" and h["x-fabricwatch-event"] == "drain.approved"
    body = json.loads(req.body)
    assert body["drain"]["action"] == "slurm_drain" and body["execution"] == {"id": 4, "key": "drain-9-1"}
    assert "execution_id" not in body["drain"]


def test_webhook_executor_says_when_the_outcome_is_unknown() -> None:
    """Refused connection: nothing was sent, a known failure. No answer in time: the receiver may have acted."""
    receiver = Receiver().start()
    port = receiver.port
    receiver.stop()
    refused = WebhookExecutor(DrainSettings(executor="webhook", webhook_url=f"http://127.0.0.1:{port}/x"))
    out = refused.execute({"id": 1, "execution_id": 1, "idempotency_key": "drain-1-1"}, lambda steps: None)
    assert not out["ok"] and out["known"] and "ConnectError" in out["error"]
    slow = Receiver().start()
    slow.delay_s = 3
    try:
        ex = WebhookExecutor(DrainSettings(executor="webhook", webhook_url=slow.url + "/x", webhook_timeout_s=0.5))
        out = ex.execute({"id": 1, "execution_id": 2, "idempotency_key": "drain-1-2"}, lambda steps: None)
    finally:
        slow.stop()
    assert not out["ok"] and out["known"] is False and "ReadTimeout" in out["error"]
