"""The Redis transport after broker loss: kombu's crash, reproduced, and ours without it.

kombu closes the transport (its `client` becomes None) while the consumer's channel is in use; the
hub then acks a finished task and the connection closes the channel, whose QoS restores the
unacked messages. Both built a Redis client from `transport.client.hostname`, and the worker died.
Same order here, on a private Redis, with messages delivered and not yet acked.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis as redis_py
from kombu import Connection

from service.redis_transport import TRANSPORT
from tests.faults.peers import PrivateRedis

QUEUE = "fw-transport-test"


@pytest.fixture()
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    r = PrivateRedis(tmp_path).start()
    yield r
    r.stop()


def _lose_the_broker_holding_two_messages(url: str, transport: str | None) -> str:
    """The delivery tag of the message still running when the broker went away."""
    conn = Connection(url, transport=transport)
    errors = conn.connection_errors + conn.channel_errors  # what kombu and Celery treat as recoverable
    queue = conn.SimpleQueue(QUEUE)
    queue.put({"poll": 1})
    queue.put({"poll": 2})
    finished, running = queue.get(timeout=5), queue.get(timeout=5)  # delivered, not acked
    assert {finished.payload["poll"], running.payload["poll"]} == {1, 2}
    conn._do_close_transport()  # the lost broker's connection, closed first
    finished.ack_log_error(logging.getLogger(__name__), errors)  # the hub acks a task that finished
    conn.maybe_close_channel(queue.channel)  # then the channel: its QoS restores the unacked message
    running.ack_log_error(logging.getLogger(__name__), errors)  # the hub, stopping, acks the last task
    return running.delivery_tag


def test_stock_transport_crashes_where_ours_treats_it_as_a_lost_connection(private_redis: PrivateRedis) -> None:
    with pytest.raises(AttributeError, match="'NoneType' object has no attribute 'hostname'"):
        _lose_the_broker_holding_two_messages(private_redis.url, None)

    client = redis_py.Redis.from_url(private_redis.url)
    client.flushdb()
    running = _lose_the_broker_holding_two_messages(private_redis.url, TRANSPORT)
    # the finished task's ack went through its open pool; the running one was neither restored nor acked
    # through the closed transport: it stays in Redis' unacked index, back after the visibility timeout
    assert client.hkeys("unacked") == [running.encode()]
    assert client.llen(QUEUE) == 0
