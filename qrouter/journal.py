"""The delivery journal writer: Parquet segments of delivery events, written off the hot path.

The engine gathers delivery events in column buffers (qrouter/_fast/journal.pxi) and hands a
batch over with `JournalWriter.append_buffers` about twice a second, or every 65,536 rows;
tools and tests give Python lists with `append_batch`. A background thread wraps the buffers
as Arrow arrays (without copying them) and writes them as row groups of the current segment::

    <dir>/<router_id>-<start_ns>-<seq>.parquet

Each segment is written as ``<dir>/.<name>.tmp`` and renamed when it is complete, so a reader
(Spark, pyarrow.dataset: both skip names starting with ``.`` or ``_``) never sees a partial
file. A segment is closed after ``segment_rows`` rows or ``segment_seconds`` seconds, on
`flush` and on `close`. The schema and the meaning of each event are in docs/journal.md.

pyarrow is imported when the first writer is made, so the router runs without it while the
journal is off.
"""

from __future__ import annotations

import os
import queue
import threading
import time
import zlib
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

# Column name -> Arrow type name, in file order. `router` is filled in by the writer. A
# delivery's origin is `origin_prefix` + `origin_tag` in hex (see `origin_id`): stored in two
# parts, the prefix takes a few bits per row (dictionary-encoded) and nothing is formatted.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("time_ns", "int64"),
    ("router", "string"),
    ("connection", "int64"),
    ("link", "string"),
    ("address", "string"),
    ("tag", "binary"),
    ("origin_prefix", "string"),
    ("origin_tag", "binary"),
    ("event", "string"),
    ("outcome", "string"),
    ("size", "int32"),
    ("credit_stall_ns", "int64"),
)
COLUMN_NAMES = tuple(name for name, _ in COLUMNS)
NULLABLE = frozenset({"origin_prefix", "outcome", "credit_stall_ns"})
# Columns written dictionary-encoded: few distinct values, so a row costs a few bits.
DICTIONARY = frozenset({"router", "link", "address", "origin_prefix", "event", "outcome"})
# append_batch's columns (origin as one string: origin_id's form).
BATCH_COLUMNS = (
    "time_ns",
    "connection",
    "link",
    "address",
    "tag",
    "origin",
    "event",
    "outcome",
    "size",
    "credit_stall_ns",
)
REQUIRED = ("time_ns", "connection", "link", "address", "tag", "origin", "event")
OPTIONAL_DEFAULTS: dict[str, Any] = {"outcome": None, "size": 0, "credit_stall_ns": None}

EVENTS = (
    "received",
    "forwarded",
    "outcome",
    "settled",
    "released-back",
    "resumed",
    "credit-stall",
)
OUTCOMES = ("accepted", "rejected", "released", "modified")

_SAMPLE_SPACE = 1 << 32


class JournalError(RuntimeError):
    """The journal writer failed (the cause is chained); later calls raise it again."""


def schema() -> Any:
    """The journal's Arrow schema (``pyarrow.Schema``), as readers see the files."""
    import pyarrow as pa

    types = {
        "int64": pa.int64(),
        "int32": pa.int32(),
        "string": pa.string(),
        "binary": pa.binary(),
    }
    return pa.schema(
        [pa.field(name, types[kind], nullable=name in NULLABLE) for name, kind in COLUMNS]
    )


def _write_schema() -> Any:
    """`schema()` with the dictionary-encoded columns as Arrow dictionaries: the writer hands
    Parquet the indices and the distinct values, so it does not hash a string per row."""
    import pyarrow as pa

    small = {"router", "event", "outcome"}  # the engine's int8 codes
    fields = []
    for field in schema():
        if field.name in DICTIONARY:
            index = pa.int8() if field.name in small else pa.int32()
            field = field.with_type(pa.dictionary(index, field.type))
        fields.append(field)
    return pa.schema(fields)


def _quote(part: str) -> str:
    return quote(part, safe="") if ("/" in part or "%" in part) else part


