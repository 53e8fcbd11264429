"""Which backend a session gets, and the parts of the native backend that run without the Delta jars."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from sinks.backends import (
    DELTA_EXTENSION,
    choose_backend,
    data_source_resolves,
    delta_format_resolves,
    open_table_store,
)
from sinks.delta_native import DeltaNativeTableStore, commit_marker
from sinks.delta_rs import DeltaRsTableStore


def test_auto_picks_native_when_the_session_has_delta():
    assert choose_backend("auto", f"foo.Ext,{DELTA_EXTENSION}", False) == "native"
    assert choose_backend("auto", "", True) == "native", "Databricks has Delta without listing the extension"


def test_auto_picks_delta_rs_otherwise():
    assert choose_backend("auto", "", False) == "delta-rs"
    assert choose_backend("auto", "some.OtherExtension", False) == "delta-rs"


def test_an_explicit_backend_wins_and_a_bad_name_is_refused():
    assert choose_backend("delta-rs", DELTA_EXTENSION, True) == "delta-rs"
    assert choose_backend("native", "", False) == "native"
    with pytest.raises(ValueError, match="backend must be"):
        choose_backend("delta", "", False)  # type: ignore[arg-type]  # the wrong value is the test


def test_this_session_cannot_resolve_delta_and_gets_delta_rs(spark, tmp_path):
    assert data_source_resolves(spark, "parquet") is True, "the probe itself works"
    assert delta_format_resolves(spark) is False
    store = open_table_store(spark, str(tmp_path / "lake"))
    assert isinstance(store, DeltaRsTableStore)
    assert store.backend == "delta-rs"
    assert store.location("devices") == str(tmp_path / "lake" / "devices")


def test_a_store_without_spark_is_delta_rs(tmp_path):
    store = open_table_store(None, str(tmp_path))
    assert isinstance(store, DeltaRsTableStore)
    with pytest.raises(ValueError, match="needs a SparkSession"):
        open_table_store(None, str(tmp_path), backend="native")


def test_native_store_addresses_tables_by_path_or_by_name(spark):
    by_path = DeltaNativeTableStore(spark, "/mnt/lake")
    assert by_path.location("actions") == "/mnt/lake/actions"
    assert by_path._identifier("actions") == "delta.`/mnt/lake/actions`"
    by_name = open_table_store(spark, "", backend="native", namespace="main.timestone")
    assert isinstance(by_name, DeltaNativeTableStore)
    assert by_name.location("actions") == "main.timestone.actions"
    assert by_name._identifier("actions") == "`main`.`timestone`.`actions`"
    with pytest.raises(ValueError, match="root path, a namespace"):
        DeltaNativeTableStore(spark, None)


def test_native_commit_marker_names_app_and_batch():
    assert commit_marker("3f2a-query", 12) == "timestone:3f2a-query:12"


def test_the_pipeline_config_gives_the_store_its_storage_options(spark, tmp_path):
    from pipelines.telemetry.config import load_telemetry_config
    from pipelines.telemetry.job import open_store

    options = {"AWS_REGION": "eu-west-1", "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}
    config = load_telemetry_config(
        {"tables": {"root": "s3://lake/tables", "backend": "delta-rs", "storage_options": options}}
    )
    store = open_store(spark, config)
    assert isinstance(store, DeltaRsTableStore)
    assert store.storage_options == options
    assert store.file_location("bronze_telemetry").uri == "s3://lake/tables/bronze_telemetry"


def test_each_native_write_takes_its_settings_on_a_session_of_its_own(spark):
    """Two merges of one batch run at once: each one's batch marker is set on its own session before it
    starts, and neither the job's session nor the other merge's ever holds it."""
    from sinks.delta_native import TXN_APP_ID_CONF, TXN_VERSION_CONF, session_with

    def marked(batch_id: int):
        return session_with(spark, {TXN_APP_ID_CONF: "query", TXN_VERSION_CONF: str(batch_id)})

    with ThreadPoolExecutor(max_workers=2) as pool:
        sessions = list(pool.map(marked, [7, 8]))
    assert [s.conf.get(TXN_VERSION_CONF) for s in sessions] == ["7", "8"]
    assert spark.conf.get(TXN_APP_ID_CONF, None) is None and spark.conf.get(TXN_VERSION_CONF, None) is None
    assert all(s.sparkContext is spark.sparkContext for s in sessions), "one application, one cache"


def test_the_last_batch_of_a_writer_is_read_from_the_newest_commits_first():
    from sinks.delta_native import HISTORY_GROWTH, HISTORY_WINDOW, latest_marked_batch

    def log(markers: list[str | None]):
        """The history of a table whose commits carry ``markers``, oldest first; what it was asked for."""
        asked: list[int | None] = []

        def history(limit: int | None) -> list[dict]:
            asked.append(limit)
            newest_first = [{"userMetadata": m} for m in reversed(markers)]
            return newest_first if limit is None else newest_first[:limit]

        return history, asked

    recent, asked = log([commit_marker("q", b) for b in range(500)] + [None] * 3)  # compactions on top
    assert latest_marked_batch(recent, "q") == 499 and asked == [HISTORY_WINDOW]
    old, asked = log([commit_marker("q", 4), commit_marker("other", 9)] + [None] * 5000)
    assert latest_marked_batch(old, "q") == 4, "a table the writer left long ago"
    assert asked == [HISTORY_WINDOW, HISTORY_WINDOW * HISTORY_GROWTH, HISTORY_WINDOW * HISTORY_GROWTH**2]
    never, asked = log([commit_marker("other", 1)])
    assert latest_marked_batch(never, "q") is None and asked == [HISTORY_WINDOW], "the whole log was read"
    assert latest_marked_batch(log([commit_marker("q:x", 3)])[0], "q") is None, "an app id is matched whole"


def test_native_maintenance_without_the_delta_jars_is_recorded_per_table_and_changes_no_setting(spark):
    """The native store's OPTIMIZE and VACUUM need the Delta jars, which this machine cannot load: a pass
    over it records each table's failure (the next pass tries again) and leaves the session's settings."""
    from sinks.delta_native import OPTIMIZE_MAX_FILE_SIZE_CONF, RETENTION_CHECK_CONF
    from sinks.maintenance import RetentionPolicy, maintenance_pass

    store = DeltaNativeTableStore(spark, "/nonexistent/lake")
    done = maintenance_pass(store, ["bronze_telemetry", "devices"], RetentionPolicy(), retention=False)
    assert [(u.table, u.operation) for u in done] == [
        ("bronze_telemetry", "compact"),
        ("devices", "compact"),
        ("bronze_telemetry", "vacuum"),
        ("bronze_telemetry", "tidy_log"),
        ("devices", "vacuum"),
        ("devices", "tidy_log"),
    ]
    failed = {(u.table, u.operation): u.error for u in done if u.error}
    assert set(failed) == {(t, op) for t in ("bronze_telemetry", "devices") for op in ("compact", "vacuum")}
    tidied = [u for u in done if u.operation == "tidy_log"]
    assert all(u.error is None and u.count is None for u in tidied), "native Delta tidies its own log"
    assert spark.conf.get(OPTIMIZE_MAX_FILE_SIZE_CONF, None) is None
    assert spark.conf.get(RETENTION_CHECK_CONF, None) is None
