"""gNMI collector: one-shot Get polls for the scheduler, a reconnecting STREAM consumer, and JSON captures.

We talk to the device with pygnmi's generated stubs directly rather than through
`gNMIClient.get()`/`subscribe2()`, because those drop double_val; every TypedValue kind is
decoded in gnmi_decode.py. Failures come back as CollectResult.error or warnings; the
password never appears in a message.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from pygnmi.spec.v080 import gnmi_pb2, gnmi_pb2_grpc
from tenacity import RetryError, Retrying, retry_if_exception_type

from collectors.base import CollectError, CollectResult, ParseError, Target, register
from collectors.gnmi_decode import json_leaves, notification_leaves, path_to_proto
from collectors.gnmi_paths import PathSet, map_notification, map_notifications, path_set
from service.telemetry.samples import Sample

log = logging.getLogger(__name__)

_ENCODINGS = {"json": gnmi_pb2.JSON, "json_ietf": gnmi_pb2.JSON_IETF, "proto": gnmi_pb2.PROTO,
              "ascii": gnmi_pb2.ASCII}


# ---------------------------------------------------------------------------- connection


def _tls(target: Target) -> dict[str, Any] | None:
    """TLS settings from params["tls"], or None for plaintext. TLS is on unless disabled."""
    raw = target.params.get("tls", True)
    if raw is False:
        return None
    if raw is True or raw is None:
        return {}
    if isinstance(raw, dict):
        return None if raw.get("enabled", True) is False else raw
    if hasattr(raw, "model_dump"):  # an inventory Tls model
        d = raw.model_dump()
        return None if not d.get("enabled", True) else d
    raise CollectError(f"{target.name}: params.tls must be a bool or a mapping, got {type(raw).__name__}")


def _read(path: str | None) -> bytes | None:
    return Path(path).read_bytes() if path else None


def open_channel(target: Target) -> grpc.Channel:
    """A channel to the target: plaintext when TLS is disabled, else TLS with the configured CA/cert."""
    addr = f"{target.address}:{target.port or 57400}"
    tls = _tls(target)
    if tls is None:
        return grpc.insecure_channel(addr)
    if tls.get("skip_verify"):
        # grpc cannot turn verification off; pinning the served cert would need a first
        # unverified fetch, which we do not do silently.
        raise CollectError(f"{target.name}: tls.skip_verify is not supported; give tls.ca_file instead")
    try:
        creds = grpc.ssl_channel_credentials(
            root_certificates=_read(tls.get("ca_file")),
            private_key=_read(tls.get("key_file")),
            certificate_chain=_read(tls.get("cert_file")),
        )
    except OSError as e:
        raise CollectError(f"{target.name}: cannot read TLS file: {e.strerror}: {e.filename}") from e
    options = [("grpc.ssl_target_name_override", tls["server_name"])] if tls.get("server_name") else []
    return grpc.secure_channel(addr, creds, options=options)


def _metadata(target: Target) -> list[tuple[str, str]]:
    user = target.params.get("username")
    if not user:
        return []
    return [("username", str(user)), ("password", target.secrets.get("password", ""))]


def _explain(target: Target, e: grpc.RpcError, what: str, timeout_s: float) -> str:
    """A precise, credential-free message for a failed RPC."""
    code = e.code() if hasattr(e, "code") else None
    details = (e.details() if hasattr(e, "details") else "") or ""
    where = f"gNMI {what} to {target.address}:{target.port}"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"{where}: timed out after {timeout_s:.1f}s (target not answering)"
    if code == grpc.StatusCode.UNAVAILABLE:
        return f"{where}: unreachable ({details or 'connection failed'})"
    if code == grpc.StatusCode.UNAUTHENTICATED:
        user = target.params.get("username") or "(none)"
        return f"{where}: authentication failed for user {user!r} ({details})"
    if code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT):
        return f"{where}: path rejected: {code.name} ({details})"
    name = code.name if code is not None else "error"
    return f"{where}: {name} ({details})"


def _sample_interval_ns(target: Target) -> int:
    s = float(target.params.get("sample_interval_s", target.params.get("sample_interval", 10.0)))
    if s <= 0:
        raise CollectError(f"{target.name}: sample_interval must be positive, got {s}")
    return int(s * 1e9)


# ---------------------------------------------------------------------------- operations


@dataclass(frozen=True, slots=True)
class Capabilities:
    version: str
    models: list[str]
    encodings: list[str]


def capabilities(target: Target) -> Capabilities:
    """The target's gNMI version, models and encodings. Raises CollectError."""
    with open_channel(target) as ch:
        try:
            resp = gnmi_pb2_grpc.gNMIStub(ch).Capabilities(
                gnmi_pb2.CapabilityRequest(), metadata=_metadata(target), timeout=target.timeout_s)
        except grpc.RpcError as e:
            raise CollectError(_explain(target, e, "Capabilities", target.timeout_s)) from None
    return Capabilities(
        version=resp.gNMI_version,
        models=[m.name for m in resp.supported_models],
        encodings=[gnmi_pb2.Encoding.Name(x) for x in resp.supported_encodings],
    )


