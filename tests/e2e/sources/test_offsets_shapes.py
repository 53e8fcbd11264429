"""Offsets and broker lists as users really hand them to the timestone source: one broker named twice in
``brokers``, a checkpoint whose offsets are past the logs' ends, a checkpoint edited by hand. Called the
way Spark calls the reader, against real brokers (test_stream_reader.py shows the calls)."""

from __future__ import annotations

import contextlib
import itertools
import re
import socket
import threading
import time
from collections.abc import Callable, Generator, Iterator
from pathlib import Path

import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession

from broker_edge.storage import StorageConfig
from broker_edge.storage.config import PersistRule
from sources.offsets_planner import DataLossError
from sources.options import SourceOptionError, parse_options
from sources.stream_api import ReadAllAvailable, ReadMaxRows
from sources.timestone_source import TimestoneStreamReader
from tests.e2e.sources.conftest import BASE_TIME_MS, EdgeBroker, plain, telemetry
from tests.e2e.sources.spark_runs import run_to_end

Reader = Callable[..., TimestoneStreamReader]
"""Makes a reader of ``brokers`` (then the options), as Spark builds one from a query's options."""


@pytest.fixture
def reader() -> Iterator[Reader]:
    """Readers made in a test, each stopped at its end (its kept-alive connections closed)."""
    made: list[TimestoneStreamReader] = []

    def make(brokers: str, **options: str) -> TimestoneStreamReader:
        base = {"brokers": brokers, "topics": "plant/+/temp", "fetchRetries": "0", "retryBackoffMs": "20"}
        made.append(TimestoneStreamReader(parse_options({**base, **options})))
        return made[-1]

    yield make
    for source in made:
        source.stop()


def rows(source: TimestoneStreamReader, start: dict, end: dict) -> int:
    """The rows of the batch from ``start`` to ``end``, each partition read to its end or closed (a read
    that fails closes its connection)."""
    count = 0
    for part in source.partitions(start, end):
        batches = source.read(part)
        try:
            count += sum(batch.num_rows for batch in batches)
        finally:
            if isinstance(batches, Generator):
                batches.close()
    return count


@pytest.mark.parametrize("read_by", ["partitions", "topics"])
@pytest.mark.parametrize("spelling", ["http://127.0.0.1:{port}", "http://localhost:{port}/"])
def test_one_broker_named_twice_in_brokers_is_refused_naming_the_option(
    edge: EdgeBroker, reader: Reader, read_by: str, spelling: str
) -> None:
    """Two ids for one broker (a URL pasted twice, or spelt two ways) read every record twice, under two
    ``broker`` values, so no sink keyed by (broker, topic, offset) saw the copies."""
    edge.fill("plant/1/temp", 10)
    second = spelling.format(port=edge.port)
    source = reader(f"e1={edge.url},e2={second}", startingOffsets="earliest", readBy=read_by)

    with pytest.raises(SourceOptionError, match=r"'brokers'.*'e1'.*'e2'.*same store"):
        start = source.initialOffset()
        rows(source, start, source.latestOffset(start, ReadAllAvailable()))


@pytest.mark.parametrize(("read_by", "key"), [("topics", "plant/1/temp"), ("partitions", "#p0")])
def test_a_log_ending_below_the_checkpoint_is_said_when_read_again_from_its_start(
    edge: EdgeBroker, reader: Reader, caplog: pytest.LogCaptureFixture, read_by: str, key: str
) -> None:
    """A checkpoint written before stores had identities (no ``#s``), of a broker since wiped: its logs
    end below the checkpoint's offsets. With failOnDataLoss=false they were read again from their start
    without a word, what the old logs held past the checkpoint gone unsaid."""
    edge.fill("plant/1/temp", 10)
    source = reader(f"e1={edge.url}", failOnDataLoss="false", readBy=read_by)
    start = {"e1": {key: 50}}

    with caplog.at_level("WARNING", logger="sources"):
        end = source.latestOffset(start, ReadAllAvailable())
        assert rows(source, start, end) == 10

    said = [record.getMessage() for record in caplog.records if record.levelname == "WARNING"]
    assert any("e1" in line and "50" in line and "[0, 10)" in line for line in said), said


