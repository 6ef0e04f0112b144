"""Build each row's Celery message and COPY tuple in Spark's JVM, with Spark SQL functions.

Issue 13 measured the per-row Python encoder (:mod:`.rows`, after shipping every Row from
the JVM) at 12,911 rows/s, and the all-ignored re-run, which stores nothing, at only 18,107:
the time went into building messages in Python, not into PostgreSQL. Here the same bytes
are computed by Spark's generated code and arrive in Python as one binary column of ready
binary-COPY tuples, which the writer streams without touching rows.

The JVM path covers the common case exactly and leaves the rest to :mod:`.rows`:

* argument columns of integral, boolean or string type (``repr`` and JSON of these are
  reproduced exactly; floats, decimals, dates, structs... go to Python);
* strings without control, format or separator characters other than the space (so
  JSON escaping is only ``\\`` and ``"``, and Python's ``repr`` keeps every character);
* an ETA that is a timestamp/date column or a countdown, present, from 1970 to 9999;
  a key column (if any) of string or integral type, present, at most 200 characters,
  without control characters.

Every other row goes to the Python path, which builds the same message or counts it bad.
``tests/integration/test_spark_encode.py`` decodes both paths' messages for the same rows
and compares them, keys included.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ..core.queue import MAX_KEY_CHARS
from .rows import _NAMESPACE_BYTES, Plan, encoder

_INTEGRAL = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
#: Characters Python's repr escapes, or that JSON escaping would have to: controls, format
#: characters, unassigned code points, separators other than the plain space.
_UNSAFE_CHARS = r"[\p{C}\p{Z}&&[^ ]]"
#: Last millisecond Python's datetime can carry (year 9999).
_MAX_ETA_MS = 253_402_300_799_999
_MS_PER_DAY = 86_400_000
_REPR_LIMIT = 1024
#: Python's ``json.dumps`` of the constant last element of a protocol-2 body.
_EMBED_JSON = json.dumps({"callbacks": None, "errbacks": None, "chain": None, "chord": None})


def jvm_capable(projected: DataFrame, plan: Plan) -> bool:
    """Whether the column types allow the JVM path at all (rows are checked one by one later)."""
    fields = projected.schema.fields
    if plan.countdown_ms is None and not isinstance(fields[0].dataType, T.LongType):
        return False  # ETA strings / timestamp_ntz: Python parses them
    if plan.has_key and not isinstance(fields[plan.key_at].dataType, (T.StringType, *_INTEGRAL)):
        return False
    return all(isinstance(f.dataType, (T.StringType, T.BooleanType, *_INTEGRAL))
               for f in fields[plan.args_at:])


def jvm_ok(projected: DataFrame, plan: Plan) -> Column:
    """Whether a row can take the JVM path (from its own columns: a cheap filter)."""
    fields = projected.schema.fields
    at = (F.lit(plan.now_ms + plan.countdown_ms) if plan.countdown_ms is not None
          else F.col(fields[0].name))
    checks = [_string_safe(F.col(f.name)) for f in fields[plan.args_at:]
              if isinstance(f.dataType, T.StringType)]
    checks += [at.isNotNull(), at >= 0, at <= F.lit(_MAX_ETA_MS)]
    if plan.countdown_ms is None and plan.past_eta == "skip":
        checks.append(at >= F.lit(plan.now_ms))
    if plan.has_key:
        key = F.col(fields[plan.key_at].name).cast("string")
        checks += [key.isNotNull(), F.length(key) <= MAX_KEY_CHARS, _string_safe(key)]
    return F.coalesce(_all(checks), F.lit(False))


def jvm_records(projected: DataFrame, plan: Plan) -> DataFrame:
    """One pass over ``projected``: ``_dq_record``, the binary COPY tuple of each row that
    passes :func:`jvm_ok` (else null), and ``_dq_row``, the row's own values for the others
    (else null), which the writer hands to the Python encoder; with a run id also ``_dq_fp``,
    the hash of the key (null with the tuple).

    Built in steps with named intermediate columns: an expression used several times (the
    key's sha1, the key, the payload) is computed once per row, because Spark does not merge
    a projection into the next when that would duplicate an expensive expression. One nested
    expression instead evaluated the sha1 dozens of times per row (measured: 10x slower).
    Every step is null for rows that fail the check, so no function sees values it could
    fail on (ANSI mode raises on overflows).
    """
    fields = projected.schema.fields
    originals = [F.col(f.name) for f in fields]
    values = [(F.col(f.name), f.dataType) for f in fields[plan.args_at:]]
    at_ms = F.lit(plan.now_ms + plan.countdown_ms) if plan.countdown_ms is not None else \
        originals[0]
    df = projected.select(*originals, jvm_ok(projected, plan).alias("_dq_ok"))
    ok = F.col("_dq_ok")
    df = df.withColumn("_dq_at", F.when(ok, at_ms.cast("long")))
    at = F.col("_dq_at")
    if plan.has_key:
        df = df.withColumn("_dq_key", F.when(ok, originals[plan.key_at].cast("string")))
    else:
        df = df.withColumn("_dq_h", F.when(ok, _canonical_sha1(plan, values, at)))
        df = df.withColumn("_dq_key", _uuid5_of_hex(F.col("_dq_h"))).drop("_dq_h")
    key = F.col("_dq_key")
    tag_name = F.concat(F.lit(bytearray(plan.kind.encode() + b"\x00")), F.encode(key, "UTF-8"))
    df = df.withColumn("_dq_th", _sha1(tag_name))
    df = df.withColumn("_dq_kj", _json_str(key, escape=plan.has_key))  # a uuid needs none
    df = df.withColumn("_dq_tag", _uuid5_of_hex(F.col("_dq_th")))
    payload = _payload(plan, F.col("_dq_kj"), F.col("_dq_tag"), values, at)
    df = df.select(*originals, ok, at, key, payload.alias("_dq_payload"))
    record = _copy_tuple(key, plan.kind, F.col("_dq_payload"), at)
    # With a run id: the key's xxhash64 for the part's fingerprint (spark/runs.py hashes the
    # same UTF-8 bytes when it finds them in a tuple the Python encoder built).
    fingerprint = [F.when(ok, F.xxhash64(key)).alias("_dq_fp")] if plan.run_id is not None \
        else []
    return df.select(record.alias("_dq_record"),
                     F.when(~ok, F.struct(*originals)).alias("_dq_row"), *fingerprint)


def _all(checks: Sequence[Column]) -> Column:
    out = checks[0]
    for check in checks[1:]:
        out = out & check
    return out


def _string_safe(col: Column) -> Column:
    return F.coalesce(~col.rlike(_UNSAFE_CHARS), F.lit(True))


# -- JSON and repr of one value ---------------------------------------------------------------


def _json_str(col: Column, escape: bool = True) -> Column:
    """JSON string literal of a safe string (only ``\\`` and ``"`` need escaping; most
    strings have neither, and a search is cheaper than two replaces)."""
    if escape:
        escaped = F.replace(F.replace(col, F.lit("\\"), F.lit("\\\\")), F.lit('"'), F.lit('\\"'))
        col = F.when(col.contains("\\") | col.contains('"'), escaped).otherwise(col)
    return F.concat(F.lit('"'), col, F.lit('"'))


def _json(col: Column, dtype: T.DataType) -> Column:
    if isinstance(dtype, T.StringType):
        text = _json_str(col)
    elif isinstance(dtype, T.BooleanType):
        text = F.when(col, F.lit("true")).otherwise(F.lit("false"))
    else:
        text = col.cast("string")
    return F.coalesce(text, F.lit("null"))


def _repr(col: Column, dtype: T.DataType) -> Column:
    """Python's ``repr``: double quotes only when the text has ``'`` and no ``"``."""
    if isinstance(dtype, T.StringType):
        has_slash = col.contains("\\")
        slashed = F.when(has_slash, F.replace(col, F.lit("\\"), F.lit("\\\\"))).otherwise(col)
        double = F.concat(F.lit('"'), slashed, F.lit('"'))
        quoted = F.replace(slashed, F.lit("'"), F.lit("\\'"))
        single = F.concat(F.lit("'"), F.when(col.contains("'"), quoted).otherwise(slashed),
                          F.lit("'"))
        text = F.when(col.contains("'") & ~col.contains('"'), double).otherwise(single)
    elif isinstance(dtype, T.BooleanType):
        text = F.when(col, F.lit("True")).otherwise(F.lit("False"))
    else:
        text = col.cast("string")
    return F.coalesce(text, F.lit("None"))


def _join(parts: Sequence[Column], sep: str) -> list[Column]:
    out: list[Column] = []
    for i, part in enumerate(parts):
        if i:
            out.append(F.lit(sep))
        out.append(part)
    return out


def _concat(parts: Sequence[Column]) -> Column:
    return F.concat(*parts) if parts else F.lit("")


# -- key, message, tuple ------------------------------------------------------------------------


def _sha1(name_bytes: Column) -> Column:
    return F.sha1(F.concat(F.lit(bytearray(_NAMESPACE_BYTES)), name_bytes))


def _uuid5_of_hex(h: Column) -> Column:
    """``rows.uuid5`` in SQL, from the sha1 hex of namespace + name: a version-5 UUID."""
    # The variant digit is 8, 9, a or b by the low two bits of hex digit 16 (a cached
    # translate table: conv() + array lookup cost more than the rest of the UUID).
    variant = F.translate(F.substring(h, 17, 1), "0123456789abcdef", "89ab" * 4)
    return F.concat(F.substring(h, 1, 8), F.lit("-"), F.substring(h, 9, 4), F.lit("-5"),
                    F.substring(h, 14, 3), F.lit("-"), variant, F.substring(h, 18, 3),
                    F.lit("-"), F.substring(h, 21, 12))


def _canonical_sha1(plan: Plan, values: list[tuple[Column, T.DataType]], at_ms: Column) -> Column:
    """sha1 behind ``rows.default_key``: json.dumps([task, args, kwargs, eta], sort_keys,
    compact separators, raw UTF-8)."""
    args = [_json(c, t) for c, t in values[: plan.arg_count]]
    named = sorted(zip(plan.kwarg_names, values[plan.arg_count:], strict=True),
                   key=lambda item: item[0])
    kwargs = [F.concat(F.lit(json.dumps(n, ensure_ascii=False) + ":"), _json(c, t))
              for n, (c, t) in named]
    eta = (F.lit(json.dumps(f"countdown:{plan.countdown_ms}")) if plan.countdown_ms is not None
           else at_ms.cast("string"))
    canonical = F.concat(F.lit(f"[{json.dumps(plan.task, ensure_ascii=False)},["),
                         *_join(args, ","), F.lit("],{"), *_join(kwargs, ","), F.lit("},"),
                         eta, F.lit("]"))
    return _sha1(F.encode(canonical, "UTF-8"))


def _iso(at_ms: Column) -> Column:
    """``datetime.isoformat()`` of the aware UTC instant, computed without time zones."""
    day = F.date_from_unix_date(F.floor(at_ms / _MS_PER_DAY).cast("int")).cast("string")
    rest = F.pmod(at_ms, F.lit(_MS_PER_DAY))

    def two(n: Column) -> Column:
        return F.lpad(n.cast("string"), 2, "0")

    frac_ms = F.pmod(at_ms, F.lit(1000))
    frac = F.when(frac_ms == 0, F.lit("")).otherwise(
        F.concat(F.lit("."), F.lpad((frac_ms * 1000).cast("string"), 6, "0")))
    return F.concat(day, F.lit("T"), two(F.floor(rest / 3_600_000)), F.lit(":"),
                    two(F.pmod(F.floor(rest / 60_000), F.lit(60))), F.lit(":"),
                    two(F.pmod(F.floor(rest / 1000), F.lit(60))), frac, F.lit("+00:00"))


def _payload(plan: Plan, key_json: Column, tag: Column,
             values: list[tuple[Column, T.DataType]], at_ms: Column) -> Column:
    """The bytes ``TaskMessageEncoder.encode`` returns, slot by slot over its template."""
    args, kwarg_values = values[: plan.arg_count], values[plan.arg_count:]
    args_json = [_json(c, t) for c, t in args]
    kwargs_json = [F.concat(F.lit(json.dumps(n) + ": "), _json(c, t))
                   for n, (c, t) in zip(plan.kwarg_names, kwarg_values, strict=True)]
    body = F.concat(F.lit("[["), *_join(args_json, ", "), F.lit("], {"),
                    *_join(kwargs_json, ", "), F.lit("}, " + _EMBED_JSON + "]"))
    # base64() may wrap lines (spark.sql.chunkBase64String.enabled): drop the MIME breaks
    # (a plain replace; a regex here cost as much as the rest of the message).
    b64 = F.replace(F.base64(F.encode(body, "UTF-8")), F.lit("\r\n"), F.lit(""))
    arg_reprs = [_repr(c, t) for c, t in args]
    tail = "," if len(args) == 1 else ""
    argsrepr = F.concat(F.lit("("), *_join(arg_reprs, ", "), F.lit(tail + ")"))
    kwarg_reprs = [F.concat(F.lit(repr(n) + ": "), _repr(c, t))
                   for n, (c, t) in zip(plan.kwarg_names, kwarg_values, strict=True)]
    kwargsrepr = F.concat(F.lit("{"), *_join(kwarg_reprs, ", "), F.lit("}"))
    slots = {
        "body": F.concat(F.lit('"'), b64, F.lit('"')),
        "id": key_json, "root_id": key_json, "correlation_id": key_json,
        "eta": F.concat(F.lit('"'), _iso(at_ms), F.lit('"')),
        "argsrepr": _json_str(F.substring(argsrepr, 1, _REPR_LIMIT)),
        "kwargsrepr": _json_str(F.substring(kwargsrepr, 1, _REPR_LIMIT)),
        "delivery_tag": F.concat(F.lit('"'), tag, F.lit('"')),
    }
    literals, names = encoder(plan.task, plan.queue, plan.priority, plan.origin).template()
    parts = [F.lit(literals[0])]
    for name, literal in zip(names, literals[1:], strict=True):
        parts += [slots[name], F.lit(literal)]
    return F.encode(F.concat(*parts), "UTF-8")


def _int32(n: Column) -> Column:
    return F.unhex(F.lpad(F.hex(n), 8, "0"))


def _copy_tuple(key: Column, kind: str, payload: Column, at_ms: Column) -> Column:
    """``core.integrations.copy_record`` in SQL: 4 fields, each length-prefixed, big-endian."""
    key_bytes = F.encode(key, "UTF-8")
    kind_bytes = kind.encode()
    kind_field = len(kind_bytes).to_bytes(4, "big") + kind_bytes
    return F.concat(F.lit(bytearray(b"\x00\x04")), _int32(F.octet_length(key_bytes)), key_bytes,
                    F.lit(bytearray(kind_field)), _int32(F.octet_length(payload)), payload,
                    F.lit(bytearray(b"\x00\x00\x00\x08")),
                    F.unhex(F.lpad(F.hex(at_ms), 16, "0")))