def _get(stub: gnmi_pb2_grpc.gNMIStub, target: Target, path: str, deadline: float) -> gnmi_pb2.GetResponse:
    encoding = _ENCODINGS.get(str(target.params.get("encoding", "json_ietf")).lower(), gnmi_pb2.JSON_IETF)
    req = gnmi_pb2.GetRequest(path=[path_to_proto(path)], type=gnmi_pb2.GetRequest.ALL, encoding=encoding)
    return stub.Get(req, metadata=_metadata(target), timeout=max(0.05, deadline - time.monotonic()))


_FATAL = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.DEADLINE_EXCEEDED,
          grpc.StatusCode.PERMISSION_DENIED)


@register("gnmi")
def collect_gnmi(target: Target, *, now_ms: int) -> CollectResult:
    """Poll the path set once with Get, all within target.timeout_s. Never raises."""
    t0 = time.monotonic()
    result = CollectResult(target=target.name)
    deadline = t0 + target.timeout_s
    try:
        paths = path_set(target.params.get("path_set")).all
        with open_channel(target) as ch:
            stub = gnmi_pb2_grpc.gNMIStub(ch)
            answered = 0
            for path in paths:
                attempts = 1 + max(0, target.retries)
                for attempt in range(attempts):
                    try:
                        resp = _get(stub, target, path, deadline)
                    except grpc.RpcError as e:
                        code = e.code()
                        retry = code == grpc.StatusCode.UNAVAILABLE and attempt + 1 < attempts \
                            and time.monotonic() < deadline - 0.1
                        if retry:
                            continue
                        if code in _FATAL:
                            raise CollectError(_explain(target, e, "Get", target.timeout_s)) from None
                        # one path the platform does not serve must not cost the others
                        result.warnings.append(f"{path}: {_explain(target, e, 'Get', target.timeout_s)}")
                        break
                    answered += 1
                    for note in resp.notification:
                        leaves, problems = notification_leaves(note)
                        mapped = map_notification(leaves, device=target.device, fallback_ts_ms=now_ms)
                        result.samples += mapped.samples
                        result.warnings += problems + mapped.problems
                    break
            if answered == 0:
                result.error = f"gNMI Get to {target.address}:{target.port}: no path answered " \
                               f"({len(result.warnings)} rejected)"
    except CollectError as e:
        result.error = str(e)
    except KeyError as e:
        result.error = f"{target.name}: {e.args[0]}"
    except Exception as e:  # a collector never takes the scheduler down with it
        log.exception("gnmi collect %s failed", target.name)
        result.error = f"gNMI Get to {target.address}:{target.port}: unexpected {type(e).__name__}: {e}"
    result.duration_s = time.monotonic() - t0
    return result


class StreamDropped(Exception):
    """The subscription ended or failed; stream_gnmi reconnects."""

    def __init__(self, message: str, delivered: int = 0) -> None:
        super().__init__(message)
        self.delivered = delivered


def _wait_either(a: threading.Event, b: threading.Event) -> None:
    while not (a.is_set() or b.is_set()):
        a.wait(0.05)


def _subscribe_request(ps: PathSet, target: Target) -> gnmi_pb2.SubscribeRequest:
    interval = _sample_interval_ns(target)
    subs = [gnmi_pb2.Subscription(path=path_to_proto(p), mode=gnmi_pb2.SAMPLE, sample_interval=interval)
            for p in ps.sample]
    subs += [gnmi_pb2.Subscription(path=path_to_proto(p), mode=gnmi_pb2.ON_CHANGE) for p in ps.on_change]
    encoding = _ENCODINGS.get(str(target.params.get("encoding", "json_ietf")).lower(), gnmi_pb2.JSON_IETF)
    return gnmi_pb2.SubscribeRequest(subscribe=gnmi_pb2.SubscriptionList(
        subscription=subs, mode=gnmi_pb2.SubscriptionList.STREAM, encoding=encoding))


