"""Instructions per ``apply_async`` of a Celery no-op task, counted by valgrind, per broker.

CPU time per task moves by 20-30% on a shared machine; instructions executed do not: valgrind's
callgrind counts every instruction the producer process executes (Python, kombu, the client
library, the kernel excluded). A process publishes ``--small`` and then, in another run,
``--tasks`` no-op tasks with the benchmark's app (``celery_bench_app.py``) on the named
broker or delayq variant (``delayq@REV``, ``delayq~option=value``: bench/_variants.py); the
difference divided by the difference of the sizes is the producer's instructions per task,
start-up and warm-up excluded. Nothing consumes meanwhile; the broker state is fresh per broker
and removed afterwards. ``--profile`` instead runs ``--tasks`` publishes under cProfile (at full
speed) and prints where the time goes, by function.

System calls are not counted (the kernel's side of a round trip is not in the figure): the
profile's ``select``/``recv``/``send`` lines show how much time they take.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import click

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: _common, the harness

import _celery as cel  # noqa: E402
from _common import BENCH_DIR, console, markdown_table  # noqa: E402

#: The producer: the benchmark's app and publish loop, warmed up before the counted part.
LOOP = """
import functools, os, sys, celery_bench_app
window = os.environ.get("BENCH_ANNOUNCE_WINDOW")
try:
    from delayq_transport.core import announce
except ImportError:  # a revision from before core/queue/announce.py
    announce = None
if window and announce is not None:  # a diagnostic only: core/queue/announce.py's wake-up window
    announce.Announcer.__init__.__defaults__ = (float(window),)
celery_bench_app.configure()
app = celery_bench_app.app
task = app.tasks["bench.noop"]
n, key = int(sys.argv[1]), sys.argv[2]
with app.producer_or_acquire() as producer:
    producer.connection.ensure_connection(max_retries=5)
    producer.maybe_declare(app.amqp.queues[app.conf.task_default_queue])
    for _ in range(50):
        task.apply_async((key, 10**9), producer=producer)
    if os.environ.get("BENCH_PROFILE", "-1") != "-1":
        import cProfile, pstats
        import time
        prof = cProfile.Profile(time.thread_time)  # CPU of this thread: waits excluded
        prof.enable()
    import resource, time
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    # Under valgrind only what runs inside functools.reduce is counted (--toggle-collect):
    # the publishes of this thread, not start-up, warm-up, exit or other threads.
    functools.reduce(lambda acc, _: task.apply_async((key, 10**9), producer=producer) and acc,
                     range(n), 0)
    r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    print("rusage per task: user %.1f us, system %.1f us, voluntary switches %.2f, "
          "involuntary %.2f, wall %.1f us" % (
              (r1.ru_utime - r0.ru_utime) * 1e6 / n, (r1.ru_stime - r0.ru_stime) * 1e6 / n,
              (r1.ru_nvcsw - r0.ru_nvcsw) / n, (r1.ru_nivcsw - r0.ru_nivcsw) / n,
              (t1 - t0) * 1e6 / n), file=sys.stderr)
    if os.environ.get("BENCH_PROFILE", "-1") != "-1":
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(int(os.environ["BENCH_PROFILE"]))
"""


def _run(env: dict[str, str], n: int, *, valgrind: bool, profile: int = 0,
         window: float | None = None) -> str:
    key = f"bench_celery:instr:{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        cmd = [sys.executable, "-c", LOOP, str(n), key]
        if valgrind:
            cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                   "--toggle-collect=functools_reduce", "--dump-instr=no",
                   "--compress-strings=no", *cmd]
        run_env = {**env, **({"BENCH_PROFILE": str(profile)} if profile else {}),
                   **({"BENCH_ANNOUNCE_WINDOW": str(window)} if window is not None else {})}
        done = subprocess.run(cmd, cwd=BENCH_DIR, env=run_env, capture_output=True, text=True,
                              timeout=3600)
        if done.returncode != 0:
            raise RuntimeError(f"producer exited {done.returncode}:\n{done.stderr[-3000:]}")
        if not valgrind:
            return done.stdout + done.stderr[-400:]
        match = re.search(r"^(?:summary|totals):\s+(\d+)", out.read_text(), re.M)
        assert match is not None, "no totals in callgrind's output"
        return match.group(1)


def count(name: str, cfg: cel.Settings, small: int, big: int, window: float | None
          ) -> dict[str, Any]:
    with cel.broker_state(name, "instr", cfg) as run:
        a = int(_run(run.env, small, valgrind=True, window=window))
        b = int(_run(run.env, big, valgrind=True, window=window))
    return {"instructions_per_task": round((b - a) / (big - small)), "small": a, "big": b}


@click.command()
@click.option("--brokers", default="delayq,amqp", show_default=True,
              help="Comma-separated brokers of bench_celery.py and delayq variants.")
@click.option("--tasks", default=1000, show_default=True)
@click.option("--small", default=200, show_default=True)
@click.option("--profile", "profile", default=0,
              help="Instead: cProfile of --tasks publishes (thread CPU), this many functions "
                   "per broker; -1: no profile, only the process' CPU (user, system) and "
                   "context switches per publish.")
@click.option("--window", type=float, default=None,
              help="delayq's wake-up window (core/queue/announce.py), s: 0 sends one per publish "
                   "on the publishing thread, 1000 none (the thread sends them, not counted). "
                   "Valgrind slows a publish past the default 5 ms: every one then sends.")
@click.option("--admin-url", default="postgresql://postgres@127.0.0.1:5432/postgres",
              show_default=True)
@click.option("--redis-db", default=11, show_default=True)
@click.option("--counter-db", default=12, show_default=True)
def main(brokers: str, tasks: int, small: int, profile: int, window: float | None,
         admin_url: str, redis_db: int, counter_db: int) -> None:
    """Instructions per apply_async (valgrind), or a cProfile of the publish loop."""
    cfg = cel.Settings.build(False, producers=1, admin_url=admin_url, redis_db=redis_db,
                            counter_db=counter_db)
    rows = []
    for name in brokers.split(","):
        if profile:
            with cel.broker_state(name, "instr", cfg) as run:
                print(f"== {name}\n" + _run(run.env, tasks, valgrind=False, profile=profile,
                                            window=window))
            continue
        got = count(name, cfg, small, tasks, window)
        rows.append([name, f"{got['instructions_per_task']:,}"])
        console.print(f"{name}: {got}")
    if rows:
        console.print(markdown_table(["broker", "instructions per apply_async"], rows, "lr"))


if __name__ == "__main__":
    main()