@pytest.mark.parametrize(
    ("keys", "named"),
    [
        ({"plant/1/temp": "5"}, "'plant/1/temp': '5'"),
        ({"plant/1/temp": 5.5}, "'plant/1/temp': 5.5"),
        ({"plant/1/temp": None}, "'plant/1/temp': None"),
        ({"plant/1/temp": -3}, "'plant/1/temp': -3"),
        ({"plant/1/temp": True}, "'plant/1/temp': True"),
        ({"#px": 5}, "'#px'"),
        ({"#q0": 5}, "'#q0'"),
        ([5], "[5]"),
    ],
)
def test_a_checkpoint_edited_by_hand_into_no_offsets_fails_naming_the_broker_and_key(
    edge: EdgeBroker, reader: Reader, keys: object, named: str
) -> None:
    """A string, a fraction or a null written into the offset log (a hand edit, a script's) ended the
    query in a bare TypeError naming nothing, a null or a key the source does not write was taken
    silently (the topic read again from its log start), and a negative offset reported a loss of
    records before offset 0."""
    edge.fill("plant/1/temp", 10)
    source = reader(f"e1={edge.url}", readBy="topics")
    start = {"e1": keys}

    with pytest.raises(ValueError, match=r"checkpoint.*broker 'e1'.*" + re.escape(named)):
        rows(source, start, source.latestOffset(start, ReadAllAvailable()))
    with pytest.raises(ValueError, match=r"checkpoint.*broker 'e1'.*" + re.escape(named)):
        source.partitions(start, {"e1": {"plant/1/temp": 10}})


@pytest.mark.parametrize(("read_by", "added"), [("partitions", "plant/1/temp"), ("topics", "#p0")])
def test_a_checkpoint_edited_to_mix_positions_and_topic_offsets_fails_naming_both(
    edge: EdgeBroker, reader: Reader, read_by: str, added: str
) -> None:
    """A topic's offset written beside a broker's positions (a hand edit rewinding one topic, the way the
    docs write offsets by topic), or a position beside its topic offsets, was carried from batch to batch
    and never read: the rewound records did not come, without a word."""
    edge.fill("plant/1/temp", 10)
    source = reader(f"e1={edge.url}", startingOffsets="earliest", readBy=read_by)
    start = source.initialOffset()
    checkpoint = source.latestOffset(start, ReadAllAvailable())
    assert rows(source, start, checkpoint) == 10
    edited = {"e1": checkpoint["e1"] | {added: 5}}

    restarted = reader(f"e1={edge.url}", readBy=read_by)
    refused = r"broker 'e1' hold both positions of storage partitions \('#p0'\) and topic offsets \('plant/1/"
    with pytest.raises(ValueError, match=refused):
        restarted.latestOffset(edited, ReadAllAvailable())
    with pytest.raises(ValueError, match=refused):
        restarted.partitions(edited, edited)


@pytest.mark.spark
def test_under_spark_an_offset_log_edited_by_hand_fails_the_restarted_query_naming_it(
    timestone_spark: SparkSession, edge: EdgeBroker, tmp_path: Path
) -> None:
    """The offset log as a user edits it (a number written as a string) fails the restarted query with
    the source's message, where it ended in TypeError: '>' not supported between 'int' and 'str'."""
    edge.fill("plant/1/temp", 5)
    checkpoint = tmp_path / "checkpoint"
    options = {"brokers": f"e1={edge.url}", "topics": "plant/+/temp", "readBy": "topics"}

    def run() -> None:
        frame = timestone_spark.readStream.format("timestone").options(**options).load()
        run_to_end(frame.writeStream.format("noop"), checkpoint)

    options["startingOffsets"] = "earliest"
    run()
    last = max((path for path in (checkpoint / "offsets").iterdir() if path.name.isdigit()), key=_number)
    lines = last.read_text().split("\n")
    lines[-1] = lines[-1].replace('"plant/1/temp": 5', '"plant/1/temp": "5"')
    assert lines[-1] != last.read_text().split("\n")[-1]
    last.write_text("\n".join(lines))
    (checkpoint / "commits" / last.name).unlink()  # the batch is replayed from the edited offsets
    edge.fill("plant/1/temp", 2, first=5)

    with pytest.raises(StreamingQueryException, match=r"checkpoint's offsets of broker 'e1'.*'5'"):
        run()


def _number(path: Path) -> int:
    return int(path.name)


