"""Least privilege (issue 10, part 6): once ``delayq migrate`` has run as an admin, workers and
producers work with DML rights only, each role does its job and no more, and a missing
migration is named in a clear error instead of "permission denied for schema public"."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from zoneinfo import ZoneInfo

import psycopg
import pytest
from _pg_roles import grant_text, roles
from click.testing import CliRunner

from delayq_beat.store import BeatStore
from delayq_transport import Database, DelayedQueue, Offer, migrate
from delayq_transport.cli import main
from delayq_transport.core import ListenUndeliverable, PermissionDenied, SchemaMissing
from delayq_transport.core.db.queries import Queries
from delayq_transport.core.queue import Listener


@pytest.fixture
def urls(database_url: str) -> Iterator[dict[str, str]]:
    with roles(database_url, "worker", "producer", "monitor") as found:
        yield found


def _cannot_run_ddl(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("CREATE TABLE delayq_intruder (id int)")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute('ALTER TABLE delayed_queue ADD COLUMN "x" int')
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("TRUNCATE delayed_queue")


def test_grants_are_quoted_and_name_only_what_each_role_needs() -> None:
    worker = grant_text("worker", 'odd "role"')
    assert 'TO "odd ""role"""' in worker and "CREATE" not in worker
    assert 'SELECT, INSERT, UPDATE, DELETE ON "public"."delayed_queue"' in worker
    producer = grant_text("producer", "p")
    deletes = [line for line in producer.splitlines() if "DELETE" in line]
    # Its only DELETE is on the run ledger (a Spark job's retention), never on queued rows.
    assert deletes == ['GRANT SELECT, INSERT, DELETE ON "public"."delayed_queue__runs" TO "p";']
    assert "CREATE" not in producer
    assert 'GRANT SELECT, INSERT ON "public"."delayed_queue" TO "p"' in producer
    assert 'CREATE ON SCHEMA "public"' in grant_text("admin", "a")
    # Revoking a waiting task goes through the revoke function, never a DELETE on the table.
    execute = 'GRANT EXECUTE ON FUNCTION "public"."delayed_queue__revoke_waiting"(text[])'
    assert execute in producer and execute in worker
    assert "EXECUTE" not in grant_text("monitor", "m")
    result = CliRunner().invoke(main, ["grants", "--role", "x", "--as", "root"])
    assert result.exit_code != 0


def test_worker_role_polls_acks_leases_and_listens_without_ddl(urls: dict[str, str]) -> None:
    with DelayedQueue(urls["worker"], kind="celery", acquire_timeout=30) as q:
        q.offer("a", b"1")
        q.offer("b", b"2")
        q.offer("later", b"3", q.now() + timedelta(hours=1))
        first, second = q.try_poll_many(2)
        assert q.extend_lease([first.lock]) == 2
        assert q.release([second]) == 1
        assert q.ack(first) == 1
        assert q.count_due() == 1 and q.status()[0].scheduled == 1
        assert q.delete_waiting(["later"]) == [("later", "celery")]
        store = BeatStore(q.db, "delayed_queue")
        store.disable("nightly")
        assert [e.name for e in store.entries()] == ["nightly"] and store.remove("nightly")
        if q.db.transaction_pooling:  # behind PgBouncer (tests/topology): LISTEN is not tried
            with pytest.raises(ListenUndeliverable):
                Listener(q.db, q.queries)
        else:  # LISTEN (its probe notification arrives), then an offer's wake-up
            listener = Listener(q.db, q.queries)
            q.offer("c", b"4")
            listener.wait(10)
            assert [kind for kind, _ in listener.drain()] == ["celery"]
            listener.close()
    _cannot_run_ddl(urls["worker"])


