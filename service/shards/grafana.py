"""The Grafana dashboards' SQL on a sharded deployment, unchanged: schema `fleet_grafana` on the control
database holds `series`, `samples_between`, `last_samples` and `missing_pods` with the single-server names
and columns, reading the shards through the fleet tables, and Grafana's read-only role finds them first on
its search_path there (`ALTER ROLE .. IN DATABASE .. SET search_path = fleet_grafana, public`).

Series ids are per shard, so `fleet_grafana.series.id` is `(shard number << 32) + the shard's id`, a bigint,
and the functions take and give that id. Time conditions reach the shards as parameters (the functions are
PL/pgSQL, so `lo`/`hi` arrive as values, not as expressions postgres_fdw will not send); a panel's pod
condition is on the control database's `devices` and does not (docs/dashboards.md, "Sharded deployments").

A shard that does not answer a connection leaves its pods out instead of failing the panel: once per
statement `shards_down()` connects to each shard (an EXCEPTION handler for connection errors only; any other
error still fails the query), and every read names the pods of the shards that answered as a constant, so
the others' foreign partitions are pruned when the query is planned and never connected to. `missing_pods`
names what was left out (on one server, migration 0300's view of the same name is always empty).
"""

from __future__ import annotations

import logging

from sqlalchemy import Connection, text
from sqlalchemy.exc import DBAPIError

log = logging.getLogger(__name__)

SCHEMA = "fleet_grafana"
CACHE_SETTING = "fleet_grafana.down"  # transaction-local: "<statement start>|<shard -> reason, JSON>"

