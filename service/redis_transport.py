"""kombu's Redis transport, minus one known crash on broker loss (kombu 5.7.0).

When the broker connection drops, kombu closes the transport (its `client` becomes None) while the
consumer's channel is still in use: closing that channel restores the worker's unacknowledged
messages, and the hub acks the tasks that finished meanwhile. Both build a Redis client from
`transport.client.hostname`, so the worker died with "'NoneType' object has no attribute
'hostname'" (reported as "Unrecoverable error" or as "Error on stopping Hub"). Here that is a
connection error, which kombu and Celery already handle as one: the worker reconnects, and the
unacked messages stay in Redis' unacked index, back after the visibility timeout (or were lost
with a broker that restarted empty: a skipped poll, never a duplicate).
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis
from redis.exceptions import ConnectionError as RedisConnectionError


class Channel(redis.Channel):
    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        transport = self.connection
        if transport is None or transport.client is None:
            raise RedisConnectionError("the broker connection is closed")
        return super()._connparams(asynchronous=asynchronous)


class Transport(redis.Transport):
    Channel = Channel


TRANSPORT = f"{__name__}:Transport"
