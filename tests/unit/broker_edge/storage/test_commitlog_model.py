"""A property test: whatever the mix of appends, batch appends, flushes, clean closes and crashes, the log
reads back exactly the records flushed so far, in order, at dense offsets, across any segment size."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker_edge.storage import AppendRecord, CommitLog, LogConfig
from broker_edge.storage.file_pool import FileHandlePool

operations = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(0, 300)),
        st.tuples(st.just("batch"), st.integers(1, 12)),
        st.tuples(st.just("flush"), st.just(0)),
        st.tuples(st.just("close"), st.just(0)),
        st.tuples(st.just("crash"), st.just(0)),
    ),
    max_size=40,
)


def _payload(number: int, size: int) -> bytes:
    return (f"{number}:".encode() * (size // 2 + 1))[:size]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=operations, segment_bytes=st.integers(150, 3000))
def test_the_log_reads_back_what_was_flushed(tmp_path_factory, steps, segment_bytes):
    directory = tmp_path_factory.mktemp("log")
    config = LogConfig(
        segment_bytes=segment_bytes, tail_cache_records=4, tail_cache_bytes=600, retention_ms=None
    )
    pool = FileHandlePool(8)
    log = CommitLog("t", directory, config, pool=pool)
    model: list[bytes] = []
    times: list[int] = []
    flushed = 0
    for action, size in steps:
        if action == "append":
            payload = _payload(len(model), size)
            assert log.append(AppendRecord(payload, timestamp_ms=len(model))) == len(model)
            model.append(payload)
            times.append(len(model) - 1)
        elif action == "batch":  # `size` records of growing sizes, one time for all
            payloads = [_payload(len(model) + n, 20 * n) for n in range(size)]
            batch = [(payload, 1, False, "", (), None, None, None, None, None) for payload in payloads]
            assert log.append_batch(batch, timestamp_ms=len(model)) == len(model)
            times += [len(model)] * size
            model += payloads
        elif action == "flush":
            log.flush(sync=False)  # the logic under test is the same; fsync latency is not
            flushed = len(model)
        elif action == "close":
            log.close()
            flushed = len(model)
            pool = FileHandlePool(8)
            log = CommitLog("t", directory, config, pool=pool)
        else:  # the process dies: buffered appends are lost, written ones are in the files
            del model[flushed:]
            del times[flushed:]
            pool.close()
            pool = FileHandlePool(8)
            log = CommitLog("t", directory, config, pool=pool)
            assert log.recovery.bytes_dropped == 0
        assert log.end_offset == flushed
        records = log.read(0, 10_000, 10**9) if flushed else []
        assert [record.payload for record in records] == model[:flushed]
        assert [record.offset for record in records] == list(range(flushed))
        if flushed:
            newest = times[flushed - 1]
            assert log.offset_for_timestamp(newest) == times.index(newest)
    log.close()