@pytest.mark.parametrize("read_by", ["partitions", "topics"])
def test_topics_naming_every_device_topic_reads_those_and_no_other(
    edge: EdgeBroker, reader: Reader, read_by: str
) -> None:
    """A topic per device, each named in ``topics`` (2,000 of them): read by partition (the default) every
    batch's tasks failed with the broker's 414 uri_too_long (each filter a parameter of the read's URL)."""
    devices = 2000

    async def fill() -> None:
        for number in range(devices):
            edge.store.append(f"dev/{number}/status", telemetry(number))
        edge.store.append("dev/extra/status", telemetry(0))  # not named: not read
        edge.store.append("$SYS/dev/status", telemetry(0))
        await edge.store.wait_durable()

    edge.run(fill())
    named = [f"dev/{number}/status" for number in range(devices)] + ["$SYS/dev/status"]
    source = reader(f"e1={edge.url}", topics=",".join(named), startingOffsets="earliest", readBy=read_by)
    start = source.initialOffset()
    end = source.latestOffset(start, ReadAllAvailable())

    topics = [
        topic
        for part in source.partitions(start, end)
        for batch in source.read(part)
        for topic in batch.column("topic").to_pylist()
    ]
    assert sorted(topics) == sorted(named)


RETENTION_NOW_MS = BASE_TIME_MS + 60_000


def stopped_past_a_shorter_retention(
    directory: Path, reader: Reader, caplog: pytest.LogCaptureFixture, unread_ms: int | None, **options: str
) -> tuple[int | str, str]:
    """A broker read by partition whose debug topics and plant/1/temp are kept 1 s (persistence rules),
    plant/2/temp without an age bound: the query reads plant/1/temp's first 5 records (old enough to go)
    and stops; 100 old debug records come, plant/1/temp 5-7 stamped `unread_ms`, 100 old debug records,
    plant/2/temp's 3, and retention deletes the segments holding only old records. Returns what the
    restarted query read (rows) or the data loss it raised, and what it logged."""
    rules = [
        PersistRule("plant/1/temp", qos=(0, 1, 2), retention_ms=1000),
        PersistRule("debug/#", qos=(0, 1, 2), retention_ms=1000),
        PersistRule("#", qos=(0, 1, 2)),
    ]
    edge = EdgeBroker(directory, StorageConfig(group_commit_ms=1, segment_bytes=1024, persist=rules))
    try:
        edge.append("plant/1/temp", [telemetry(number, timestamp_ms=BASE_TIME_MS) for number in range(5)])
        source = reader(f"e1={edge.url}", startingOffsets="earliest", **options)
        start = source.initialOffset()
        read = source.latestOffset(start, ReadAllAvailable())
        assert rows(source, start, read) == 5
        edge.append("debug/x", [telemetry(number, timestamp_ms=BASE_TIME_MS) for number in range(100)])
        edge.append("plant/1/temp", [telemetry(number, timestamp_ms=unread_ms) for number in range(5, 8)])
        edge.append("debug/x", [telemetry(number, timestamp_ms=BASE_TIME_MS) for number in range(100, 200)])
        edge.append("plant/2/temp", [telemetry(number) for number in range(3)])
        assert edge.apply_retention(RETENTION_NOW_MS) > 0
        assert edge.store.partitions()[0].start > read["e1"]["#p0"]  # positions the query had not read

        with caplog.at_level("INFO", logger="sources"):
            try:
                return rows(source, read, source.latestOffset(read, ReadAllAvailable())), caplog.text
            except DataLossError as error:
                return str(error), caplog.text
    finally:
        edge.close()


@pytest.mark.parametrize("fail_on_data_loss", ["true", "false"])
def test_positions_a_shorter_retention_removed_are_not_the_querys_loss(
    tmp_path: Path, reader: Reader, caplog: pytest.LogCaptureFixture, fail_on_data_loss: str
) -> None:
    """Positions deleted under a stopped query that held only records of a topic it does not read (debug/x)
    and records of its own it had read (plant/1/temp's first 5) failed the restarted query as data loss
    (or were skipped as positions), where every record of its topics was there: the broker could not tell
    which topics a deleted segment held. It keeps that account now, and the query reads on, saying nothing
    of loss."""
    read, said = stopped_past_a_shorter_retention(
        tmp_path / "edge", reader, caplog, RETENTION_NOW_MS, failOnDataLoss=fail_on_data_loss
    )
    assert read == 6, read  # plant/1/temp 5-7 (stamped at retention's now: kept), plant/2/temp 0-2
    assert "held no record of the query's topics" in said
    assert "skipping" not in said and "lost" not in said, said


