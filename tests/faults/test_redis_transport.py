"""The Redis transport's close after broker loss: kombu's crash, reproduced, and ours without it.

kombu closes the transport (its `client` becomes None) before the consumer's channel; the channel's
QoS then builds a Redis client from `transport.client.hostname` to restore unacked messages, and
the worker dies. Same order here, on a private Redis, with one message delivered and not acked.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis as redis_py
from kombu import Connection

from service.redis_transport import TRANSPORT
from tests.faults.peers import PrivateRedis


@pytest.fixture()
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    r = PrivateRedis(tmp_path).start()
    yield r
    r.stop()


def _close_like_a_lost_broker(url: str, transport: str | None) -> None:
    conn = Connection(url, transport=transport)
    queue = conn.SimpleQueue("fw-transport-test")
    queue.put({"poll": 1})
    message = queue.get(timeout=5)  # delivered, not acked: held in the QoS
    assert message.payload == {"poll": 1}
    conn._do_close_transport()  # what kombu's Connection._close does first on a lost broker
    queue.channel.close()  # then the consumer's channel, whose QoS restores its unacked messages


def test_stock_transport_crashes_where_ours_leaves_the_message_to_the_visibility_timeout(
        private_redis: PrivateRedis) -> None:
    with pytest.raises(AttributeError, match="'NoneType' object has no attribute 'hostname'"):
        _close_like_a_lost_broker(private_redis.url, None)

    client = redis_py.Redis.from_url(private_redis.url)
    client.flushdb()
    _close_like_a_lost_broker(private_redis.url, TRANSPORT)
    # the message is still in Redis' unacked index, so the visibility timeout brings it back
    assert client.hlen("unacked") == 1
    assert client.llen("fw-transport-test") == 0