_SQL = f"""
CREATE SCHEMA {SCHEMA};

-- pod -> its shard and the shard's number, which makes a series id global
CREATE TABLE {SCHEMA}.pods (pod text PRIMARY KEY, shard_no int NOT NULL, shard text NOT NULL);

-- The shards that do not answer a connection now, shard -> libpq's reason. Each shard is asked once per
-- statement (a small remote read, its partition named by its pods as a constant: the others are pruned);
-- the answer is kept for the rest of the statement in a transaction-local setting, so a panel calling
-- last_samples per series tries a dead shard once, for at most the servers' connect_timeout. Only
-- connection errors (class 08) mean down: any other error is raised.
CREATE FUNCTION {SCHEMA}.shards_down() RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
DECLARE
  stmt text := extract(epoch FROM statement_timestamp())::text;
  cached text := current_setting('{CACHE_SETTING}', true);
  down jsonb := '{{}}';
  s record;
  msg text;
  detail text;
BEGIN
  IF split_part(cached, '|', 1) = stmt THEN
    RETURN substr(cached, length(stmt) + 2)::jsonb;
  END IF;
  FOR s IN SELECT p.shard, array_agg(p.pod ORDER BY p.pod) AS pods FROM {SCHEMA}.pods p
           GROUP BY p.shard ORDER BY p.shard LOOP
    BEGIN
      EXECUTE format('SELECT 1 FROM fleet.rollup_marks WHERE pod = ANY(%L::text[]) LIMIT 1', s.pods);
    EXCEPTION WHEN connection_exception THEN
      GET STACKED DIAGNOSTICS msg = MESSAGE_TEXT, detail = PG_EXCEPTION_DETAIL;
      msg := msg || coalesce(': ' || nullif(split_part(detail, E'\\n', 1), ''), '');
      down := down || jsonb_build_object(s.shard, msg);
      RAISE WARNING 'fleet_grafana: shard % does not answer (%): pods % left out of this query',
        s.shard, msg, array_to_string(s.pods, ', ');
    END;
  END LOOP;
  PERFORM set_config('{CACHE_SETTING}', stmt || '|' || down::text, true);
  RETURN down;
END $$;

CREATE FUNCTION {SCHEMA}.live_pods() RETURNS text[] LANGUAGE sql STABLE AS $$
  SELECT coalesce(array_agg(p.pod ORDER BY p.pod), '{{}}') FROM {SCHEMA}.pods p
  WHERE NOT ({SCHEMA}.shards_down() ? p.shard)
$$;

-- what the panels cannot see now: the pods of the shards that do not answer ('(no pod)' for pod-less devices)
CREATE VIEW {SCHEMA}.missing_pods AS
SELECT CASE WHEN p.pod = '' THEN '(no pod)' ELSE p.pod END AS pod, p.shard, d.reason
FROM {SCHEMA}.pods p JOIN jsonb_each_text({SCHEMA}.shards_down()) AS d(shard, reason) ON d.shard = p.shard;

-- Every function below names the live pods as a constant (force_custom_plan: a generic plan would keep a
-- parameter, which prunes no partition, and connect to every shard).
CREATE FUNCTION {SCHEMA}.series_up()
RETURNS TABLE (id bigint, device_id int, port_id int, metric text, lane smallint, priority smallint,
               gpu smallint, counter_bits smallint, saturating boolean)
LANGUAGE plpgsql STABLE SET plan_cache_mode = force_custom_plan AS $$
DECLARE
  live text[] := {SCHEMA}.live_pods();
BEGIN
  RETURN QUERY
  SELECT (p.shard_no::bigint << 32) + f.series_id, f.device_id, f.port_id, f.metric, f.lane, f.priority, f.gpu,
         f.counter_bits, f.saturating
  FROM fleet.series f JOIN {SCHEMA}.pods p ON p.pod = f.pod WHERE f.pod = ANY(live);
END $$;

-- a view over a function: a panel's metric condition is not sent to the shards (every series of the live
-- shards comes back; a view on fleet.series could not leave a dead shard's partition out)
CREATE VIEW {SCHEMA}.series AS SELECT * FROM {SCHEMA}.series_up();

-- public.samples_between (migration 0200): rows, blocks, and for compressed time each series' 5-minute
-- rollup reading (`last` at `last_ts`)
CREATE FUNCTION {SCHEMA}.samples_between(lo timestamptz, hi timestamptz)
RETURNS TABLE (series_id bigint, ts timestamptz, value float8)
LANGUAGE plpgsql STABLE SET plan_cache_mode = force_custom_plan AS $$
#variable_conflict use_column
DECLARE
  lo5 timestamptz := lo - interval '5 minutes';  -- a value: an expression of lo would stay on this side
  live text[] := {SCHEMA}.live_pods();
BEGIN
  RETURN QUERY
  SELECT (p.shard_no::bigint << 32) + x.series_id, x.ts, x.value FROM (
    SELECT r.pod, r.series_id, r.ts, r.value FROM fleet.rows r WHERE r.pod = ANY(live) AND r.ts >= lo AND r.ts <= hi
    UNION ALL
    SELECT b.pod, b.series_id, u.ts, u.value FROM fleet.blocks b CROSS JOIN LATERAL unnest(b.ts, b.vals) AS u(ts, value)
    WHERE b.pod = ANY(live) AND b.last_ts >= lo AND b.first_ts <= hi AND u.ts >= lo AND u.ts <= hi
    UNION ALL
    SELECT g.pod, g.series_id, g.last_ts, g.last FROM fleet.compressed_5m g
    WHERE g.pod = ANY(live) AND g.bucket >= lo5 AND g.bucket <= hi AND g.last_ts >= lo AND g.last_ts <= hi
  ) x JOIN {SCHEMA}.pods p ON p.pod = x.pod;
END $$;

-- public.last_samples (migration 0200): rows, blocks, the newest chunks' tail samples; one series, on its
-- shard alone (the others' partitions are pruned when the query is planned), none when that shard is down
CREATE FUNCTION {SCHEMA}.last_samples(sid bigint, n int, before timestamptz DEFAULT 'infinity')
RETURNS TABLE (ts timestamptz, value float8)
LANGUAGE plpgsql STABLE SET plan_cache_mode = force_custom_plan AS $$
#variable_conflict use_column
DECLARE
  pods text[] := ARRAY(SELECT p.pod FROM {SCHEMA}.pods p WHERE p.shard_no = (sid >> 32)::int
                       AND p.pod = ANY({SCHEMA}.live_pods()));
  id int := (sid & 4294967295)::int;
BEGIN
  RETURN QUERY
  SELECT DISTINCT ON (x.ts) x.ts, x.value FROM (
    (SELECT r.ts, r.value FROM fleet.rows r WHERE r.pod = ANY(pods) AND r.series_id = id AND r.ts < before
     ORDER BY r.ts DESC LIMIT n)
    UNION ALL
    SELECT u.ts, u.value
    FROM (SELECT b.ts, b.vals FROM fleet.blocks b WHERE b.pod = ANY(pods) AND b.series_id = id AND b.first_ts < before
          ORDER BY b.first_ts DESC LIMIT n) b
    CROSS JOIN LATERAL unnest(b.ts, b.vals) AS u(ts, value) WHERE u.ts < before
    UNION ALL
    SELECT t.ts, t.value
    FROM (SELECT c.last_ts, c.last_value, c.prev_ts, c.prev_value FROM fleet.chunk_tails c
          WHERE c.pod = ANY(pods) AND c.series_id = id AND c.first_ts < before ORDER BY c.first_ts DESC LIMIT 2) c
    CROSS JOIN LATERAL (VALUES (c.last_ts, c.last_value), (c.prev_ts, c.prev_value)) AS t(ts, value)
    WHERE t.ts < before
  ) x ORDER BY x.ts DESC LIMIT n;
END $$;
"""


def grafana_layer(conn: Connection, shards: list[str], pod_map: dict[str, str], readers: list[str]) -> None:
    """(Re)build `fleet_grafana` (after the fleet tables: its view reads them) and put it first on the
    readers' search_path in this database."""
    conn.execute(text(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE"))
    conn.connection.driver_connection.execute(_SQL)  # type: ignore[union-attr]  # several statements
    number = {s: i for i, s in enumerate(sorted(shards), start=1)}
    rows = [{"p": pod, "n": number[shard], "s": shard} for pod, shard in sorted(pod_map.items())
            if shard in number]
    if rows:
        conn.execute(text(f"INSERT INTO {SCHEMA}.pods (pod, shard_no, shard) VALUES (:p, :n, :s)"), rows)
    db = conn.execute(text("SELECT current_database()")).scalar_one()
    for role in readers:
        conn.execute(text(f"GRANT USAGE ON SCHEMA {SCHEMA} TO {role}"))
        conn.execute(text(f"GRANT SELECT ON ALL TABLES IN SCHEMA {SCHEMA} TO {role}"))
        try:
            with conn.begin_nested():
                conn.execute(text(f'ALTER ROLE {role} IN DATABASE "{db}" SET search_path = {SCHEMA}, public'))
        except DBAPIError as exc:  # a role without the right: the panels read public's tables
            log.warning("%s: search_path not set (%s): its telemetry panels read this database's own tables, "
                        "empty when sharded (docs/dashboards.md)", role, str(exc).splitlines()[0])
