"""A ``PeriodicScheduler`` process for the catch-up test (test_dramatiq_worker.py).

Declares ``catch_up_tick`` periodic twice, under ``coalesce`` and ``skip``, prints ``ready``
once connected, waits for a line on stdin (so the test starts several at the instant it
chooses), then refreshes every second until killed. The horizon is a few seconds, so an
outage of the schedulers outlasts it quickly.
"""

from __future__ import annotations

import sys

import dramatiq_app

from delayq_transport.dramatiq.periodic import REGISTRY, PeriodicScheduler, periodic

PERIOD_S = 3
GRACE_S = 0.5
HORIZON_S = 3.0
POLICIES = ("coalesce", "skip")


def entry_name(policy: str) -> str:
    return f"dramatiq:catchup-{policy}"


def main() -> None:
    for policy in POLICIES:
        periodic(every=PERIOD_S, misfire=policy, grace=GRACE_S, name=entry_name(policy),
                 args=(policy,))(dramatiq_app.catch_up_tick)
    scheduler = PeriodicScheduler(
        dramatiq_app.broker, refresh_interval=1.0, horizon=HORIZON_S, min_occurrences=1,
        entries={entry_name(p): REGISTRY[entry_name(p)] for p in POLICIES})
    print("ready", flush=True)
    sys.stdin.readline()
    scheduler.run_forever()


if __name__ == "__main__":
    main()
