"""The embedded broker (kombu's SQLAlchemy transport on PostgreSQL) when processes declare a queue together.

kombu checks for the queue's row, then inserts it, guarded by a lock within one process only. The
worker, its pool processes and beat are separate processes: the one that inserts second hits the
unique name index. That stopped beat in the demo. Here the other process's insert is placed, on its
own connection, exactly between this channel's check and its insert.
"""

from __future__ import annotations

import pytest
from kombu import Connection
from kombu.transport import sqlalchemy as kombu_sqla
from sqlalchemy import create_engine, text
from sqlalchemy.exc import IntegrityError

from service.db import normalize_url
from service.embedded import broker_url_for, celery_transport_options


def test_a_queue_another_process_created_first_is_read_not_a_crash(db_url: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    rival = create_engine(normalize_url(db_url))
    with Connection(broker_url_for(db_url), transport_options=celery_transport_options()) as conn:
        chan = conn.default_channel  # creates kombu's tables
        add = chan.session.add

        def other_process_first(obj: object) -> None:
            with rival.begin() as c:
                c.execute(text("INSERT INTO kombu_queue (id, name) VALUES (nextval('queue_id_sequence'), :n)"),
                          {"n": obj.name})  # type: ignore[attr-defined]
            add(obj)

        monkeypatch.setattr(chan.session, "add", other_process_first)
        with pytest.raises(IntegrityError, match="kombu_queue_name_key"):  # kombu's own channel: the crash
            kombu_sqla.Channel._get_or_create(chan, "fw-race-stock")
        chan.session.rollback()
        queue = chan._get_or_create("fw-race")  # ours: the queue the other process made
        assert queue.name == "fw-race"
        # kombu keeps the channel's session and the read transaction it began after the channel closes (a
        # worker's next poll commits it); this test polls no more, and the open transaction would block the
        # next test's TRUNCATE
        chan.session.close()
    with rival.connect() as c:
        assert c.execute(text("SELECT count(*) FROM kombu_queue WHERE name = 'fw-race'")).scalar_one() == 1
    rival.dispose()
