"""Publish N ``mark`` tasks at a steady pace, with kombu's publish retry, from its own process.

Run as ``python _kombu_load.py N`` with the acceptance app's environment. Each line of output
is ``ok <i> <seconds>`` once ``apply_async`` returned (the producer's ack: the row is
committed; a long one rode out an outage) or ``fail <i> <error>`` when it gave up, so the test
knows exactly what was promised.
"""

from __future__ import annotations

import sys
import time

from celery_app import mark

#: Outlasts a restart of a few seconds: kombu re-establishes the connection between attempts.
RETRY_POLICY = {"max_retries": 40, "interval_start": 0.1, "interval_step": 0.2,
                "interval_max": 0.5}
PACE_S = 0.02


def main(n: int) -> int:
    failed = 0
    for i in range(n):
        started = time.monotonic()
        try:
            mark.apply_async((i,), retry=True, retry_policy=RETRY_POLICY)
        except Exception as exc:  # report, keep going: the test decides what matters
            failed += 1
            print(f"fail {i} {type(exc).__name__}: {exc}", flush=True)
        else:
            print(f"ok {i} {time.monotonic() - started:.3f}", flush=True)
        time.sleep(PACE_S)  # a steady load, not a burst that ends before the restart
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