def origin_id(container: str, link: str, tag: bytes) -> str:
    """The origin of a delivery: ``<publisher container>/<link name>/<original tag, hex>``.

    ``/`` and ``%`` in the container id or link name are percent-encoded, so the string is
    unambiguous. It is made once, at the router where the publisher is attached, and travels
    with the message so every router journals the same origin for it.
    """
    return f"{_quote(container)}/{_quote(link)}/{tag.hex()}"


def split_origin(origin: str | None) -> tuple[str | None, bytes]:
    """``origin_id``'s string -> (origin_prefix, origin_tag), as the journal stores it."""
    if origin is None:
        return None, b""
    hex_tag = origin.rpartition("/")[2]
    return origin[: len(origin) - len(hex_tag)], bytes.fromhex(hex_tag)


def sample_threshold(rate: float) -> int:
    """The crc32 bound below which an origin is kept at sampling ``rate`` (0..1)."""
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"sample rate must be within 0..1, not {rate}")
    return int(rate * _SAMPLE_SPACE)


def sampled(origin: str, rate: float) -> bool:
    """True when the delivery with this origin is journalled at sampling ``rate``.

    The decision depends on the origin alone (crc32 of its UTF-8 bytes), so all events of a
    delivery, on every router with the same rate, are kept or dropped together.
    """
    if rate >= 1.0:
        return True
    return zlib.crc32(origin.encode()) < sample_threshold(rate)


class _Flush:
    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = threading.Event()


_CLOSE = object()


