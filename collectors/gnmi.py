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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from pygnmi.spec.v080 import gnmi_pb2, gnmi_pb2_grpc
from tenacity import RetryError, Retrying, retry_if_exception_type

from collectors.base import CollectError, CollectResult, ParseError, Target, register
from collectors.gnmi_components import PortTies
from collectors.gnmi_decode import Leaf, json_leaves, notification_leaves, path_to_proto
from collectors.gnmi_discovery import Discovered, Fetch, PathRejected, Resolutions, relevant, resolve, schema_of
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


def _capabilities(stub: gnmi_pb2_grpc.gNMIStub, target: Target, timeout_s: float) -> Capabilities:
    try:
        resp = stub.Capabilities(gnmi_pb2.CapabilityRequest(), metadata=_metadata(target), timeout=timeout_s)
    except grpc.RpcError as e:
        raise CollectError(_explain(target, e, "Capabilities", timeout_s)) from None
    return Capabilities(
        version=resp.gNMI_version,
        models=[m.name for m in resp.supported_models],
        encodings=[gnmi_pb2.Encoding.Name(x) for x in resp.supported_encodings],
    )


def capabilities(target: Target) -> Capabilities:
    """The target's gNMI version, models and encodings. Raises CollectError."""
    with open_channel(target) as ch:
        return _capabilities(gnmi_pb2_grpc.gNMIStub(ch), target, target.timeout_s)


def _encoding(target: Target, caps: Capabilities | None) -> int:
    """The configured encoding; else JSON_IETF, JSON or PROTO, the first the target advertises."""
    configured = target.params.get("encoding")
    if configured:
        return _ENCODINGS.get(str(configured).lower(), gnmi_pb2.JSON_IETF)
    offered = set(caps.encodings) if caps and caps.encodings else set()
    for name in ("JSON_IETF", "JSON", "PROTO"):
        if not offered or name in offered:
            return getattr(gnmi_pb2, name)
    return gnmi_pb2.JSON_IETF


_FATAL = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.DEADLINE_EXCEEDED,
          grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNIMPLEMENTED)


def _fetcher(stub: gnmi_pb2_grpc.gNMIStub, target: Target, deadline: float, encoding: int,
             problems: list[str]) -> Fetch:
    """One Get per request path, within the poll's deadline; a refused path is PathRejected."""

    def fetch(path: str) -> list[list[Leaf]]:
        attempts = 1 + max(0, target.retries)
        req = gnmi_pb2.GetRequest(path=[path_to_proto(path)], type=gnmi_pb2.GetRequest.ALL, encoding=encoding)
        for attempt in range(attempts):
            try:
                resp = stub.Get(req, metadata=_metadata(target), timeout=max(0.05, deadline - time.monotonic()))
            except grpc.RpcError as e:
                code = e.code()
                if code == grpc.StatusCode.UNAVAILABLE and attempt + 1 < attempts \
                        and time.monotonic() < deadline - 0.1:
                    continue
                if code in _FATAL:
                    raise CollectError(_explain(target, e, "Get", target.timeout_s)) from None
                raise PathRejected(_explain(target, e, "Get", target.timeout_s)) from None
            groups = []
            for note in resp.notification:
                leaves, bad = notification_leaves(note)
                problems.extend(bad)
                groups.append(leaves)
            return groups
        raise CollectError(f"gNMI Get to {target.address}:{target.port}: unreachable")  # pragma: no cover

    return fetch


@dataclass(slots=True)
class GnmiResult(CollectResult):
    """A poll's result, plus what discovery learned (persisted per target, see gnmi_stream.py)."""

    discovery: dict[str, Any] = field(default_factory=dict)


def _wanted(ps: PathSet) -> list[str]:
    return list(dict.fromkeys(ps.all + ps.ties))