def test_producer_publishes_but_cannot_take_or_delete(urls: dict[str, str],
                                                      database_url: str) -> None:
    with DelayedQueue(urls["producer"], kind="celery") as q:
        q.offer_batch([("p1", b"1", None), ("p2", b"2", None)])
        q.offer("p3", b"3")
        assert q.count_due() == 3
        for forbidden in (lambda: q.try_poll_many(1), lambda: q.purge(),
                          lambda: q.delete("p1")):
            with pytest.raises(PermissionDenied):
                forbidden()
    with DelayedQueue(database_url, kind="celery") as admin:
        assert admin.count_waiting() == 3, "nothing was taken or deleted"
    with psycopg.connect(urls["producer"], autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute('DELETE FROM delayed_queue WHERE "pKey" = %s', ("p1",))
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute('UPDATE delayed_queue SET "scheduledAt" = 0')
    _cannot_run_ddl(urls["producer"])


@pytest.mark.parametrize("profile", ["producer", "worker"])
def test_revoke_deletes_only_the_waiting_rows_named(urls: dict[str, str], database_url: str,
                                                    profile: str) -> None:
    """What ``app.control.revoke`` runs (the revoke function of migration 13): a role without
    DELETE on the table removes the waiting rows it names, exactly, in this table only, and
    never a row a consumer holds, whatever objects of its own it puts on its search_path."""
    with DelayedQueue(database_url, kind="celery", acquire_timeout=60) as admin, \
            DelayedQueue(database_url, kind="billing") as billing:
        later = admin.now() + timedelta(hours=1)
        admin.offer_batch([(k, b"x", later) for k in ("gone", "kept", "p_1")])
        admin.offer("held", b"h")
        assert [e.key for e in admin.try_poll_many(1)] == ["held"]
        billing.offer("other", b"o", later)
        with psycopg.connect(urls[profile], autocommit=True) as conn:  # a decoy of its own
            conn.execute("CREATE TEMP TABLE delayed_queue (LIKE public.delayed_queue)")
            conn.execute("INSERT INTO delayed_queue VALUES (1, 'kept', 'celery', '', 1, 1, "
                         "NULL, 1)")
            with DelayedQueue(urls[profile], kind="celery") as q:
                assert q.delete_waiting(["gone", "held", "p%", "p_", "nobody"]) == \
                    [("gone", "celery")]
                assert q.delete_waiting(["other"]) == [("other", "billing")]
            assert conn.execute("SELECT count(*) FROM pg_temp.delayed_queue").fetchone() == (1,)
        assert admin.get("gone") is None and billing.get("other") is None
        for key in ("kept", "p_1", "held"):
            assert admin.get(key) is not None, key
        assert admin.count_waiting() == 2  # kept, p_1: the held row is not waiting


def test_revoke_needs_its_grant(urls: dict[str, str], database_url: str) -> None:
    """PUBLIC may not execute the revoke function: the monitor role (read-only) cannot."""
    with DelayedQueue(database_url, kind="celery") as admin:
        admin.offer("k", b"x", admin.now() + timedelta(hours=1))
    with DelayedQueue(urls["monitor"], kind="celery") as q:
        with pytest.raises(PermissionDenied):
            q.delete_waiting(["k"])
    with DelayedQueue(database_url, kind="celery") as admin:
        assert admin.get("k") is not None


def test_migration_13_lets_roles_that_publish_revoke(database_url: str) -> None:
    """Upgrading: roles granted before the revoke function existed (INSERT on the table, as
    `delayq grants` printed then) may revoke once `delayq migrate` ran; a read-only role not."""
    with roles(database_url, "producer", "monitor") as urls:
        with psycopg.connect(database_url, autocommit=True) as conn:  # back to version 12
            conn.execute("DROP FUNCTION delayed_queue__revoke_waiting(text[])")  # and its grants
            conn.execute('DELETE FROM delayq_migrations WHERE "version" = 13')
        with Database(database_url) as db:
            assert migrate(db, "delayed_queue") == [13]
        with DelayedQueue(database_url, kind="celery") as admin:
            admin.offer("k", b"x", admin.now() + timedelta(hours=1))
        with DelayedQueue(urls["monitor"], kind="celery") as q:
            with pytest.raises(PermissionDenied):
                q.delete_waiting(["k"])
        with DelayedQueue(urls["producer"], kind="celery") as q:
            assert q.delete_waiting(["k"]) == [("k", "celery")]


def test_migration_18_lets_roles_granted_before_it_run_and_read_schedulers(
        database_url: str) -> None:
    """Upgrading: a worker role granted before the schedulers' heartbeats existed runs a
    scheduler once `delayq migrate` ran (it writes the ledger, so it gets the heartbeats' four
    rights); a monitor reads them; a producer (no ledger rights) gets nothing."""
    from delayq_beat.installer import Installer
    from delayq_transport.scheduling.entries import make_spec

    with roles(database_url, "worker", "monitor", "producer") as urls:
        with psycopg.connect(database_url, autocommit=True) as conn:  # back to version 16
            conn.execute("DROP TABLE delayq_schedule_schedulers")
            conn.execute('DELETE FROM delayq_migrations WHERE "version" = 18')
        with Database(database_url) as db:
            assert migrate(db, "delayed_queue") == [18]
        with DelayedQueue(urls["worker"], kind="celery") as q:
            store = BeatStore(q.db, q.table)
            inst = Installer(q, store, ZoneInfo("UTC"))
            assert inst.refresh({"e": make_spec("e", "tasks.t", 60.0)}).in_force
            inst.retire()
        count = 'SELECT count(*) FROM "delayq_schedule_schedulers"'
        with psycopg.connect(urls["monitor"]) as conn:
            assert conn.execute(count).fetchone() == (1,)
        with psycopg.connect(urls["producer"]) as conn:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(count)


@pytest.mark.parametrize("profile", ["producer", "worker"])
def test_spark_roles_apply_record_and_prune_runs(urls: dict[str, str], profile: str) -> None:
    """What a Spark job with a run id does as either role (core/ledgers/runs.py): stage and merge a
    part with its ledger entry in one transaction, find it applied, record the run, prune."""
    from delayq_transport.core.integrations import BulkWriter, copy_record
    from delayq_transport.core.ledgers import RunPart, prune_runs, record_run, run_state

    records = b"".join(copy_record(f"s{i}", "celery", b"{}", 4_000_000_000_000)
                       for i in range(20))
    for expected in ((20, 0), (0, 20)):
        with BulkWriter(urls[profile], flush_rows=10, run=RunPart("nightly", 0)) as writer:
            writer.write(records, 20, 7)
        assert (writer.counts.created, writer.counts.skipped) == expected
    with DelayedQueue(urls[profile], kind="celery") as q:
        record_run(q, "nightly", 20)
        assert run_state(q, "nightly").complete is not None
        assert prune_runs(q, 0) == 2 and not run_state(q, "nightly").parts
    _cannot_run_ddl(urls[profile])


def test_monitor_reads_status_and_metrics_only(urls: dict[str, str]) -> None:
    result = CliRunner().invoke(main, ["-d", urls["monitor"], "status", "--json"])
    assert result.exit_code == 0, result.output
    # The table view also reads the beat tables (periodic entries section).
    result = CliRunner().invoke(main, ["-d", urls["monitor"], "status"])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(main, ["-d", urls["monitor"], "metrics"])
    assert result.exit_code == 0 and "delayq_up{" in result.output
    # The failure list reads the task results (and the queue's dead letters) only.
    result = CliRunner().invoke(main, ["-d", urls["monitor"], "tasks", "list", "--state",
                                       "failed", "--json"])
    assert result.exit_code == 0, result.output
    with DelayedQueue(urls["monitor"], kind="celery") as q:
        with pytest.raises(PermissionDenied):
            q.offer("m", b"")


def test_missing_migration_is_named_for_a_dml_only_role(urls: dict[str, str],
                                                        database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(Queries("delayed_queue")["migrations_ensure"])
        conn.execute('DELETE FROM delayq_migrations WHERE "version" = 3')
    with pytest.raises(SchemaMissing) as raised:
        DelayedQueue(urls["worker"])
    message = str(raised.value)
    assert "missing migration(s) 3 (exchange bindings" in message
    assert "delayq migrate" in message
    result = CliRunner().invoke(main, ["-d", urls["worker"], "status"])
    assert result.exit_code == 3 and "lack migration(s) 3: run `delayq migrate`" in result.stderr
    with Database(database_url) as db:  # the admin step; idempotent DDL
        assert migrate(db, "delayed_queue") == [3]
    DelayedQueue(urls["worker"]).close()


def test_a_role_without_grants_is_told_what_it_lacks(database_url: str) -> None:
    import uuid

    from _pg_roles import role_url

    name = f"dq_none_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute(f'CREATE ROLE "{name}" LOGIN')
        try:
            with pytest.raises(PermissionDenied, match="delayq_migrations.*delayq grants"):
                DelayedQueue(role_url(database_url, name))
        finally:
            admin.execute(f'DROP ROLE "{name}"')


def test_migration_21_lets_roles_granted_before_it_claim_and_show_controlled_queues(
        database_url: str) -> None:
    """Upgrading: a worker role granted before the control tables existed claims a limited
    queue once `delayq migrate` ran; a monitor shows the controls; a producer gets nothing."""
    with roles(database_url, "worker", "monitor", "producer") as urls:
        with psycopg.connect(database_url, autocommit=True) as conn:  # back to version 20
            conn.execute("DROP TABLE delayed_queue__controls, delayed_queue__control_slots, "
                         "delayed_queue__control_keys")
            conn.execute("DROP FUNCTION delayed_queue__claim_controlled")
            conn.execute('DELETE FROM delayq_migrations WHERE "version" = 21')
        with Database(database_url) as db:
            assert migrate(db, "delayed_queue") == [21]
        with DelayedQueue(urls["worker"], kind="celery") as q:
            q.offer_batch([Offer("a", b"{}"), Offer("b", b"{}")])
            q.limit("celery", concurrency=1, key_rate="5/s")
            assert len(q.poll(5)[0]) == 1
        result = CliRunner().invoke(main, ["-d", urls["monitor"], "status", "--json"])
        assert result.exit_code == 0 and '"concurrency": 1' in result.output, result.output
        with psycopg.connect(urls["producer"]) as conn:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("SELECT 1 FROM delayed_queue__controls")
