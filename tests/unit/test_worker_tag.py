"""Lock ids carry the worker tag of the process that made them, and a fork gets its own tag."""

from __future__ import annotations

import os

from delayq_transport.core.queue import leases


def test_lock_ids_start_with_the_worker_tag_and_a_fork_gets_a_new_one() -> None:
    a, b = leases.new_lock(), leases.new_lock()
    assert a != b and len(a) == len(b) == 36  # the lockUuid column's width
    assert a[:8] == b[:8] == leases.worker_tag() and a[8] == "-"
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its tag and leave at once
        os.write(write, leases.new_lock()[:8].encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 8).decode()
    os.waitpid(pid, 0)
    os.close(read)
    assert len(child) == 8 and child != leases.worker_tag()
