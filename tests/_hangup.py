"""A local TCP listener that closes every connection at once and counts them: how many times
a client tries a server that answers nothing (a retry loop shows as many attempts)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def hang_up_server() -> Iterator[tuple[int, list[int]]]:
    """(port, attempts): ``len(attempts)`` is the number of connections accepted so far."""
    attempts: list[int] = []
    stop = threading.Event()
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        server.settimeout(0.05)

        def hang_up() -> None:
            while not stop.is_set():
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    continue
                attempts.append(1)
                conn.close()

        thread = threading.Thread(target=hang_up, daemon=True)
        thread.start()
        try:
            yield server.getsockname()[1], attempts
        finally:
            stop.set()
            thread.join(timeout=5)
