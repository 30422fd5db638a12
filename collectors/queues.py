"""Which Celery queue a target's collections go to: one rule for the dispatcher (collectors/tasks.py) and for
the gNMI stream supervisor's filter (collectors/gnmi_stream.py), so a stream runs on the workers its polls
would run on.

1. The endpoint's own `queue`, when the inventory gives one.
2. Unsharded: the default queue (`fabricwatch`).
3. With telemetry shards: `collect.<shard>`, the shard of the device's pod in the stored pod map
   (`shard_pods.shard`; a pod not stored yet, or a device without a pod: where the setting puts it).

During `fabricwatch shards move` the pod's collections stay on its old shard's queue until the switch step
changes `shard_pods.shard`: the queue only picks the worker. Where the samples go is decided when they are
stored (service/shards/ingest.py `routes`, under the pod's routing lock): both shards while the move runs,
the new one after the switch, whichever queue's worker stores them. A collection the old shard's worker
cannot store is spooled under that shard (`shard_spool_for` uses the same `shard_pods.shard`) and replayed
by that worker, again through `routes`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, text

from service.shards.topology import NO_POD, ShardSettings, Topology
from service.worker import DEFAULT_QUEUE, collect_queue


@dataclass(frozen=True)
class QueueRule:
    """The pod -> shard map in effect when the rule was read; `pod_shard` None: unsharded."""

    pod_shard: dict[str, str] | None = None
    default_shard: str = ""

    def queue_for(self, config: Mapping[str, Any], pod: str | None) -> str:
        """The queue of an endpoint (its `config`) of a device in `pod`."""
        explicit = config.get("queue")
        if explicit:
            return str(explicit)
        if self.pod_shard is None:
            return DEFAULT_QUEUE
        return collect_queue(self.pod_shard.get(pod or NO_POD, self.default_shard))


def queue_rule(conn: Connection, shards: ShardSettings) -> QueueRule:
    """The rule now: with shards, the stored pod map (control database) over the setting's."""
    if not shards.urls:
        return QueueRule()
    topology = Topology.of("", shards)
    stored = dict(conn.execute(text("SELECT pod, shard FROM shard_pods")).all())
    return QueueRule({**topology.pod_shard, **stored}, topology.default)