def _run_stream(target: Target, request: gnmi_pb2.SubscribeRequest,
                on_samples: Callable[[list[Sample]], None], stop: threading.Event,
                on_warning: Callable[[str], None]) -> int:
    """One subscription until the target drops it (StreamDropped) or stop is set (returns)."""
    delivered = 0
    done = threading.Event()  # this attempt is over: lets its helper threads exit
    with open_channel(target) as ch:
        stub = gnmi_pb2_grpc.gNMIStub(ch)

        def requests() -> Iterator[gnmi_pb2.SubscribeRequest]:
            yield request
            _wait_either(stop, done)  # keep our half open; returning would half-close the stream

        call = stub.Subscribe(requests(), metadata=_metadata(target))
        # SAMPLE subscriptions speak every interval: silence well past that means a stalled
        # target, which would otherwise hold the stream open forever without an error.
        silence_s = target.timeout_s + 3 * _sample_interval_ns(target) / 1e9
        last = [time.monotonic()]
        stalled = threading.Event()

        def watchdog() -> None:
            while not (stop.is_set() or done.is_set()):
                if time.monotonic() - last[0] > silence_s:
                    stalled.set()
                    break
                stop.wait(0.05)
            call.cancel()

        threading.Thread(target=watchdog, daemon=True, name=f"gnmi-watch-{target.name}").start()
        try:
            for resp in call:
                last[0] = time.monotonic()
                if resp.HasField("error"):
                    raise StreamDropped(f"target sent error {resp.error.code}: {resp.error.message}")
                if not resp.HasField("update"):
                    continue  # sync_response: initial snapshot complete
                leaves, problems = notification_leaves(resp.update)
                mapped = map_notification(leaves, device=target.device)
                for p in problems + mapped.problems:
                    on_warning(p)
                if mapped.samples:
                    on_samples(mapped.samples)  # whole notifications only, in arrival order
                    delivered += len(mapped.samples)
        except grpc.RpcError as e:
            if stop.is_set() and e.code() == grpc.StatusCode.CANCELLED:
                return delivered
            if stalled.is_set():
                where = f"gNMI Subscribe to {target.address}:{target.port}"
                raise StreamDropped(f"{where}: no data for {silence_s:.1f}s (target stalled)", delivered) from None
            raise StreamDropped(_explain(target, e, "Subscribe", target.timeout_s), delivered) from None
        finally:
            done.set()
            call.cancel()
    if stop.is_set():
        return delivered
    where = f"gNMI Subscribe to {target.address}:{target.port}"
    raise StreamDropped(f"{where}: stream ended by target", delivered)


def stream_gnmi(target: Target, on_samples: Callable[[list[Sample]], None], stop: threading.Event, *,
                on_error: Callable[[str], None] | None = None, backoff_initial_s: float = 0.5,
                backoff_max_s: float = 30.0) -> None:
    """Subscribe (STREAM: SAMPLE for counters/optics, ON_CHANGE for state) until stop is set.

    When the stream drops, reconnect with exponential backoff (reset once a stream has
    delivered data again). Drop reasons and value problems go to on_error; nothing raises.
    """
    report = on_error or (lambda msg: log.warning("gnmi %s: %s", target.name, msg))
    try:
        request = _subscribe_request(path_set(target.params.get("path_set")), target)
    except (KeyError, CollectError) as e:
        report(str(e.args[0]) if isinstance(e, KeyError) else str(e))
        return
    failures = 0  # consecutive attempts that delivered nothing

    def attempt() -> None:
        nonlocal failures
        try:
            delivered = _run_stream(target, request, on_samples, stop, report)
        except StreamDropped as e:
            report(str(e))
            failures = 0 if e.delivered else failures + 1
            raise
        except CollectError as e:
            report(str(e))
            failures += 1
            raise StreamDropped(str(e)) from None
        except Exception as e:  # a consumer or decoder bug must not kill the thread silently
            report(f"stream error: {type(e).__name__}: {e}")
            failures += 1
            raise StreamDropped(str(e)) from None
        if delivered == 0 and not stop.is_set():
            failures += 1

    def wait(_: Any) -> float:
        return min(backoff_max_s, backoff_initial_s * 2 ** max(0, failures - 1))

    retrying = Retrying(
        retry=retry_if_exception_type(StreamDropped),
        wait=wait,
        stop=lambda _: stop.is_set(),
        sleep=lambda s: stop.wait(s),  # stop interrupts the backoff
        reraise=False,
    )
    with contextlib.suppress(RetryError, StreamDropped):  # stop was set while the stream was down
        retrying(attempt)


# ---------------------------------------------------------------------------- captures


def parse_gnmi_json(text: str, *, device: str, source: str, default_ts_ms: int | None = None) -> list[Sample]:
    """Canonical samples from a gnmic (`updates`/`values`) or telegraf (SubscribeResponse JSON) capture.

    Raises ParseError when the text is not JSON of those shapes, a value is garbled, a
    notification has no timestamp and no default is given, or nothing maps to a canonical metric.
    """
    groups, problems = json_leaves(
        text, source=source, default_ts_ns=default_ts_ms * 1_000_000 if default_ts_ms is not None else None)
    if problems:
        raise ParseError(source, f"undecodable value: {problems[0]}")
    mapped = map_notifications(groups, device=device)
    if mapped.problems:
        raise ParseError(source, mapped.problems[0])
    if not mapped.samples:
        n = sum(len(g) for g in groups)
        example = f"; e.g. {mapped.unmapped[0]}" if mapped.unmapped else ""
        raise ParseError(source, f"unsupported: none of the {n} leaves maps to a canonical metric{example}")
    return mapped.samples
