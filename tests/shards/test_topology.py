"""The topology setting: one server by default, precise errors for a bad layout, unreachable shards named."""

from __future__ import annotations

import pytest

from service.config import SettingsError, load_settings
from service.shards.topology import ShardSettings, ShardsUnavailable, Topology, check_reachable, probe
from tests.shards.pg_cluster import free_port


def test_unset_is_one_shard_the_control_database() -> None:
    topo = Topology.of("postgresql://h/control", load_settings(database_url="postgresql://h/control").shards)
    assert not topo.sharded
    assert topo.shards == {"main": "postgresql://h/control"}
    assert topo.shard_of("any-pod") == "main" and topo.shard_of(None) == "main"


def test_pods_map_to_their_shard_and_the_rest_to_the_default() -> None:
    s = ShardSettings(urls={"a": "postgresql://h/a", "b": "postgresql://h/b"}, pods={"b": ["p2", "p3"]}, default="b")
    topo = Topology.of("postgresql://h/control", s)
    assert topo.sharded
    assert [topo.shard_of(p) for p in ("p2", "p3", "p9", None)] == ["b", "b", "b", "b"]
    first = Topology.of("postgresql://h/control", ShardSettings(urls=s.urls, pods={"b": ["p2"]}))
    assert [first.shard_of(p) for p in ("p2", "p9", None)] == ["b", "a", "a"]  # default: the first shard


@pytest.mark.parametrize(("env", "message"), [
    ({"FABRICWATCH_SHARDS_URLS": '{"a": "postgresql://h/a"}', "FABRICWATCH_SHARDS_PODS": '{"c": ["p1"]}'},
     "FABRICWATCH_SHARDS_PODS: unknown shard 'c' (shards: a)"),
    ({"FABRICWATCH_SHARDS_URLS": '{"a": "postgresql://h/a", "b": "postgresql://h/b"}',
      "FABRICWATCH_SHARDS_PODS": '{"a": ["p1", "p2"], "b": ["p2"]}'},
     "FABRICWATCH_SHARDS_PODS: pod 'p2' is on two shards, 'a' and 'b'"),
    ({"FABRICWATCH_SHARDS_PODS": '{"a": ["p1"]}'},
     "FABRICWATCH_SHARDS_PODS: unknown shard 'a' (shards: none: FABRICWATCH_SHARDS_URLS is empty)"),
    ({"FABRICWATCH_SHARDS_URLS": '{"a": "postgresql://h/a"}', "FABRICWATCH_SHARDS_DEFAULT": "z"},
     "FABRICWATCH_SHARDS_DEFAULT: unknown shard 'z' (shards: a)"),
    ({"FABRICWATCH_SHARDS_URLS": '{"Shard-1": "postgresql://h/a"}'}, "shard name 'Shard-1' must be lower-case"),
    ({"FABRICWATCH_SHARDS_URLS": '{"a": '}, "setting FABRICWATCH_SHARDS_URLS: Value error, not JSON"),
])
def test_bad_layout_stops_start_up_naming_the_setting(monkeypatch: pytest.MonkeyPatch, env: dict[str, str],
                                                      message: str) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(SettingsError) as err:
        load_settings(database_url="postgresql://h/control")
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FABRICWATCH_SHARDS_URLS", '{"a": "postgresql://h/a", "b": "postgresql://h/b"}')
    monkeypatch.setenv("FABRICWATCH_SHARDS_PODS", '{"b": ["p2"]}')
    s = load_settings(database_url="postgresql://h/control").shards
    assert s.urls == {"a": "postgresql://h/a", "b": "postgresql://h/b"} and s.pods == {"b": ["p2"]}


def test_unreachable_shards_are_each_named(server_url: str) -> None:
    """A live server (the suite's) and two ports where nothing listens: the two are named, each with why."""
    dead1, dead2 = free_port(), free_port()
    topo = Topology.of(server_url, ShardSettings(urls={
        "live": server_url, "gone1": f"postgresql://postgres@127.0.0.1:{dead1}/x",
        "gone2": f"postgresql://postgres@127.0.0.1:{dead2}/x"}, connect_timeout_s=2))
    seen = probe(topo)
    assert seen["live"] is None
    assert seen["gone1"] and "refused" in seen["gone1"] and str(dead1) in seen["gone1"]
    with pytest.raises(ShardsUnavailable) as err:
        check_reachable(topo)
    assert set(err.value.errors) == {"gone1", "gone2"}
    assert "shard 'gone1' unreachable:" in str(err.value) and "shard 'gone2' unreachable:" in str(err.value)
    assert "live" not in str(err.value)