def discover(stub: gnmi_pb2_grpc.gNMIStub, target: Target, *, now_ms: int, deadline: float,
             known: dict[str, Any] | None, problems: list[str]) -> tuple[Discovered, dict[str, Any]]:
    """Fetch the path set through the forms the target answers; Capabilities read when discovering."""
    ps = path_set(target.params.get("path_set"))
    wanted = _wanted(ps)
    doc = dict(known or {})
    res = Resolutions.load(doc.get("paths"))
    caps = None
    if any(res.due(w, now_ms) for w in wanted) or "capabilities" not in doc:
        try:
            caps = _capabilities(stub, target, max(0.05, min(target.timeout_s, deadline - time.monotonic())))
            doc["capabilities"] = {"version": caps.version, "encodings": caps.encodings, "models": caps.models}
        except CollectError as e:
            problems.append(f"Capabilities not read: {e}")
    else:
        c = doc["capabilities"]
        caps = Capabilities(c.get("version", ""), c.get("models", []), c.get("encodings", []))
    encoding = _encoding(target, caps)
    found = resolve(wanted, _fetcher(stub, target, deadline, encoding, problems), res, now_ms=now_ms)
    doc["paths"] = res.dump()
    doc["encoding"] = gnmi_pb2.Encoding.Name(encoding)
    for miss in found.missing:
        if miss in ps.ties:
            continue  # a device without the component tree: names are the fallback
        model = _MODEL_OF.get(schema_of(miss).split("/")[0])
        hint = ""
        if caps and model and caps.models and not any(m.endswith(model) for m in caps.models):
            # a NOS's own variant (Stratum: openconfig-interfaces-stratum) is worth naming
            variants = [m for m in caps.models if m.startswith(model + "-")]
            hint = f" (the target advertises {', '.join(variants)}, not {model})" if variants \
                else f" (the target does not advertise {model})"
        refused = next((r.split(": ", 1)[1] for r in found.rejected if r.startswith(miss + ": ")), None)
        why = f"; as written: {refused}" if refused else ""
        problems.append(f"{miss}: nothing answered, as written, with wildcard keys or at a parent prefix{hint}{why}")
    return found, doc


_MODEL_OF = {"interfaces": "openconfig-interfaces", "components": "openconfig-platform", "qos": "openconfig-qos"}


@register("gnmi")
def collect_gnmi(target: Target, *, now_ms: int) -> GnmiResult:
    """Poll the path set once with Get, all within target.timeout_s. Never raises.

    Paths the target does not answer as written are discovered (gnmi_discovery.py) and what
    worked is handed back in `discovery`, which the next poll gets as params["discovery"].
    A poll that answers but yields no sample says why in its warnings (the target is then
    degraded, not ok: service/telemetry/targets.py).
    """
    t0 = time.monotonic()
    result = GnmiResult(target=target.name)
    deadline = t0 + target.timeout_s
    try:
        with open_channel(target) as ch:
            stub = gnmi_pb2_grpc.gNMIStub(ch)
            found, result.discovery = discover(stub, target, now_ms=now_ms, deadline=deadline,
                                               known=target.params.get("discovery"), problems=result.warnings)
            if not found.wanted:
                result.error = f"gNMI Get to {target.address}:{target.port}: no path answered " \
                               f"({len(found.missing)} paths tried in every form)"
            else:
                groups = relevant(found)
                ties = PortTies()
                for leaves in groups:
                    ties.learn(leaves)
                seen: set[tuple[Any, ...]] = set()
                for leaves in groups:
                    mapped = map_notification(leaves, device=target.device, fallback_ts_ms=now_ms, ties=ties)
                    result.warnings += [p for p in mapped.problems if p not in result.warnings]
                    for s in mapped.samples:  # a parent prefix and an exact path may both carry a leaf
                        key = (s.metric, s.port, s.lane, s.priority, s.ts_ms)
                        if key not in seen:
                            seen.add(key)
                            result.samples.append(s)
                if not result.samples:
                    result.warnings.insert(0, f"no samples: {sum(len(n) for g in found.leaves.values() for n in g)} "
                                              f"leaves answered, none maps to a catalogue metric")
    except CollectError as e:
        result.error = str(e)
    except KeyError as e:
        result.error = f"{target.name}: {e.args[0]}"
    except Exception as e:  # a collector never takes the scheduler down with it
        log.exception("gnmi collect %s failed", target.name)
        result.error = f"gNMI Get to {target.address}:{target.port}: unexpected {type(e).__name__}: {e}"
    result.duration_s = time.monotonic() - t0
    return result


# ---------------------------------------------------------------------------- streaming


class StreamDropped(Exception):
    """The subscription ended or failed; stream_gnmi reconnects. `state` is what to report meanwhile."""

    def __init__(self, message: str, delivered: int = 0, state: str = "reconnecting") -> None:
        super().__init__(message)
        self.delivered = delivered
        self.state = state