class JournalWriter:
    """Append delivery events; write them as atomically published Parquet segments.

    ``append_buffers`` (the engine's batches) and ``append_batch`` (Python lists) take
    ownership of what they are given (don't change it afterwards) and return quickly: the
    Arrow conversion and the Parquet encoding happen on a writer thread (``threaded=False``
    does them in the caller, for tests and tools). When the writer falls more than
    ``queue_batches`` batches behind, both block: the journal never drops events silently,
    because an audit would then report them lost.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        router_id: str,
        *,
        segment_rows: int = 1_000_000,
        segment_seconds: float = 60,
        sample: float = 1.0,
        row_group_rows: int = 65_536,
        compression: str = "snappy",
        threaded: bool = True,
        queue_batches: int = 16,
        fsync: bool = False,
    ) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if segment_rows < 1:
            raise ValueError("segment_rows must be at least 1")
        if segment_seconds <= 0:
            raise ValueError("segment_seconds must be positive")
        if not router_id or "/" in router_id or router_id.startswith((".", "_")):
            raise ValueError(f"unusable router id for file names: {router_id!r}")
        self._pa = pa
        self._pq = pq
        self._schema = _write_schema()
        self._events = pa.array(EVENTS, pa.string())
        self._outcomes = pa.array(OUTCOMES, pa.string())
        self._router = pa.array([router_id], pa.string())
        self._zeros = pa.py_buffer(b"")  # int8 zeros: the `router` column's indices
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.router_id = router_id
        self.segment_rows = segment_rows
        self.segment_seconds = float(segment_seconds)
        self.sample = sample
        self._threshold = sample_threshold(sample)
        self.row_group_rows = max(1, row_group_rows)
        self.compression = compression
        self.fsync = fsync
        # Published segment paths, in order (appended to by the writer thread).
        self.segments: list[Path] = []
        self.rows_written = 0
        self.rows_sampled_out = 0
        self._seq = 0
        self._pending: list[Any] = []  # Arrow tables not written yet
        self._pending_rows = 0
        # The engine's batches in _pending; once written they go to `spare`, where the engine
        # takes them back to fill again (Router.journal_start): their memory stays mapped.
        self._held: list[dict[str, Any]] = []
        self.spare: deque[dict[str, Any]] = deque(maxlen=2)
        self._writer: Any = None
        self._tmp: Path | None = None
        self._final: Path | None = None
        self._segment_rows_now = 0
        # time.monotonic() when the current segment got its first row (pending or written).
        self._started: float | None = None
        self._error: BaseException | None = None
        self._closed = False
        self._lock = threading.Lock()  # serialises inline work when not threaded
        self._queue: queue.Queue[Any] | None = None
        self._thread: threading.Thread | None = None
        if threaded:
            self._queue = queue.Queue(maxsize=max(1, queue_batches))
            self._thread = threading.Thread(
                target=self._run, name=f"journal-{router_id}", daemon=True
            )
            self._thread.start()

    @property
    def threshold(self) -> int:
        """The crc32 bound of the kept origins (``sample_threshold(sample)``)."""
        return self._threshold

    # -- producer side ---------------------------------------------------------------------

    def keep(self, origin: str) -> bool:
        """Whether a delivery with this origin is journalled (to skip building its rows)."""
        return self._threshold >= _SAMPLE_SPACE or zlib.crc32(origin.encode()) < self._threshold

    def append_buffers(self, batch: dict[str, Any]) -> None:
        """Queue a batch of rows the engine gathered (``Router.journal_start``'s sink).

        The batch is the engine's column buffers (qrouter/_fast/journal.pxi ``take``), already
        sampled: ``rows``; ``time_ns`` (int64), ``link`` and ``origin`` (int32 indices into
        ``links``, whose entry 0 stands for no origin), ``size`` (int32), ``event`` and
        ``outcome`` (int8 codes into EVENTS and OUTCOMES, -1 for none); ``tag`` and
        ``origin_tag`` bytes with their Arrow offsets ``tag_end`` and ``origin_tag_end``;
        ``sampled_out``, the rows sampling dropped.
        """
        self._check()
        self.rows_sampled_out += batch["sampled_out"]
        if batch["rows"]:
            self._put(self._from_buffers, batch)

    def append_batch(self, columns: dict[str, list[Any]]) -> None:
        """Queue a batch of events given column-wise: name -> list, all of one length.

        Required: time_ns, connection, link, address, tag, origin (``origin_id``'s string),
        event. Optional (filled in when missing): outcome (None), size (0), credit_stall_ns
        (None). ``router`` is the writer's router id.
        """
        self._check()
        n = _batch_length(columns)
        if n == 0:
            return
        if self._threshold < _SAMPLE_SPACE:
            threshold = self._threshold
            keep = [zlib.crc32(o.encode()) < threshold for o in columns["origin"]]
            kept = sum(keep)
            self.rows_sampled_out += n - kept
            if kept == 0:
                return
            if kept < n:
                columns = {
                    name: [v for v, k in zip(values, keep, strict=True) if k]
                    for name, values in columns.items()
                }
                n = kept
        self._put(self._from_lists, (columns, n))

    def _put(self, convert: Any, batch: Any) -> None:
        if self._queue is not None:
            self._queue.put((convert, batch))
        else:
            with self._lock:
                self._on_table(convert(batch))
                self._rotate_if_due()

    def tick(self) -> None:
        """Close a segment whose time is up (only needed with ``threaded=False``)."""
        self._check()
        if self._queue is None:
            with self._lock:
                self._rotate_if_due()

    def flush(self) -> None:
        """Return once every event appended so far is in a published segment."""
        self._check()
        if self._queue is not None:
            marker = _Flush()
            self._queue.put(marker)
            marker.done.wait()
        else:
            with self._lock:
                self._write_pending()
                self._publish()
        self._check()

    def close(self) -> None:
        """Flush, publish the last segment and stop the writer thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._queue is not None and self._thread is not None:
            self._queue.put(_CLOSE)
            self._thread.join()
        else:
            with self._lock:
                try:
                    self._write_pending()
                    self._publish()
                except Exception as exc:  # noqa: BLE001 - reported below
                    self._error = exc
        if self._error is not None:
            raise JournalError(f"journal {self.directory}: {self._error}") from self._error

    def __enter__(self) -> JournalWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check(self) -> None:
        if self._error is not None:
            raise JournalError(f"journal {self.directory}: {self._error}") from self._error
        if self._closed:
            raise JournalError(f"journal {self.directory}: writer is closed")

    # -- writer side -----------------------------------------------------------------------

    def _run(self) -> None:
        assert self._queue is not None
        _lower_priority()
        while True:
            timeout = None
            if self._started is not None:
                timeout = max(0.0, self._started + self.segment_seconds - time.monotonic())
            try:
                item = self._queue.get(timeout=timeout)
            except queue.Empty:
                item = None
            try:
                if item is _CLOSE:
                    if self._error is None:
                        self._write_pending()
                        self._publish()
                    return
                if isinstance(item, _Flush):
                    try:
                        if self._error is None:
                            self._write_pending()
                            self._publish()
                    finally:
                        item.done.set()
                elif item is not None and self._error is None:
                    convert, batch = item
                    self._on_table(convert(batch))
                if self._error is None:
                    self._rotate_if_due()
            except Exception as exc:  # noqa: BLE001 - kept and raised to the producer
                self._error = exc
                self._abandon()

    def _from_buffers(self, batch: dict[str, Any]) -> Any:
        """The engine's buffers as an Arrow table, without copying them: fixed-width columns,
        validity bitmaps and the tags' offsets and bytes become Arrow buffers as they are;
        the string columns are dictionaries of this batch's values indexed by the engine's
        codes. Only pyarrow calls that do no work per row: the writer thread takes the GIL
        once or twice per batch, not once per column."""
        pa = self._pa
        n = batch["rows"]
        self._held.append(batch)

        def column(kind: Any, name: str, validity: str | None = None) -> Any:
            bits = pa.py_buffer(batch[validity]) if validity else None
            return pa.Array.from_buffers(kind, n, [bits, pa.py_buffer(batch[name])])

        def binary(name: str, validity: str | None) -> Any:
            bits = pa.py_buffer(batch[validity]) if validity else None
            ends, data = pa.py_buffer(batch[name + "_end"]), pa.py_buffer(batch[name])
            return pa.Array.from_buffers(pa.binary(), n, [bits, ends, data])

        def coded(name: str, values: Any, validity: str | None = None) -> Any:
            indices = column(pa.int32(), name, validity)
            return pa.DictionaryArray.from_arrays(indices, values, safe=False)

        if self._zeros.size < n:
            self._zeros = pa.py_buffer(bytes(max(n, 65_536)))
        router = pa.Array.from_buffers(pa.int8(), n, [None, self._zeros])
        strings = {
            key: pa.array(batch[key], pa.string()) for key in ("names", "addresses", "prefixes")
        }
        arrays = [
            column(pa.int64(), "time_ns"),
            pa.DictionaryArray.from_arrays(router, self._router, safe=False),
            column(pa.int64(), "connection"),
            coded("link", strings["names"]),
            coded("address", strings["addresses"]),
            binary("tag", None),
            coded("origin_prefix", strings["prefixes"], "has_origin"),
            binary("origin_tag", None),  # empty where origin_prefix is null
            pa.DictionaryArray.from_arrays(column(pa.int8(), "event"), self._events, safe=False),
            pa.DictionaryArray.from_arrays(
                column(pa.int8(), "outcome", "has_outcome"), self._outcomes, safe=False
            ),
            column(pa.int32(), "size"),
            pa.nulls(n, pa.int64()),
        ]
        return pa.Table.from_arrays(arrays, schema=self._schema)

    def _from_lists(self, batch: tuple[dict[str, list[Any]], int]) -> Any:
        pa = self._pa
        columns, n = batch
        origins = [split_origin(o) for o in columns["origin"]]
        arrays = []
        for field in self._schema:
            name = field.name
            if name == "router":
                values: list[Any] = [self.router_id] * n
            elif name == "origin_prefix":
                values = [prefix for prefix, _ in origins]
            elif name == "origin_tag":
                values = [tag for _, tag in origins]
            elif name in columns:
                values = columns[name]
            else:
                values = [OPTIONAL_DEFAULTS[name]] * n
            arrays.append(pa.array(values, field.type))
        return pa.Table.from_arrays(arrays, schema=self._schema)

    def _on_table(self, table: Any) -> None:
        if self._started is None:
            self._started = time.monotonic()
        self._pending.append(table)
        self._pending_rows += table.num_rows
        if self._pending_rows >= self.row_group_rows:
            self._write_pending()

    def _rotate_if_due(self) -> None:
        started = self._started
        if started is not None and time.monotonic() >= started + self.segment_seconds:
            self._write_pending()
            self._publish()

    def _write_pending(self) -> None:
        n = self._pending_rows
        if n == 0:
            return
        pending = self._pending
        if len(pending) == 1:
            table = pending[0]
        else:  # one dictionary per column, so the row group is written as one
            table = self._pa.concat_tables(pending).unify_dictionaries().combine_chunks()
        self._pending = []
        self._pending_rows = 0
        offset = 0
        chunk = None
        while offset < n:
            if self._writer is None:
                self._open()
            room = self.segment_rows - self._segment_rows_now
            chunk = table.slice(offset, min(room, n - offset))
            # row groups of about row_group_rows: 65,540 rows make one, not 65,536 + 4
            groups = max(1, round(chunk.num_rows / self.row_group_rows))
            self._writer.write_table(chunk, row_group_size=-(-chunk.num_rows // groups))
            self._segment_rows_now += chunk.num_rows
            self.rows_written += chunk.num_rows
            offset += chunk.num_rows
            if self._segment_rows_now >= self.segment_rows:
                self._publish()
        # Nothing views the engine's buffers any more (the engine checks that too)
        del table, chunk
        self.spare.extend(self._held)
        self._held = []

    def _open(self) -> None:
        start_ns = time.time_ns()
        name = f"{self.router_id}-{start_ns}-{self._seq:06d}.parquet"
        self._seq += 1
        self._final = self.directory / name
        self._tmp = self.directory / f".{name}.tmp"
        # What a row costs here was measured (docs/journal.md "Cost"): the Arrow schema is
        # not stored, so readers see plain strings, and the dictionary columns are
        # dictionary-encoded Parquet (Spark reads them as any string column); time_ns, nearly
        # sorted, is delta-encoded (1.3 bytes a row, cheaper than compressing it); statistics
        # only for time_ns (a reader can skip row groups by time): for the tags they cost
        # about as much as encoding them.
        self._writer = self._pq.ParquetWriter(
            str(self._tmp),
            self._schema,
            compression=self.compression,
            use_dictionary=sorted(DICTIONARY),
            column_encoding={"time_ns": "DELTA_BINARY_PACKED"},
            write_statistics=["time_ns"],
            store_schema=False,
            write_batch_size=self.row_group_rows,  # a column at a time, not 1,024 values
        )
        self._segment_rows_now = 0
        if self._started is None:
            self._started = time.monotonic()

    def _publish(self) -> None:
        if self._writer is None:
            if not self._pending_rows:
                self._started = None
            return
        assert self._tmp is not None and self._final is not None
        writer, self._writer = self._writer, None
        writer.close()
        if self.fsync:
            fd = os.open(self._tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(self._tmp, self._final)
        if self.fsync:
            fd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        self.segments.append(self._final)
        self._tmp = self._final = None
        self._segment_rows_now = 0
        self._started = time.monotonic() if self._pending_rows else None

    def _abandon(self) -> None:
        """After an error: drop the half-written segment (its temp name stays hidden)."""
        writer, self._writer = self._writer, None
        if writer is not None:
            try:
                writer.close()
            except Exception:  # noqa: BLE001 - already failing
                pass
        if self._tmp is not None:
            try:
                self._tmp.unlink()
            except OSError:
                pass
        self._pending = []
        self._pending_rows = 0
        self._held = []
        self._started = None


def _lower_priority(step: int = 10) -> None:
    """Make the calling thread `step` nicer than it is (Linux: a thread has its own nice value).

    The writer's Parquet encoding is not on any delivery's path: with the CPU busy, the
    event loop and the clients go first and the writer takes the idle time. If that is not
    enough for long, its bounded queue blocks the engine's handover, so nothing is dropped
    and the router slows to what the journal can write (docs/journal.md "Cost")."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + step))
    except (AttributeError, OSError):  # not Linux, or not allowed: the default priority
        pass


def _batch_length(columns: Mapping[str, Sequence[Any]]) -> int:
    missing = [name for name in REQUIRED if name not in columns]
    if missing:
        raise ValueError(f"journal batch lacks column(s): {', '.join(missing)}")
    unknown = [name for name in columns if name not in BATCH_COLUMNS]
    if unknown:
        raise ValueError(f"journal batch has unknown column(s): {', '.join(unknown)}")
    lengths = {len(values) for values in columns.values()}
    if len(lengths) != 1:
        raise ValueError(f"journal batch columns differ in length: {sorted(lengths)}")
    return lengths.pop()
