"""Execution plugins for approved drains. OFF by default (`executor = "none"`).

- `command`: runs argv lists rendered from JSON-array templates with `subprocess.run(argv)`:
  no shell, each inventory value fills one whole argument (or part of one) and is checked
  first, so a hostile name can neither split into more arguments nor pose as an option.
- `webhook`: POSTs the drain (with its rendered commands) as JSON, HMAC-SHA256 signed when
  a secret is configured, to a site automation endpoint.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import shlex
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import httpx

from service.drains.schemas import DrainAction, DrainSettings

_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")
_SAFE_VALUE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+\-]{0,255}$")


class TemplateError(ValueError):
    pass


def render(template: Sequence[str], values: Mapping[str, str]) -> list[str]:
    """One argv from a template: placeholders are replaced inside their own element, nothing is split."""
    for name, value in values.items():
        # Inventory names never start with '-' or hold control characters; refuse anything else.
        if not _SAFE_VALUE.match(value):
            raise TemplateError(f"unsafe value for {{{name}}}: {value!r}")

    def sub(m: re.Match[str]) -> str:
        if m.group(1) not in values:
            raise TemplateError(f"unknown placeholder {{{m.group(1)}}}; known: {', '.join(sorted(values))}")
        return values[m.group(1)]

    return [_PLACEHOLDER.sub(sub, element) for element in template]


def plan_commands(*, action: str, settings: DrainSettings, ports: Sequence[tuple[str, str]] = (),
                  host: str | None = None, incident: str = "", cause: str = "") -> list[dict[str, Any]]:
    """The commands an approved drain would run: [{"argv": [...], "display": "shell-quoted"}]."""
    argvs: list[list[str]] = []
    if action == DrainAction.SHUT_PORTS:
        if settings.command_shut_port:
            argvs = [render(settings.command_shut_port, {"device": d, "port": p}) for d, p in ports]
    elif action == DrainAction.SLURM_DRAIN:
        assert host is not None
        argvs = [render(settings.command_slurm_drain,
                        {"host": host, "node": host, "incident": incident or "-", "cause": cause or "unknown"})]
    elif action == DrainAction.K8S_DRAIN:
        assert host is not None
        argvs = [render(settings.command_k8s_cordon, {"node": host, "host": host}),
                 render(settings.command_k8s_drain, {"node": host, "host": host})]
    # `display` is for people (and the docs): shlex quoting of the very argv that will run.
    return [{"argv": a, "display": shlex.join(a)} for a in argvs]


class Executor(Protocol):
    name: str

    def execute(self, drain: Mapping[str, Any]) -> dict[str, Any]:
        """Carry out an approved drain; return a JSON-able record with `ok`."""
        ...


class NoExecutor:
    name = "none"

    def execute(self, drain: Mapping[str, Any]) -> dict[str, Any]:
        return {"executor": self.name, "ok": False, "skipped": True,
                "detail": "execution is off (FABRICWATCH_DRAIN_EXECUTOR=none); mark the drain done by hand"}


class CommandExecutor:
    name = "command"

    def __init__(self, settings: DrainSettings) -> None:
        self.timeout = settings.command_timeout_s

    def execute(self, drain: Mapping[str, Any]) -> dict[str, Any]:
        commands = drain.get("commands") or []
        if not commands:
            return {"executor": self.name, "ok": False, "detail": "no command configured for this action"}
        results = []
        for cmd in commands:
            argv = list(cmd["argv"])
            t0 = time.monotonic()
            try:
                # shell=False, always: the argv goes to execve as it is.
                p = subprocess.run(argv, shell=False, capture_output=True, text=True, timeout=self.timeout,
                                   check=False)
                results.append({"argv": argv, "rc": p.returncode, "stdout": p.stdout[-2000:],
                                "stderr": p.stderr[-2000:], "seconds": round(time.monotonic() - t0, 3)})
            except (OSError, subprocess.TimeoutExpired) as exc:
                results.append({"argv": argv, "rc": None, "error": f"{type(exc).__name__}: {exc}"})
            if results[-1].get("rc") != 0:
                break  # later commands (kubectl drain after cordon) depend on the earlier ones
        ok = len(results) == len(commands) and all(r.get("rc") == 0 for r in results)
        return {"executor": self.name, "ok": ok, "results": results}


class WebhookExecutor:
    name = "webhook"

    def __init__(self, settings: DrainSettings, client: httpx.Client | None = None) -> None:
        if not settings.webhook_url:
            raise TemplateError("executor 'webhook' needs FABRICWATCH_DRAIN_WEBHOOK_URL")
        self.url, self.timeout = settings.webhook_url, settings.webhook_timeout_s
        self.secret = os.environ.get(settings.webhook_secret_env, "") if settings.webhook_secret_env else ""
        self.client = client

    def execute(self, drain: Mapping[str, Any]) -> dict[str, Any]:
        body = json.dumps({"type": "fabricwatch.drain.approved", "drain": dict(drain)}, default=str,
                          sort_keys=True).encode()
        headers = {"content-type": "application/json", "idempotency-key": f"drain-{drain.get('id')}"}
        if self.secret:
            sig = hmac.new(self.secret.encode(), body, hashlib.sha256).hexdigest()
            headers["x-fabricwatch-signature"] = f"sha256={sig}"
        try:
            client = self.client or httpx.Client(timeout=self.timeout)
            r = client.post(self.url, content=body, headers=headers)
            return {"executor": self.name, "ok": 200 <= r.status_code < 300, "status": r.status_code,
                    "response": r.text[:2000]}
        except httpx.HTTPError as exc:
            return {"executor": self.name, "ok": False, "error": f"{type(exc).__name__}: {exc}"}


def get_executor(settings: DrainSettings) -> Executor:
    if settings.executor == "command":
        return CommandExecutor(settings)
    if settings.executor == "webhook":
        return WebhookExecutor(settings)
    return NoExecutor()
