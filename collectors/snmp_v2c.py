"""SNMPv2c GETBULK over asyncio UDP, with the request encoder and response decoder of snmp_ber.

Why not pysnmp's engine for v2c: its receive path decodes every response with pyasn1 into
typed objects (~100 µs a varbind), encoding one request costs ~400 µs, and a fresh engine
costs ~60 ms of CPU. v2c has no security processing, so each request is one message on a
connected UDP socket per poll. SNMPv3 stays entirely on pysnmp (collectors/snmp.py).
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Sequence
from typing import Any

from collectors.snmp_ber import BerError, V2cResponse, decode_response, encode_getbulk
from collectors.snmp_oids import Oid

# Request ids: one process-wide sequence from a random start, so a late answer to an
# earlier poll on a reused port is not mistaken for the current one.
_REQUEST_IDS = itertools.count(random.randrange(1, 2**30))


class V2cTimeout(Exception):
    """No valid response within timeout x tries."""


class V2cUnreachable(Exception):
    """The host reported the port unreachable (ICMP), or the socket failed."""


class _Protocol(asyncio.DatagramProtocol):
    """Queues datagrams (and socket errors) for the one coroutine that polls this peer."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[bytes | Exception] = asyncio.Queue()

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.queue.put_nowait(data)

    def error_received(self, exc: Exception) -> None:
        self.queue.put_nowait(exc)


class V2cSession:
    """One agent, one community, one connected UDP socket; use `async with`."""

    def __init__(self, host: str, port: int, community: str, *, timeout_s: float, retries: int) -> None:
        self.host, self.port, self.community = host, port, community
        self.timeout_s, self.tries = timeout_s, retries + 1
        self._community_b = community.encode()
        self._transport: asyncio.DatagramTransport | None = None
        self._proto: _Protocol | None = None

    async def __aenter__(self) -> V2cSession:
        loop = asyncio.get_running_loop()
        self._transport, self._proto = await loop.create_datagram_endpoint(
            _Protocol, remote_addr=(self.host, self.port))
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._transport is not None:
            self._transport.close()

    async def getbulk(self, columns: Sequence[Oid], max_repetitions: int) -> V2cResponse:
        """Send one GETBULK, retrying on timeout; answers to other request ids are ignored.

        Raises V2cTimeout, V2cUnreachable, or BerError for a malformed response.
        """
        assert self._transport is not None and self._proto is not None, "use 'async with'"
        queue = self._proto.queue
        for _ in range(self.tries):
            request_id = next(_REQUEST_IDS) % 2**31
            self._transport.sendto(encode_getbulk(self._community_b, request_id, max_repetitions, columns))
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.timeout_s
            while (left := deadline - loop.time()) > 0:
                try:
                    item = await asyncio.wait_for(queue.get(), left)
                except TimeoutError:
                    break
                if isinstance(item, Exception):
                    raise V2cUnreachable(f"{type(item).__name__}: {item}")
                resp = decode_response(item)
                if resp.request_id == request_id and resp.community == self._community_b:
                    return resp
        raise V2cTimeout()


__all__ = ["BerError", "V2cSession", "V2cTimeout", "V2cUnreachable"]
