"""Bugs planted by ``check.py``, each with the tests that must catch it (issue 38).

``old`` must occur exactly once in ``path``; ``new`` is the bug. ``item`` is the issue item the
mutation belongs to. Keep each replacement small and obvious: it stands for a regression a
reviewer could miss, and the named tests are the ones whose names claim to guard against it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutation:
    name: str
    item: str
    path: str
    old: str
    new: str
    tests: list[str]
    why: str


MUTATIONS: list[Mutation] = [
    Mutation(
        "dead-letter-expiry", "49.3", "delayq_transport/formats/deadletters.py",
        "    return expire(queue, kinds_ending(queue, SUFFIX))",
        "    return 0",
        ["tests/integration/test_dramatiq_broker.py::"
         "test_nack_moves_the_row_to_dead_letters_which_expire_after_their_retention",
         "tests/acceptance/test_dead_letters.py::"
         "test_a_rejected_message_is_listed_then_expired_by_the_worker"],
        "the one dead-letter expiry deletes nothing"),
    Mutation(
        "celery-reject-drops", "49.3", "delayq_transport/transport/channel.py",
        "            self.channel.dead_letter(delivery_tag)",
        "            self.channel.settle([delivery_tag], ack=True)",
        ["tests/integration/test_kombu_storage_contract.py::"
         "test_reject_without_requeue_keeps_a_dead_letter"],
        "a Celery message rejected without requeue is deleted, not kept"),
    Mutation(
        "schema-wait-gives-up-at-once", "49.6", "delayq_transport/core/schema/migrations.py",
        "        if timeout_s <= 0:",
        "        if True:",
        ["tests/acceptance/test_schema_wait.py::"
         "test_a_worker_waits_for_delayq_migrate_then_consumes"],
        "a worker on a database without the tables exits at once instead of waiting"),
    Mutation(
        "second-beat-never-starts", "2", "tests/acceptance/test_beat_processes.py",
        '    second = beat(start, scheduler="delayq", name="beat-alias", ready=None, '
        'extra_env=short)',
        "    second = first",
        ["tests/acceptance/test_beat_processes.py::test_two_beats_every_tick_runs_exactly_once"],
        "the two-beat test runs one beat only (a test-side mutation: the ticks it counts must "
        "depend on the second beat)"),
    Mutation(
        "second-beat-dies", "2", "tests/acceptance/test_beat_processes.py",
        "    for proc in (first, second):\n        proc.wait_for_log(BEAT_READY, timeout=60)\n",
        "    for proc in (first, second):\n        proc.wait_for_log(BEAT_READY, timeout=60)\n"
        "    second.kill(signal.SIGKILL)\n",
        ["tests/acceptance/test_beat_processes.py::test_two_beats_every_tick_runs_exactly_once"],
        "the second beat dies after its first refresh (a test-side mutation)"),
    Mutation(
        "installer-incremental-min-lead", "3", "delayq_transport/scheduling/installer.py",
        "            offers, can_update=False, min_lead=self.settings.min_lead)",
        "            offers, can_update=False, min_lead=None)",
        ["tests/integration/test_beat_installer.py::"
         "test_a_stalled_refresh_does_not_revive_a_tick_that_ran_meanwhile"],
        "the installer's incremental insert without min_lead: a tick that ran while a "
        "refresh stalled is installed again"),
    Mutation(
        "entry-hash-order", "4", "delayq_transport/scheduling/entries.py",
        "    canonical = json.dumps(shape, sort_keys=True, default=repr)",
        "    canonical = json.dumps(shape, sort_keys=False, default=repr)",
        ["tests/unit/test_beat_entries.py::test_hash_ignores_the_order_of_kwargs_and_options"],
        "entry_hash depends on the order of kwargs and options"),
    Mutation(
        "beat-list-ignores-next", "5", "delayq_transport/scheduling/listing.py",
        "                key_prefix(name), shown, config_hash=inst.config_hash)",
        "                key_prefix(name), 1, config_hash=inst.config_hash)",
        ["tests/integration/test_beat_scheduler.py::"
         "test_cli_list_shows_next_occurrences_with_install_time"],
        "`delayq beat list --next 2` shows one occurrence per entry"),
    Mutation(
        "beat-list-shows-install-time-as-occurrence", "5", "delayq_beat/cli.py",
        "upcoming = \"\\n\".join(f\"{_fmt(r.scheduled_at_initially_ms)} \"",
        "upcoming = \"\\n\".join(f\"{_fmt(r.created_at_ms)} \"",
        ["tests/integration/test_beat_scheduler.py::"
         "test_cli_list_shows_next_occurrences_with_install_time"],
        "`delayq beat list` shows when an occurrence was installed in place of its time"),
    Mutation(
        "reschedule-in-ignores-delay", "5", "delayq_transport/browse/service.py",
        "        return self.reschedule(ident, from_ms(self.inspector.now_ms()) + delay)",
        "        return self.reschedule(ident, from_ms(self.inspector.now_ms()))",
        ["tests/integration/test_tasks.py::test_cli_list_show_cancel_reschedule"],
        "`delayq tasks reschedule --in 2h` moves the task to now"),
    Mutation(
        "status-scheduled-always-zero", "5", "delayq_transport/core/queue/counts.py",
        "    return KindStatus(kind, int(due), int(scheduled), int(in_flight),",
        "    return KindStatus(kind, int(due), 0, int(in_flight),",
        ["tests/acceptance/test_demo_and_example.py::test_example_project_url_swap"],
        "`delayq status` shows no scheduled task (the example's six countdowns vanish)"),
    Mutation(
        "spark-report-nothing-overdue", "5", "delayq_transport/spark/read.py",
        '(F.col("scheduled_at") <= now_col))',
        '(F.col("scheduled_at") > now_col))',
        ["tests/integration/test_spark.py::test_spark_report_cli"],
        "`delayq spark-report` counts rows not yet due as overdue (and due ones not)"),
    Mutation(
        "held-row-not-in-flight", "5", "delayq_transport/core/inspect/inspector.py",
        "        return self.lock is not None and self.scheduled_at_ms > self.now_ms",
        "        return False",
        ["tests/browser/test_outcomes_pages.py::test_workers_retries_and_outcomes"],
        "the tasks page shows a task a worker holds as scheduled, not in flight"),
    Mutation(
        "dramatiq-batch-reversed", "6", "delayq_transport/dramatiq/consumer.py",
        "            env = self._buffer.popleft()",
        "            env = self._buffer.pop()",
        ["tests/acceptance/test_dramatiq_peer.py::test_dramatiq_peer_suite"],
        "a Dramatiq consumer hands the messages of one poll to the worker last first "
        "(Dramatiq's in-order test, tolerated as a timing failure before, could not tell)"),
    Mutation(
        "inspection-without-plan-guard", "10", "delayq_transport/core/queue/counts.py",
        '            cursor_of(conn).execute(q["count_plan_guard"])\n'
        '            return cursor_of(conn).execute(q[name], params).fetchall()',
        '            return cursor_of(conn).execute(q[name], params).fetchall()',
        ["tests/integration/test_reads_at_size.py::"
         "test_tasks_reads_and_counts_read_on_an_index"],
        "inspection reads run without count_plan_guard (the overview of queues with nothing "
        "due scans the table)"),
    Mutation(
        "beat-page-walks-the-kind", "10", "delayq_transport/scheduling/listing.py",
        "key_prefix(name), shown, config_hash=inst.config_hash)",
        "key_prefix(name), shown)",
        ["tests/integration/test_reads_at_size.py::"
         "test_every_web_page_and_api_call_reads_on_an_index"],
        "the beat page lists an entry's occurrences by walking its queue kind in time order"),
    Mutation(
        "poll-walks-past-now", "7", "delayq_transport/core/queue/queue.sql",
        '        WHERE ("pKind", "scheduledAt") >= (k.kind, k.low)\n'
        '          AND "pKind" = k.kind AND "scheduledAt" <= n.now\n'
        '        ORDER BY "pKind", "scheduledAt"\n'
        '        LIMIT %(limit)s\n'
        '        FOR UPDATE SKIP LOCKED',
        '        WHERE ("pKind", "scheduledAt") >= (k.kind, k.low)\n'
        '          AND ("pKind", "scheduledAt") <= (k.kind, n.now)\n'
        '        ORDER BY "pKind", "scheduledAt"\n'
        '        LIMIT %(limit)s\n'
        '        FOR UPDATE SKIP LOCKED',
        ["tests/integration/test_churn_short.py"],
        "the poll's upper bound as a row comparison, which PostgreSQL 15 does not stop the "
        "scan at: a short poll walks every far-future row of its kind (the same rows, the "
        "same result; the latency ratio the test checked before stayed ~1)"),
    Mutation(
        "demo-lateness-at-finish", "7", "delayq_transport/cli/demo.py",
        'started = {task_id: at for task_id, state, at in runs if state == "running"}',
        'started = {task_id: at for task_id, state, at in runs if state in ("running", '
        '"done")}',
        ["tests/acceptance/test_demo_and_example.py::test_delayq_demo_runs_to_completion"],
        "`delayq demo` measures lateness at each task's finish (its 0.5 s of work counted as "
        "lateness; the flaky task, which does not sleep, kept the minimum under the 500 ms "
        "the test compared with)"),
    Mutation(
        "import-change-warned-every-refresh", "42.3", "delayq_beat/source_changes.py",
        "        new = {name: c for name, c in now.items() if self._warned.get(name) != c}",
        "        new = now",
        ["tests/integration/test_beat_import_changes.py::test_a_beat_warns_once_per_change"],
        "beat logs an imported entry's admin edit at every refresh instead of once per change"),
    Mutation(
        "import-change-never-compared", "42.3", "delayq_beat/source_changes.py",
        '        elif step.action == "update" and step.entry is not None:',
        '        elif False:',
        ["tests/integration/test_beat_import_changes.py::"
         "test_beat_list_marks_entries_edited_in_the_admin_after_the_import",
         "tests/integration/test_beat_import_changes.py::test_a_beat_warns_once_per_change"],
        "an imported entry edited in the admin is silently ignored again (only deletions shown)"),
    Mutation(
        "django-refusal-without-setting", "42.3", "delayq_transport/django/apps.py",
        "        return Joined(connection, hint) if connection.in_atomic_block else None",
        "        return Joined(connection) if connection.in_atomic_block else None",
        ["tests/integration/test_django_refusal.py::"
         "test_an_atomic_block_on_another_database_is_refused_naming_the_setting"],
        "the wrong-database refusal in Django no longer names DELAYQ_DATABASE"),
    Mutation(
        "cli-read-creates-schema", "42.4", "delayq_transport/cli/main.py",
        "            require_schema(db, self.table)\n"
        "            queue = DelayedQueue(db, table=self.table, ensure_schema=False)",
        "            queue = DelayedQueue(db, table=self.table)",
        ["tests/integration/test_cli_read_only.py::"
         "test_a_read_only_command_on_a_database_without_the_tables_creates_nothing"],
        "`delayq status` (and every command that reads) creates delayq's tables in a database "
        "that had none"),
    Mutation(
        "cli-log-at-terminal-width", "42.4", "delayq_transport/output.py",
        "        return size if self.on_terminal else ConsoleDimensions(LOG_WIDTH, size.height)",
        "        return size",
        ["tests/integration/test_cli_read_only.py::"
         "test_tables_off_a_terminal_keep_one_line_per_row"],
        "`delayq tasks list > file` folds a long task id and task name over several lines"),
    Mutation(
        "cli-error-on-stdout", "42.2", "delayq_transport/cli/errors.py",
        "{one_line(message)}\", err=True)",
        "{message}\")",
        ["tests/unit/test_cli_errors.py::"
         "test_an_unreachable_database_is_one_line_on_stderr_with_status_4"],
        "a database error goes to stdout, over several lines"),
    Mutation(
        "docs-refusal-wrapped-by-kombu", "51.2", "delayq_transport/transport/kombu_transport.py",
        "    recoverable_channel_errors: tuple[type[BaseException], ...] = ()",
        "    recoverable_channel_errors = channel_errors",
        ["tests/integration/test_captured_failures.py::"
         "test_a_delay_inside_atomic_on_another_database_is_refused",
         "tests/integration/test_captured_failures.py::test_a_delay_as_a_role_without_grants"],
        "an exception's propagation: kombu retries a refusal and hands .delay()'s caller its "
        "OperationalError, while docs/troubleshooting.md shows TransactionRefused and "
        "PermissionDenied caught as themselves"),
    Mutation(
        "docs-unreachable-exit-status", "51.2", "delayq_transport/cli/errors.py",
        "EXIT_UNAVAILABLE = 4", "EXIT_UNAVAILABLE = 1",
        ["tests/integration/test_captured_failures.py::"
         "test_a_command_on_a_database_that_cannot_be_reached"],
        "an exit status: `delayq` on an unreachable database exits 1, while "
        "docs/troubleshooting.md shows the captured 4"),
    Mutation(
        "ack-batch-one-more-statement", "48.2", "delayq_transport/core/queue/delayed_queue.py",
        "        matches only its own (id, lock).\"\"\"\n"
        "        return sum(",
        "        matches only its own (id, lock).\"\"\"\n"
        "        self.db.fetchone(self.queries[\"db_now\"], {\"now\": None})\n"
        "        return sum(",
        ["tests/integration/test_counted_work.py"],
        "every ack batch sends one statement more (a read of the clock): the acks are as "
        "correct and about as fast, one round trip more per batch of 100"),
    Mutation(
        "docs-default-table-renamed", "51.3", "delayq_transport/cli/main.py",
        '@click.option("--table", default="delayed_queue"',
        '@click.option("--table", default="delayq_queue"',
        ["tests/integration/test_docs_blocks.py::test_the_pages_blocks_run[README.md]"],
        "a default: `delayq`'s --table default changes, and the `delayq status` README.md "
        "shows no longer finds the table its worker uses"),
    Mutation(
        "docs-join-atomic-alias-default", "51.1", "delayq_transport/django/apps.py",
        '        alias = getattr(settings, "DELAYQ_DATABASE", "default")',
        '        alias = getattr(settings, "DELAYQ_DATABASE", "queue")',
        ["tests/unit/test_docs_facts.py::test_the_django_settings_table_is_what_the_app_reads"],
        "a default: the atomic() blocks joined by default are another alias's than the one "
        "docs/how-to/django.md's settings table (and the admin's target) name"),
    Mutation(
        "docs-health-exit-status", "51.2",
        "delayq_transport/django/management/commands/delayq_health.py",
        "            sys.exit(1)", "            sys.exit(3)",
        ["tests/djtasks/test_commands.py::"
         "test_delayq_health_exit_status_says_what_a_monitor_needs"],
        "an exit status: an unhealthy `manage.py delayq_health` exits 3, while "
        "docs/how-to/django-admin.md shows the captured 1"),
    Mutation(
        "docs-publish-pairs", "51.4", "bench/systems.py",
        "SOCKET: False, CONFIRM: True,", "SOCKET: False, CONFIRM: False,",
        ["tests/unit/test_benchmarks_page.py::"
         "test_the_page_and_readme_are_what_the_results_render"],
        "a generated statement: RabbitMQ's publisher confirms no longer count as surviving a "
        "crash, so the pair README.md and docs/benchmarks.md state is no longer what the "
        "records' durability says"),
]