@pytest.mark.parametrize("fail_on_data_loss", ["true", "false"])
def test_positions_deleted_with_records_the_query_had_not_read_are_its_loss(
    tmp_path: Path, reader: Reader, caplog: pytest.LogCaptureFixture, fail_on_data_loss: str
) -> None:
    """The same, plant/1/temp's records 5-7, which the query had not read, old enough to go: they went with
    the debug records' segments: data loss naming the topic, or skipped and counted without
    failOnDataLoss."""
    read, said = stopped_past_a_shorter_retention(
        tmp_path / "edge", reader, caplog, BASE_TIME_MS, failOnDataLoss=fail_on_data_loss
    )
    why = "retention removed records not yet read of topics 'plant/1/temp'"
    if fail_on_data_loss == "true":
        assert isinstance(read, str) and "data loss on broker 'e1' partition 0 (positions)" in read, read
        assert why in read and "next position to read 5" in read, read
    else:
        assert read == 3  # plant/2/temp 0-2
        assert re.search(rf"skipping \d+ positions \(failOnDataLoss=false\) of broker 'e1' partition 0 "
                         rf"\[5, \d+\): {why}", said), said  # fmt: skip


def trimmed_broker(directory: Path) -> EdgeBroker:
    """A broker whose plant/1/temp lost its 5 records to a rule's retention while plant/2/temp's 100 keep
    their segments: its partition holds 5 entries below their topic's start."""
    rules = [PersistRule("plant/1/temp", qos=(0, 1, 2), retention_ms=1000), PersistRule("#", qos=(0, 1, 2))]
    edge = EdgeBroker(directory, StorageConfig(group_commit_ms=1, segment_bytes=1024, persist=rules))
    edge.append("plant/1/temp", [telemetry(number, timestamp_ms=BASE_TIME_MS) for number in range(5)])
    edge.fill("plant/2/temp", 100)
    edge.apply_retention(BASE_TIME_MS + 60_000)
    return edge