class StreamUnsupported(StreamDropped):
    """The target does not implement Subscribe: only polling can collect from it."""

    def __init__(self, message: str) -> None:
        super().__init__(message, 0, "fallback-polling")


def _wait_either(a: threading.Event, b: threading.Event) -> None:
    while not (a.is_set() or b.is_set()):
        a.wait(0.05)


def _subscribe_request(ps: PathSet, target: Target, discovery: dict[str, Any] | None = None,
                       on_warning: Callable[[str], None] | None = None) -> gnmi_pb2.SubscribeRequest:
    """SAMPLE for counters and optics, ON_CHANGE for state, each at the request path discovery found."""
    res = Resolutions.load((discovery or {}).get("paths"))

    def req(p: str) -> str | None:
        got = res.paths.get(p)
        return p if got is None else (got or None)  # unknown: as written; "": nothing answers it

    interval = _sample_interval_ns(target)
    sample = [r for r in dict.fromkeys(map(req, ps.sample)) if r]
    on_change = [r for r in dict.fromkeys(map(req, ps.on_change)) if r and r not in sample]
    if not sample and not on_change:  # discovery found nothing: ask as written, the stall check will tell
        sample, on_change = list(ps.sample), list(ps.on_change)
    for p in ps.on_change:
        if req(p) in sample and on_warning:
            on_warning(f"{p}: sampled every {interval / 1e9:g} s, not on change: the target answers it only "
                       f"at {req(p)}, which counters share")
    subs = [gnmi_pb2.Subscription(path=path_to_proto(p), mode=gnmi_pb2.SAMPLE, sample_interval=interval)
            for p in sample]
    subs += [gnmi_pb2.Subscription(path=path_to_proto(p), mode=gnmi_pb2.ON_CHANGE) for p in on_change]
    enc = (discovery or {}).get("encoding")
    encoding = getattr(gnmi_pb2, enc) if enc in ("JSON_IETF", "JSON", "PROTO", "ASCII") \
        else _encoding(target, None)
    return gnmi_pb2.SubscribeRequest(subscribe=gnmi_pb2.SubscriptionList(
        subscription=subs, mode=gnmi_pb2.SubscriptionList.STREAM, encoding=encoding))


def _run_stream(target: Target, ps: PathSet, discovery: dict[str, Any] | None,
                on_samples: Callable[[list[Sample]], None], stop: threading.Event,
                on_warning: Callable[[str], None], on_state: Callable[[str, str], None],
                on_discovery: Callable[[dict[str, Any]], None]) -> int:
    """One subscription until the target drops it (StreamDropped) or stop is set (returns).

    Before subscribing, the path set is discovered with Get (where the target serves Get) and
    the component tree read, so transceiver readings land on their ports.
    """
    delivered = 0
    done = threading.Event()  # this attempt is over: lets its helper threads exit
    where = f"gNMI Subscribe to {target.address}:{target.port}"
    with open_channel(target) as ch:
        stub = gnmi_pb2_grpc.gNMIStub(ch)
        ties = PortTies()
        problems: list[str] = []
        try:
            found, discovery = discover(stub, target, now_ms=int(time.time() * 1000),
                                        deadline=time.monotonic() + target.timeout_s, known=discovery,
                                        problems=problems)
            for leaves in relevant(found):
                ties.learn(leaves)
            on_discovery(discovery)
        except CollectError as e:
            if "UNIMPLEMENTED" not in str(e):  # a stream-only target: subscribe with the paths as written
                raise StreamDropped(str(e)) from None
            problems.append(f"Get not served ({e}): paths subscribed as written")
        for p in problems:
            on_warning(p)
        request = _subscribe_request(ps, target, discovery, on_warning)

        def requests() -> Iterator[gnmi_pb2.SubscribeRequest]:
            yield request
            _wait_either(stop, done)  # keep our half open; returning would half-close the stream

        call = stub.Subscribe(requests(), metadata=_metadata(target))
        # SAMPLE subscriptions speak every interval: no *data* well past that means a stalled
        # target. Empty notifications (heartbeats, or a subscription that matches nothing) keep
        # the stream open but are not data, so they do not reset this clock.
        silence_s = target.timeout_s + 3 * _sample_interval_ns(target) / 1e9
        last = [time.monotonic()]
        empty = [0]
        stalled = threading.Event()
        untied: set[str] = set()

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
                if resp.HasField("error"):
                    raise StreamDropped(f"target sent error {resp.error.code}: {resp.error.message}")
                if not resp.HasField("update"):
                    continue  # sync_response: initial snapshot complete
                leaves, problems = notification_leaves(resp.update)
                ties.learn(leaves)
                mapped = map_notification(leaves, device=target.device, ties=ties)
                for p in problems + mapped.problems:
                    if p.startswith("component "):  # once per component per connection, not per interval
                        if p in untied:
                            continue
                        untied.add(p)
                    on_warning(p)
                if not mapped.samples:
                    empty[0] += 1
                    continue
                last[0] = time.monotonic()
                if delivered == 0:
                    on_state("streaming", f"{len(request.subscribe.subscription)} subscriptions")
                on_samples(mapped.samples)  # whole notifications only, in arrival order
                delivered += len(mapped.samples)
        except grpc.RpcError as e:
            if stop.is_set() and e.code() == grpc.StatusCode.CANCELLED:
                return delivered
            if stalled.is_set():
                raise StreamDropped(f"{where}: no data for {silence_s:.1f}s ({empty[0]} notifications without "
                                    f"samples: empty updates are not data)", delivered, "stalled") from None
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                raise StreamUnsupported(_explain(target, e, "Subscribe", target.timeout_s)) from None
            raise StreamDropped(_explain(target, e, "Subscribe", target.timeout_s), delivered) from None
        finally:
            done.set()
            call.cancel()
    if stop.is_set():
        return delivered
    raise StreamDropped(f"{where}: stream ended by target", delivered)


