"""How a ``delayq`` command fails (docs/reference/cli.md, "Errors and exit codes"): one line on
stderr, nothing on stdout, the documented exit status. Nothing here reaches a database: port 1
of localhost refuses at once."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from delayq_transport.cli import main
from delayq_transport.cli.errors import EXIT_UNAVAILABLE, EXIT_USAGE, one_line

NOWHERE = "postgresql://nobody@127.0.0.1:1/none"


def test_a_drivers_message_of_several_lines_becomes_one() -> None:
    text = ('connection failed: connection to server at "127.0.0.1", port 1 failed: '
            "Connection refused\n\tIs the server running on that host and accepting TCP/IP "
            "connections?\n")
    assert one_line(text) == (
        'connection failed: connection to server at "127.0.0.1", port 1 failed: Connection '
        "refused; Is the server running on that host and accepting TCP/IP connections?")
    assert one_line('FATAL:  database "x" does not exist') == 'FATAL: database "x" does not exist'


def test_an_unreachable_database_is_one_line_on_stderr_with_status_4() -> None:
    result = CliRunner().invoke(main, ["-d", NOWHERE, "tasks", "list"], env={"COLUMNS": "40"})
    assert result.exit_code == EXIT_UNAVAILABLE
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: database "), \
        result.stderr
    assert "Connection refused; Is the server running" in result.stderr


@pytest.mark.parametrize(("args", "says"), [
    (["--table", "1bad", "status"], "invalid table name '1bad'"),
    (["tasks", "reschedule", "x"], "give exactly one of --at or --in"),
    (["metrics", "--port", "99999"], "99999 is not in the range"),
    (["no-such-command"], "No such command 'no-such-command'"),
])
def test_usage_errors_exit_2_on_stderr(args: list[str], says: str) -> None:
    result = CliRunner().invoke(main, ["-d", NOWHERE, *args])
    assert result.exit_code == EXIT_USAGE, result.output
    assert result.stdout == "" and says in result.stderr, result.stderr