@pytest.mark.parametrize("how", ["down at the query's start", "added to brokers later"])
def test_records_gone_before_the_query_knew_a_broker_are_not_data_loss_by_partition(
    edge: EdgeBroker, reader: Reader, tmp_path: Path, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    """A broker read by partition that the query first lists after its start (down then, or added to
    brokers between runs) was read from its partitions' start as if every entry came after the query
    began: records its retention removed long before failed the query as data loss, where read by topic
    its logs are read from their start without a report."""
    edge.fill("plant/9/temp", 2)
    late = trimmed_broker(tmp_path / "late")
    try:
        both = f"e1={edge.url},e2={late.url}"
        if how == "down at the query's start":
            late.stop_server()
            source = reader(both, startingOffsets="earliest")
            start = source.initialOffset()
            late.start_server(late.port)
        else:
            start = reader(f"e1={edge.url}", startingOffsets="earliest").initialOffset()
            source = reader(both)
        assert "e2" not in start
        with caplog.at_level("WARNING", logger="sources"):
            end = source.latestOffset(start, ReadAllAvailable())
            assert rows(source, start, end) == 102
            limited = reader(both, maxRecordsPerTrigger="40")  # the same over several batches
            batches = [start]
            while batches[-1] != (after := limited.latestOffset(batches[-1], ReadMaxRows(40))):
                batches.append(after)
            assert sum(rows(limited, begun, ended) for begun, ended in itertools.pairwise(batches)) == 102
    finally:
        late.close()
    assert "lost" not in caplog.text and "skipping" not in caplog.text


class ReplayCheckingSink:
    """A foreachBatch sink into a Delta table, idempotent per batch id: a replayed batch must hold the very
    rows its first run wrote (then nothing is written again); ``crash_after`` fails one batch once, after
    its rows are in the table (a driver lost between the write and Spark's commit)."""

    def __init__(self, path: Path, crash_after: int) -> None:
        self.path = str(path)
        self.crash_after: int | None = crash_after
        self.written: dict[int, list[tuple[str, int]]] = {}
        self.replays: list[int] = []

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        table = frame.select("broker", "topic", "offset").toArrow()
        keys = sorted(zip(table.column("topic").to_pylist(), table.column("offset").to_pylist(), strict=True))
        if batch_id in self.written:
            assert keys == self.written[batch_id], f"batch {batch_id} replayed with other rows"
            self.replays.append(batch_id)
            return
        if table.num_rows:
            write_deltalake(self.path, table, mode="append")
        self.written[batch_id] = keys
        if batch_id == self.crash_after:
            self.crash_after = None
            raise RuntimeError("driver lost after the write")

    def keys(self) -> list[tuple[str, int]]:
        table = DeltaTable(self.path).to_pyarrow_table()
        return sorted(zip(table.column("topic").to_pylist(), table.column("offset").to_pylist(), strict=True))


@pytest.mark.spark
def test_under_spark_a_topic_per_device_lands_once_in_delta_across_a_crash_and_restarts(
    timestone_spark: SparkSession, edge: EdgeBroker, tmp_path: Path
) -> None:
    """3,000 device topics, read by partition under a read limit, a batch failed after its write and
    replayed, a device appearing while the query is stopped: every record once in the Delta table, and
    the offset log a few hundred bytes a batch."""
    devices = 3000

    async def publish(first: int, count: int) -> None:
        for number in range(first, first + count):
            edge.store.append(f"dev/{number}/status", telemetry(number))
        await edge.store.wait_durable()

    edge.run(publish(0, devices))
    checkpoint = tmp_path / "checkpoint"
    sink = ReplayCheckingSink(tmp_path / "bronze", crash_after=1)
    options = {
        "brokers": f"e1={edge.url}",
        "topics": "dev/+/status",
        "startingOffsets": "earliest",
        "maxRecordsPerTrigger": "1200",
    }

    def run() -> None:
        frame = timestone_spark.readStream.format("timestone").options(**options).load()
        run_to_end(frame.writeStream.foreachBatch(sink), checkpoint, timeout_s=180)

    with pytest.raises(StreamingQueryException, match="driver lost after the write"):
        run()
    run()  # replays batch 1, then reads the rest
    edge.run(publish(devices, 7))  # new devices' topics while the query is stopped
    edge.run(publish(0, 3))  # and more of old ones
    run()

    expected = sorted(
        [(f"dev/{number}/status", 0) for number in range(devices + 7)]
        + [(f"dev/{number}/status", 1) for number in range(3)]
    )
    assert sink.keys() == expected
    assert sink.replays == [1]
    sizes = [path.stat().st_size for path in (checkpoint / "offsets").iterdir() if path.name.isdigit()]
    assert len(sizes) >= 4 and max(sizes) < 2048


@pytest.mark.parametrize("read_by", ["partitions", "topics"])
def test_a_broker_renamed_in_brokers_is_refused_and_one_left_out_is_said(
    edge: EdgeBroker, reader: Reader, second_edge: EdgeBroker, caplog: pytest.LogCaptureFixture, read_by: str
) -> None:
    """A checkpoint's broker renamed in ``brokers`` (edge1 -> edge-1, same URL) was new to the query:
    every record it held was read again under the new id, and the old id's offsets stayed, never read.
    A broker left out of ``brokers`` kept its offsets without a word, the rest of its records unread."""
    edge.fill("plant/1/temp", 10)
    second_edge.fill("plant/2/temp", 4)
    first = reader(f"edge1={edge.url},edge2={second_edge.url}", startingOffsets="earliest", readBy=read_by)
    start = first.initialOffset()
    checkpoint = first.latestOffset(start, ReadAllAvailable())

    renamed = reader(f"edge-1={edge.url},edge2={second_edge.url}", readBy=read_by)
    with pytest.raises(SourceOptionError, match=r"'brokers'.*'edge-1'.*'edge1'"):
        renamed.latestOffset(checkpoint, ReadAllAvailable())

    left_out = reader(f"edge1={edge.url}", readBy=read_by)
    with caplog.at_level("WARNING", logger="sources"):
        left_out.latestOffset(checkpoint, ReadAllAvailable())
        left_out.latestOffset(checkpoint, ReadAllAvailable())
    said = [record.getMessage() for record in caplog.records if "'edge2'" in record.getMessage()]
    assert len(said) == 1 and "brokers" in said[0], said  # once per query


class SlowLink:
    """A TCP relay on 127.0.0.1 that holds each request ``delay_s`` before passing it on (a broker across a
    WAN): a reader asking one question at a time waits ``delay_s`` per question. It counts the requests
    (each piece a client sends) and those that came while another was held: a reader asking one question
    at a time has none of those."""

    def __init__(self, port: int, delay_s: float) -> None:
        self.target, self.delay_s = port, delay_s
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._relays: list[threading.Thread] = []
        self._counting = threading.Lock()
        self._held = 0
        self.requests = 0
        self.overlapped = 0
        """Requests that came while another was held."""
        self._acceptor = threading.Thread(target=self._accept, daemon=True)
        self._acceptor.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            self._sockets += [client, upstream]
            self._relays.append(threading.Thread(target=self._relay, args=(client, upstream), daemon=True))
            self._relays[-1].start()

    def _relay(self, client: socket.socket, upstream: socket.socket) -> None:
        """Both directions of one connection, its sockets closed once both have ended: a direction that ends
        closes only its sending half (closing both sockets under the other direction's thread failed that
        thread's next recv or send on a closed descriptor, "Bad file descriptor")."""
        answers = threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True)
        answers.start()
        self._pipe(client, upstream, True)
        answers.join()
        client.close()
        upstream.close()

    def _pipe(self, source: socket.socket, target: socket.socket, requests: bool) -> None:
        """Pass what ``source`` sends on to ``target`` until ``source`` ends (or a peer resets), then end
        ``target``'s sending half; ``requests``: each piece is held ``delay_s`` first, and counted."""
        try:
            while data := source.recv(65536):
                if requests:
                    self._hold()
                target.sendall(data)
        except ConnectionError:
            pass
        finally:
            with contextlib.suppress(OSError):
                target.shutdown(socket.SHUT_WR)

    def _hold(self) -> None:
        with self._counting:
            self.requests += 1
            self.overlapped += self._held > 0
            self._held += 1
        time.sleep(self.delay_s)
        with self._counting:
            self._held -= 1

    def close(self) -> None:
        """Stop accepting, end every connection and wait until each relay has closed its sockets. The
        listening socket is shut down before it is closed: closing it alone leaves the acceptor blocked in
        ``accept`` (Linux wakes it only on ``shutdown``), and the join below waited out its 30 s."""
        with contextlib.suppress(OSError):
            self.server.shutdown(socket.SHUT_RDWR)
        self.server.close()
        self._acceptor.join(timeout=30)
        assert not self._acceptor.is_alive(), "the acceptor still waits in accept"
        for connection in self._sockets:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        for relay in self._relays:
            relay.join(timeout=30)
        assert not any(relay.is_alive() for relay in self._relays), "a relay still holds its sockets"


