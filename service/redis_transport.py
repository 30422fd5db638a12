"""kombu's Redis transport, minus one known crash on broker loss (kombu 5.7.0).

When the broker connection drops, kombu closes the transport (its `client` becomes None) and only
then closes the consumer's channel, whose QoS tries to put the worker's unacknowledged messages
back on the broker. Building that Redis client needs `transport.client.hostname`, so the worker
dies with "'NoneType' object has no attribute 'hostname'" (sometimes reported as "Error on
stopping Hub"). With the transport closed there is nothing to restore through: the unacked
messages stay in Redis' unacked index and come back after the visibility timeout, or were lost
with a broker that restarted empty (a skipped poll, never a duplicate).
"""

from __future__ import annotations

import logging

from kombu.transport import redis

log = logging.getLogger(__name__)


class QoS(redis.QoS):
    def restore_unacked(self, client: object = None) -> None:
        transport = self.channel.connection
        if client is None and (transport is None or transport.client is None):
            log.warning("broker connection closed: %d unacknowledged message(s) left to the visibility "
                        "timeout", len(self._delivered))
            self._delivered.clear()
            return
        super().restore_unacked(client)


class Channel(redis.Channel):
    QoS = QoS


class Transport(redis.Transport):
    Channel = Channel


TRANSPORT = f"{__name__}:Transport"
