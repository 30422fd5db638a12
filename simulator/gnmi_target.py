"""A small gNMI server that stands for a switch: Capabilities, Get, Subscribe (STREAM/ONCE/POLL).

Values come from a provider, a callable returning {path: value} for this device at the
moment it is called; the fabric simulator plugs its live model in there. Plain Python
values map to the natural TypedValue kind, and `Typed(kind, value)` forces any other kind,
so tests can send every encoding a real device might. Test hooks: `drop_after` aborts the
next stream after N notifications, `hang` makes every RPC stall, and username/password
make the server demand credentials in the call metadata.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import grpc
from pygnmi.spec.v080 import gnmi_pb2, gnmi_pb2_grpc

from collectors.gnmi_decode import PathElem, parse_path, path_to_proto

Provider = Callable[[], Mapping[str, Any]]

MODELS = (
    ("openconfig-interfaces", "OpenConfig working group", "3.7.1"),
    ("openconfig-if-ethernet", "OpenConfig working group", "2.14.0"),
    ("openconfig-platform", "OpenConfig working group", "0.24.0"),
    ("openconfig-platform-transceiver", "OpenConfig working group", "0.14.0"),
    ("openconfig-qos", "OpenConfig working group", "0.11.2"),
)


@dataclass(frozen=True, slots=True)
class Typed:
    """Force a TypedValue kind, e.g. Typed("float_val", 1.5) or Typed("decimal_val", (2709375, 5))."""

    kind: str
    value: Any


def to_typed_value(v: Any) -> gnmi_pb2.TypedValue:
    if isinstance(v, Typed):
        k, x = v.kind, v.value
        if k == "decimal_val":
            digits, precision = x
            return gnmi_pb2.TypedValue(decimal_val=gnmi_pb2.Decimal64(digits=digits, precision=precision))
        if k in ("json_val", "json_ietf_val"):
            raw = x if isinstance(x, bytes) else json.dumps(x).encode()
            return gnmi_pb2.TypedValue(**{k: raw})
        if k == "leaflist_val":
            return gnmi_pb2.TypedValue(
                leaflist_val=gnmi_pb2.ScalarArray(element=[to_typed_value(e) for e in x]))
        return gnmi_pb2.TypedValue(**{k: x})
    if isinstance(v, bool):
        return gnmi_pb2.TypedValue(bool_val=v)
    if isinstance(v, int):
        return gnmi_pb2.TypedValue(int_val=v) if v < 0 else gnmi_pb2.TypedValue(uint_val=v)
    if isinstance(v, float):
        return gnmi_pb2.TypedValue(double_val=v)
    if isinstance(v, Decimal):
        sign, digits, exp = v.as_tuple()
        n, e = int("".join(map(str, digits))) * (-1 if sign else 1), int(exp)
        return to_typed_value(Typed("decimal_val", (n, -e) if e <= 0 else (n * 10**e, 0)))
    if isinstance(v, str):
        return gnmi_pb2.TypedValue(string_val=v)
    if isinstance(v, bytes):
        return gnmi_pb2.TypedValue(bytes_val=v)
    if isinstance(v, list):
        return to_typed_value(Typed("leaflist_val", v))
    if isinstance(v, dict):
        return to_typed_value(Typed("json_ietf_val", v))
    raise TypeError(f"no TypedValue for {type(v).__name__}")


def _elem_matches(want: PathElem, have: PathElem) -> bool:
    if want.name not in ("*", have.name.rsplit(":", 1)[-1], have.name):
        return False
    return all(v == "*" or have.key(k) == v for k, v in want.keys)


def _matches(want: list[PathElem], have: list[PathElem]) -> bool:
    # A request path selects everything at or below it; `...` matches any depth
    if want and want[-1].name == "...":
        want = want[:-1]
    return len(want) <= len(have) and all(_elem_matches(w, h) for w, h in zip(want, have, strict=False))


class GnmiTarget(gnmi_pb2_grpc.gNMIServicer):
    """The gNMI service. One instance per simulated switch."""

    def __init__(self, provider: Provider, *, username: str | None = None, password: str | None = None,
                 clock_ns: Callable[[], int] = time.time_ns, change_poll_s: float = 0.02) -> None:
        self.provider = provider
        self.username, self.password = username, password
        self.clock_ns = clock_ns
        self.change_poll_s = change_poll_s
        self.drop_after: int | None = None  # one-shot: abort the next stream after N notifications
        self.hang = False
        self.streams_opened = 0
        self.stopping = threading.Event()
        self._parsed: dict[str, tuple[list[PathElem], gnmi_pb2.Path]] = {}
        self._lock = threading.Lock()

    # -- helpers

    def _path(self, text: str) -> tuple[list[PathElem], gnmi_pb2.Path]:
        hit = self._parsed.get(text)
        if hit is None:
            elems = parse_path(text)
            hit = self._parsed[text] = (elems, path_to_proto(elems))
        return hit

    def _select(self, want: gnmi_pb2.Path, data: Mapping[str, Any]) -> dict[str, Any]:
        w = [PathElem(e.name, tuple(e.key.items())) for e in want.elem]
        return {p: v for p, v in data.items() if _matches(w, self._path(p)[0])}

    def _notification(self, values: Mapping[str, Any]) -> gnmi_pb2.Notification:
        return gnmi_pb2.Notification(
            timestamp=self.clock_ns(),
            update=[gnmi_pb2.Update(path=self._path(p)[1], val=to_typed_value(v)) for p, v in values.items()],
        )

    def _gate(self, context: grpc.ServicerContext) -> None:
        while self.hang and context.is_active() and not self.stopping.wait(0.05):
            pass
        if self.username is None:
            return
        md = dict(context.invocation_metadata())
        if md.get("username") != self.username or md.get("password") != self.password:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "invalid username or password")

    # -- RPCs

    def Capabilities(self, request: gnmi_pb2.CapabilityRequest,
                     context: grpc.ServicerContext) -> gnmi_pb2.CapabilityResponse:
        self._gate(context)
        return gnmi_pb2.CapabilityResponse(
            supported_models=[gnmi_pb2.ModelData(name=n, organization=o, version=v) for n, o, v in MODELS],
            supported_encodings=[gnmi_pb2.JSON, gnmi_pb2.JSON_IETF, gnmi_pb2.PROTO, gnmi_pb2.ASCII],
            gNMI_version="0.8.0",
        )

    def Get(self, request: gnmi_pb2.GetRequest,
            context: grpc.ServicerContext) -> gnmi_pb2.GetResponse:
        self._gate(context)
        data = self.provider()
        notes = []
        for want in request.path:
            selected = self._select(want, data)
            if not selected:
                shown = "/" + "/".join(e.name for e in want.elem)
                context.abort(grpc.StatusCode.NOT_FOUND, f"path {shown} not found")
            notes.append(self._notification(selected))
        return gnmi_pb2.GetResponse(notification=notes)

    def Subscribe(self, request_iterator: Iterator[gnmi_pb2.SubscribeRequest],
                  context: grpc.ServicerContext) -> Iterator[gnmi_pb2.SubscribeResponse]:
        self._gate(context)
        first = next(request_iterator, None)
        if first is None or not first.HasField("subscribe"):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "first request must carry a subscription list")
        with self._lock:
            self.streams_opened += 1
            drop_after, self.drop_after = self.drop_after, None
        subs = list(first.subscribe.subscription)
        mode = first.subscribe.mode
        sent = 0

        def send(values: Mapping[str, Any]) -> gnmi_pb2.SubscribeResponse:
            nonlocal sent
            if drop_after is not None and sent >= drop_after:
                context.abort(grpc.StatusCode.UNAVAILABLE, "simulated stream drop")
            sent += 1
            return gnmi_pb2.SubscribeResponse(update=self._notification(values))

        def snapshot() -> Iterator[gnmi_pb2.SubscribeResponse]:
            data = self.provider()
            for s in subs:
                selected = self._select(s.path, data)
                if selected:
                    yield send(selected)
            yield gnmi_pb2.SubscribeResponse(sync_response=True)

        yield from snapshot()
        if mode == gnmi_pb2.SubscriptionList.ONCE:
            return
        if mode == gnmi_pb2.SubscriptionList.POLL:
            for req in request_iterator:
                if req.HasField("poll"):
                    yield from snapshot()
            return
        yield from self._stream(subs, context, send)

    def _stream(self, subs: list[gnmi_pb2.Subscription], context: grpc.ServicerContext,
                send: Callable[[Mapping[str, Any]], gnmi_pb2.SubscribeResponse]
                ) -> Iterator[gnmi_pb2.SubscribeResponse]:
        """STREAM mode after the initial snapshot: SAMPLE on a timer, ON_CHANGE on a poll of the provider."""
        now = time.monotonic()
        due: dict[int, float] = {}
        last: dict[int, dict[str, Any]] = {}
        data = self.provider()
        for i, s in enumerate(subs):
            if s.mode == gnmi_pb2.ON_CHANGE:
                last[i] = self._select(s.path, data)
            else:  # SAMPLE, and TARGET_DEFINED treated as SAMPLE
                due[i] = now + (s.sample_interval or 1_000_000_000) / 1e9
        while context.is_active() and not self.stopping.is_set():
            now = time.monotonic()
            data = self.provider()
            for i, t in due.items():
                if t <= now:
                    selected = self._select(subs[i].path, data)
                    if selected:
                        yield send(selected)
                    due[i] = max(t + subs[i].sample_interval / 1e9, now) if subs[i].sample_interval \
                        else now + 1.0
            for i, old in last.items():
                cur = self._select(subs[i].path, data)
                changed = {p: v for p, v in cur.items() if old.get(p) != v}
                if changed:
                    yield send(changed)
                last[i] = cur
            wake = min(due.values(), default=now + self.change_poll_s)
            if last:
                wake = min(wake, now + self.change_poll_s)
            self.stopping.wait(max(0.0, wake - time.monotonic()))


@contextmanager
def serve_gnmi(provider: Provider, port: int = 0, *, username: str | None = None,
               password: str | None = None, max_workers: int = 16,
               tls: tuple[bytes, bytes] | None = None,
               **target_kw: Any) -> Iterator[tuple[int, GnmiTarget]]:
    """Run a gNMI target on 127.0.0.1; yields (port, handle) and stops it on exit.

    Plaintext unless `tls` gives (private key PEM, certificate chain PEM).
    """
    target = GnmiTarget(provider, username=username, password=password, **target_kw)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers))
    gnmi_pb2_grpc.add_gNMIServicer_to_server(target, server)
    addr = f"127.0.0.1:{port}"
    bound = (server.add_secure_port(addr, grpc.ssl_server_credentials([tls])) if tls
             else server.add_insecure_port(addr))
    if bound == 0:
        raise OSError(f"cannot bind gNMI target to 127.0.0.1:{port}")
    server.start()
    try:
        yield bound, target
    finally:
        target.stopping.set()  # ends stream loops and hangs so stop() does not wait on them
        server.stop(grace=0.2).wait(2.0)