def test_the_slow_link_passes_on_the_end_of_a_connection_its_broker_closes(edge: EdgeBroker) -> None:
    """A broker that ends a connection after its answer (``Connection: close``): each direction of the
    relay closed both sockets when it ended, under the other direction's thread, so the reader never saw the
    end (the socket it read was still held open by that thread's recv) and that thread's next recv or send
    failed on a closed descriptor ("Bad file descriptor" in ``_pipe``)."""
    link = SlowLink(edge.port, 0.0)
    try:
        with socket.create_connection(("127.0.0.1", link.port), timeout=30) as client:
            client.sendall(b"GET /v1/logs HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            answer = b""
            while chunk := client.recv(65536):
                answer += chunk
    finally:
        link.close()
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"\r\n0\r\n\r\n"), answer  # all of it


def test_a_time_start_over_thousands_of_topics_does_not_ask_one_topic_at_a_time(
    edge: EdgeBroker, reader: Reader
) -> None:
    """Read by topic, a start time is resolved with one request per log: 50,000 device topics asked one
    after another took 50,000 round trips at the query's start (minutes across a WAN)."""
    topics, delay_s = 400, 0.02

    async def publish() -> None:
        for number in range(topics):
            edge.store.append(f"dev/{number}/status", telemetry(number))
        await edge.store.wait_durable()

    edge.run(publish())
    link = SlowLink(edge.port, delay_s)
    try:
        at = f"time:{BASE_TIME_MS + topics // 2}"
        source = reader(
            f"e1=http://127.0.0.1:{link.port}", topics="dev/+/status", startingOffsets=at, readBy="topics"
        )
        start = source.initialOffset()
        source.stop()  # its connections end, so the link's relays do
    finally:
        link.close()
    assert plain(start)["e1"] == {
        f"dev/{number}/status": int(number < topics // 2) for number in range(topics)
    }
    assert link.requests >= topics  # a request per log, and the listing's
    # Asked one at a time, no request comes while another is held; asked several at a time, nearly all do
    # (each asker sends its next one as soon as its answer is in, while the others' are held).
    assert link.overlapped >= link.requests // 2, (
        f"{link.overlapped} of {link.requests} came while another was held"
    )