def stream_gnmi(target: Target, on_samples: Callable[[list[Sample]], None], stop: threading.Event, *,
                on_error: Callable[[str], None] | None = None,
                on_state: Callable[[str, str], None] | None = None,
                on_discovery: Callable[[dict[str, Any]], None] | None = None,
                backoff_initial_s: float = 0.5, backoff_max_s: float = 30.0,
                unsupported_retry_s: float = 300.0) -> None:
    """Subscribe (STREAM: SAMPLE for counters/optics, ON_CHANGE for state) until stop is set.

    When the stream drops, reconnect with exponential backoff (reset once a stream has
    delivered data again). Drop reasons and value problems go to on_error; state changes
    (streaming, reconnecting, stalled, fallback-polling) with their reason to on_state;
    what discovery learned to on_discovery (start from target.params["discovery"]).
    A target that does not implement Subscribe is retried every unsupported_retry_s.
    Nothing raises.
    """
    report = on_error or (lambda msg: log.warning("gnmi %s: %s", target.name, msg))
    state = on_state or (lambda s, why: None)
    discovery: dict[str, Any] = dict(target.params.get("discovery") or {})

    def remember(doc: dict[str, Any]) -> None:
        discovery.clear()
        discovery.update(doc)
        if on_discovery:
            on_discovery(doc)

    try:
        ps = path_set(target.params.get("path_set"))
        _sample_interval_ns(target)
    except (KeyError, CollectError) as e:
        msg = str(e.args[0]) if isinstance(e, KeyError) else str(e)
        report(msg)
        state("fallback-polling", msg)
        return
    failures = 0  # consecutive attempts that delivered nothing
    unsupported = [False]

    def attempt() -> None:
        nonlocal failures
        unsupported[0] = False
        try:
            delivered = _run_stream(target, ps, discovery or None, on_samples, stop, report, state, remember)
        except StreamDropped as e:
            report(str(e))
            failures = 0 if e.delivered else failures + 1
            unsupported[0] = isinstance(e, StreamUnsupported)
            if not stop.is_set():
                state(e.state, str(e))
            raise
        except CollectError as e:
            report(str(e))
            failures += 1
            state("reconnecting", str(e))
            raise StreamDropped(str(e)) from None
        except Exception as e:  # a consumer or decoder bug must not kill the thread silently
            report(f"stream error: {type(e).__name__}: {e}")
            failures += 1
            state("reconnecting", f"stream error: {type(e).__name__}: {e}")
            raise StreamDropped(str(e)) from None
        if delivered == 0 and not stop.is_set():
            failures += 1

    def wait(_: Any) -> float:
        if unsupported[0]:
            return unsupported_retry_s
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
