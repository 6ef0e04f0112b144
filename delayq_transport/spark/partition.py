"""One partition of ``schedule_tasks``: runs on the executors, inside ``mapInArrow``.

The partition streams its binary COPY tuples into a :class:`~..core.integrations.BulkWriter`, builds
the tuples of the rows the JVM could not encode with the Python encoder (:mod:`.rows`), counts
bad rows with a sample, and yields one row of counts, which the driver adds up.

With a run id (``Plan.run_id``) the partition is one part of a run, identified by its
partition index: the writer applies it in one transaction together with its entry in the run
ledger, or finds it applied and writes nothing (``skipped``), after checking that the
partition holds the same records as when it was applied: as many, and the same wrapping sum of
64-bit hashes of their keys (the ``fp`` column, computed in the JVM; a row encoded here gets a
blake2b hash of its key instead: a row takes the same path in every attempt).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext

from ..core.integrations import BulkWriter
from ..core.ledgers import RunPart, add_fingerprints
from .rows import Plan, slow_record

#: What every partition yields (one row), in ``mapInArrow``'s schema syntax.
COUNTS = "created long, updated long, ignored long, skipped long, bad long, sample string"
#: What :func:`fingerprint_partition` yields for a part the ledger holds.
FINGERPRINTS = "part long, rows long, fingerprint long"


def write_partition(plan: Plan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Stream tuples into the staging table, merge per chunk, yield this partition's counts."""
    bad, sample = 0, list[list[str]]()
    run = _part(plan)
    writer: BulkWriter | None = None
    try:
        for batch in batches:
            records, extra, failed, fingerprint = _split(plan, batch)
            bad += len(failed)
            sample += failed[: max(plan.sample_size - len(sample), 0)]
            if len(records) or extra:
                writer = writer or _writer(plan, run)
                writer.write([_contiguous(records), *extra], len(records) + len(extra),
                             fingerprint)
        if run is not None:  # an empty part is recorded too: a re-run checks it is still empty
            writer = writer or _writer(plan, run)
        if writer is not None:
            writer.finish()
    finally:
        if writer is not None:
            writer.close()
    c = writer.counts if writer is not None else None
    yield pa.RecordBatch.from_pydict({
        "created": [c.created if c else 0], "updated": [c.updated if c else 0],
        "ignored": [c.ignored if c else 0], "skipped": [c.skipped if c else 0], "bad": [bad],
        "sample": [json.dumps(sample)]})


def fingerprint_partition(plan: Plan, parts: frozenset[int],
                          batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Records and fingerprint of this partition as :func:`write_partition` would apply it,
    writing nothing; only for the parts in ``parts`` (the others are not read)."""
    context = TaskContext.get()
    part = context.partitionId() if context is not None else -1
    if part not in parts:
        return
    rows, fingerprint = 0, 0
    for batch in batches:
        records, extra, _, batch_fingerprint = _split(plan, batch)
        rows += len(records) + len(extra)
        fingerprint = add_fingerprints(fingerprint, batch_fingerprint)
    yield pa.RecordBatch.from_pydict({"part": [part], "rows": [rows],
                                      "fingerprint": [fingerprint]})


def _part(plan: Plan) -> RunPart | None:
    """This partition as a part of the plan's run: the part number is the partition index."""
    if plan.run_id is None:
        return None
    context = TaskContext.get()
    if context is None:
        raise RuntimeError("write_partition runs inside a Spark task")
    return RunPart(plan.run_id, context.partitionId())


def _writer(plan: Plan, run: RunPart | None) -> BulkWriter:
    return BulkWriter(plan.database_url, table=plan.table, can_update=plan.can_update,
                      flush_rows=plan.chunk_size, run=run)


def _split(plan: Plan, batch: pa.RecordBatch
           ) -> tuple[pa.Array, list[bytes], list[list[str]], int]:
    """(JVM-built tuples, tuples the Python encoder built here, [reason, shown] of bad rows,
    fingerprint of the tuples' keys: 0 without a run id)."""
    records, reasons, shown, rows = (batch.column(i) for i in range(4))
    failed: list[list[str]] = []
    if reasons.null_count < len(reasons):
        is_bad = pc.is_valid(reasons)
        failed = [[r, s] for r, s in zip(reasons.filter(is_bad).to_pylist(),
                                         shown.filter(is_bad).to_pylist(), strict=True)]
    extra: list[bytes] = []
    if rows.null_count < len(rows):
        for values in rows.filter(pc.is_valid(rows)).to_pylist():
            record, reason, described = slow_record(plan, tuple(values.values()))
            if record is not None:
                extra.append(record)
            else:
                failed.append([reason or "", described or "{}"])
    fingerprint = 0
    if plan.run_id is not None:
        hashes = batch.column(4).fill_null(0).to_numpy(zero_copy_only=False)
        fingerprint = add_fingerprints(int(hashes.view(np.uint64).sum(dtype=np.uint64)),
                                       *(_key_hash(r) for r in extra))
    if records.null_count:
        records = records.filter(pc.is_valid(records))
    return records, extra, failed, fingerprint


def _key_hash(record: bytes) -> int:
    """64-bit hash of the key of a binary COPY tuple (field count, key length, key...)."""
    length = int.from_bytes(record[2:6], "big")
    return int.from_bytes(hashlib.blake2b(record[6:6 + length], digest_size=8).digest(), "big",
                          signed=True)


def _contiguous(records: pa.Array) -> memoryview:
    """The bytes of every value of a binary array, back to back, without copying."""
    offsets_type = "<i8" if pa.types.is_large_binary(records.type) else "<i4"
    offsets = np.frombuffer(records.buffers()[1], dtype=offsets_type)
    start, end = int(offsets[records.offset]), int(offsets[records.offset + len(records)])
    return memoryview(records.buffers()[2])[start:end]
