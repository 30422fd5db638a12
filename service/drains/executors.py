"""Execution plugins for approved drains. OFF by default (`executor = "none"`).

- `command`: runs argv lists rendered from JSON-array templates with `subprocess.run(argv)`:
  no shell, each inventory value fills one whole argument (or part of one) and is checked
  first, so a hostile name can neither split into more arguments nor pose as an option.
- `webhook`: POSTs the drain (with its rendered commands) as JSON to a site automation endpoint,
  signed as notifications are (service/notify/signing.py: timestamped HMAC, `v1=`), with the
  execution's idempotency key.

Executors only run; service/drains/execution.py decides when (once, from a worker, outside any
transaction) and records what happened. Every outcome says whether it is `known`: a command killed at
its time-out, or a webhook whose answer never came, may or may not have taken effect.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

import httpx

from service.drains.schemas import DrainAction, DrainSettings
from service.notify.signing import DELIVERY_HEADER, EVENT_HEADER, IDEMPOTENCY_HEADER, sign_headers

_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")
_SAFE_VALUE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+\-]{0,255}$")
TAIL = 2000   # characters of output (stdout, stderr, a response body) kept per step
USER_AGENT = "fabricwatch-drain/1"

Progress = Callable[[list[dict[str, Any]]], None]


class TemplateError(ValueError):
    pass


def _setting(field: str) -> str:
    return f"FABRICWATCH_DRAIN_{field.upper()}"


def render(template: Sequence[str], values: Mapping[str, str], field: str | None = None) -> list[str]:
    """One argv from a template: placeholders are replaced inside their own element, nothing is split.

    `field` (e.g. "command_slurm_drain") names the setting in the error, so a bad template says where it is."""
    where = f"setting {_setting(field)}: " if field else ""
    for name, value in values.items():
        # Inventory names never start with '-' or hold control characters; refuse anything else.
        if not _SAFE_VALUE.match(value):
            raise TemplateError(f"{where}unsafe value for {{{name}}}: {value!r}")

    def sub(m: re.Match[str]) -> str:
        if m.group(1) not in values:
            raise TemplateError(f"{where}unknown placeholder {{{m.group(1)}}} (known: {', '.join(sorted(values))})")
        return values[m.group(1)]

    return [_PLACEHOLDER.sub(sub, element) for element in template]


def plan_commands(*, action: str, settings: DrainSettings, ports: Sequence[tuple[str, str]] = (),
                  host: str | None = None, incident: str = "", cause: str = "") -> list[dict[str, Any]]:
    """The commands an approved drain would run: [{"argv": [...], "display": "shell-quoted"}]."""
    argvs: list[list[str]] = []
    if action == DrainAction.SHUT_PORTS:
        if settings.command_shut_port:
            argvs = [render(settings.command_shut_port, {"device": d, "port": p}, "command_shut_port")
                     for d, p in ports]
    elif action == DrainAction.SLURM_DRAIN:
        assert host is not None
        argvs = [render(settings.command_slurm_drain,
                        {"host": host, "node": host, "incident": incident or "-", "cause": cause or "unknown"},
                        "command_slurm_drain")]
    elif action == DrainAction.K8S_DRAIN:
        assert host is not None
        argvs = [render(settings.command_k8s_cordon, {"node": host, "host": host}, "command_k8s_cordon"),
                 render(settings.command_k8s_drain, {"node": host, "host": host}, "command_k8s_drain")]
    # `display` is for people (and the docs): shlex quoting of the very argv that will run.
    return [{"argv": a, "display": shlex.join(a)} for a in argvs]


def check_settings(settings: DrainSettings) -> None:
    """At start-up: render every command template with sample values (the way plan_commands fills them)
    and check the executor has what it needs; TemplateError naming the setting otherwise."""
    plan_commands(action=DrainAction.SHUT_PORTS, settings=settings, ports=[("leaf-1", "Ethernet1/1")])
    for action in (DrainAction.SLURM_DRAIN, DrainAction.K8S_DRAIN):
        plan_commands(action=action, settings=settings, host="gpu-node-1", incident="incident-1", cause="unknown")
    if settings.executor == "webhook" and not settings.webhook_url:
        raise TemplateError(f"setting {_setting('webhook_url')}: executor 'webhook' needs the URL to POST drains to")


def _now() -> str:
    return datetime.now(UTC).isoformat()


def outcome(executor: str, ok: bool, *, known: bool = True, **detail: Any) -> dict[str, Any]:
    """What an executor returns: `ok`, whether the outcome is `known`, and what it saw."""
    return {"executor": executor, "ok": ok, "known": known, **detail}


class Executor(Protocol):
    name: str

    def execute(self, request: Mapping[str, Any], progress: Progress) -> dict[str, Any]:
        """Carry out one execution of an approved drain (`request`: the drain as approved, plus
        `execution_id` and `idempotency_key`); call `progress(steps)` before and after each step."""
        ...


class NoExecutor:
    name = "none"

    def execute(self, request: Mapping[str, Any], progress: Progress) -> dict[str, Any]:
        return outcome(self.name, False, skipped=True,
                       detail="execution is off (FABRICWATCH_DRAIN_EXECUTOR=none); mark the drain done by hand")


class CommandExecutor:
    name = "command"

    def __init__(self, settings: DrainSettings) -> None:
        self.timeout = settings.command_timeout_s

    def execute(self, request: Mapping[str, Any], progress: Progress) -> dict[str, Any]:
        commands = request.get("commands") or []
        if not commands:
            return outcome(self.name, False, error="no command configured for this action")
        steps: list[dict[str, Any]] = []
        for cmd in commands:
            argv = list(cmd["argv"])
            step: dict[str, Any] = {"argv": argv, "started_at": _now()}
            steps.append(step)
            progress(steps)   # recorded before it runs: a kill from here on leaves "started, no end"
            t0 = time.monotonic()
            try:
                # shell=False, always: the argv goes to execve as it is.
                p = subprocess.run(argv, shell=False, capture_output=True, text=True, timeout=self.timeout,
                                   check=False)
                step.update(rc=p.returncode, stdout=p.stdout[-TAIL:], stderr=p.stderr[-TAIL:])
            except subprocess.TimeoutExpired as exc:
                # killed at its time-out, half-way through whatever it was doing
                step.update(rc=None, known=False, error=f"timed out after {self.timeout:g} s and was killed",
                            stdout=_text(exc.stdout)[-TAIL:], stderr=_text(exc.stderr)[-TAIL:])
            except OSError as exc:   # it never started (no such file, not executable)
                step.update(rc=None, error=f"{type(exc).__name__}: {exc}")
            step.update(finished_at=_now(), seconds=round(time.monotonic() - t0, 3))
            progress(steps)
            if step["rc"] != 0:
                break  # later commands (kubectl drain after cordon) depend on the earlier ones
        ok = len(steps) == len(commands) and all(s["rc"] == 0 for s in steps)
        known = all(s.get("known", True) for s in steps)
        last = steps[-1]
        return outcome(self.name, ok, known=known, rc=last["rc"], error=last.get("error"),
                       steps_run=len(steps), steps_total=len(commands))


def _text(out: bytes | str | None) -> str:
    return out.decode(errors="replace") if isinstance(out, bytes) else (out or "")


class WebhookExecutor:
    name = "webhook"

    def __init__(self, settings: DrainSettings, client: httpx.Client | None = None) -> None:
        if not settings.webhook_url:
            raise TemplateError(f"setting {_setting('webhook_url')}: executor 'webhook' needs the URL to POST "
                                "drains to")
        self.url, self.timeout = settings.webhook_url, settings.webhook_timeout_s
        self.secret = os.environ.get(settings.webhook_secret_env, "") if settings.webhook_secret_env else ""
        self.client = client

    def execute(self, request: Mapping[str, Any], progress: Progress) -> dict[str, Any]:
        drain = {k: v for k, v in request.items() if k not in ("execution_id", "idempotency_key")}
        body = json.dumps({"type": "fabricwatch.drain.approved", "drain": drain,
                           "execution": {"id": request.get("execution_id"), "key": request.get("idempotency_key")}},
                          default=str, sort_keys=True).encode()
        # The notification scheme: Idempotency-Key (one per execution), the timestamped v1 signature.
        headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT,
                   IDEMPOTENCY_HEADER: str(request.get("idempotency_key")), EVENT_HEADER: "drain.approved",
                   DELIVERY_HEADER: f"drain-execution/{request.get('execution_id')}",
                   **sign_headers(self.secret or None, body)}
        step: dict[str, Any] = {"post": self.url, "started_at": _now()}
        progress([step])
        t0 = time.monotonic()
        try:
            if self.client is not None:
                r = self.client.post(self.url, content=body, headers=headers)
            else:
                with httpx.Client(timeout=self.timeout, trust_env=False, follow_redirects=False) as client:
                    r = client.post(self.url, content=body, headers=headers)
            step.update(status=r.status_code, response=r.text[-TAIL:])
            result = outcome(self.name, 200 <= r.status_code < 300, status=r.status_code)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:   # nothing was sent
            step.update(error=f"{type(exc).__name__}: {exc}")
            result = outcome(self.name, False, error=step["error"])
        except httpx.HTTPError as exc:   # sent, and no answer: the receiver may have acted on it
            step.update(error=f"{type(exc).__name__}: {exc}")
            result = outcome(self.name, False, known=False, error=step["error"])
        step.update(finished_at=_now(), seconds=round(time.monotonic() - t0, 3))
        progress([step])
        return result


def get_executor(settings: DrainSettings, name: str | None = None) -> Executor:
    """The executor `name` (default: the configured one) with these settings."""
    name = name or settings.executor
    if name == "command":
        return CommandExecutor(settings)
    if name == "webhook":
        return WebhookExecutor(settings)
    return NoExecutor()
