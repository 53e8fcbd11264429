"""``timestone pipeline``: every configuration mistake is refused before Spark starts, by its dotted key,
with exit status 2 and one line; brokers that do not answer end an ``--available-now`` run with exit status 4,
the same for standalone brokers and a cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker_edge.config.loader import ConfigError
from broker_edge.runtime.launcher import BrokerProcess, free_port
from pipelines.cli import main
from pipelines.overrides import apply_override
from pipelines.runner import PIPELINES, load_config_document, sections_of

REPO = Path(__file__).resolve().parents[3]
PIPELINE_YAML = str(REPO / "conf" / "pipeline.yaml")


def run(capsys, *argv: str) -> tuple[int, str]:
    status = main(["pipeline", *argv])
    captured = capsys.readouterr()
    return status, captured.err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--config", "/nope.yaml"], "/nope.yaml: cannot read the file: No such file or directory"),
        (
            ["--config", ""],
            "the configuration file's name is empty",
        ),  # was "cannot read the file: Is a directory"
        (
            ["--set", "source.brokers=[edge9=http://h:1]"],
            "source.brokers: unknown key: keys of this file start with a section name "
            "(did you mean 'telemetry.source.brokers'?)",
        ),
        (["--set", "telemetry.stream"], "telemetry.stream: expected KEY=VALUE with a dotted KEY"),
        (["--set", "nope"], "nope: expected KEY=VALUE with a dotted KEY"),  # was 'unknown key'
        (
            ["--set", "telemetry.source.starting_offsets=earlist"],
            "telemetry.source.starting_offsets: 'startingOffsets': expected earliest, latest",
        ),
        (
            ["--set", "telemetry.stream.trigger_interval=fast"],
            "telemetry.stream.trigger_interval: 'fast': expected a number and a unit",
        ),
        (
            ["--available-now", "--set", "telemetry.stream.trigger_interval=1 min"],
            "telemetry.stream.trigger_interval: '1 min': unknown unit 'min'",
        ),
        (
            ["--set", "telemetry.source.options={startingOffset: earliest}"],
            "telemetry.source.options.startingOffset: 'startingoffset': unknown option",
        ),
        (
            ["--set", "telemetry.source.options={fetchTimeoutMs: '-3'}"],
            "telemetry.source.options.fetchTimeoutMs: 'fetchTimeoutMs': expected an integer >= 1",
        ),
        (
            ["--set", "telemetry.source.brokers=[edge1=notaurl]"],
            "telemetry.source.brokers[0]:",
        ),
        (
            ["--set", "telemetry.quality.suites.0.name=x"],
            "telemetry.quality.suites: is a list: index its items, as telemetry.quality.suites[0]",
        ),
        (
            ["--set", "telemetry.quality.suites[3].name=x"],
            "telemetry.quality.suites[3]: index out of range: telemetry.quality.suites has 1 items",
        ),
        (
            ["--set", "telemetry.quality.suites[0].expectations[0].column=nope"],
            "telemetry.quality.suites[0].expectations[0].column: unknown column 'nope'",
        ),
        (
            ["--set", "telemetry.tables.root=/etc/hostname"],
            "telemetry.tables.root: '/etc/hostname' is a file",
        ),
        pytest.param(  # before, a RecursionError traceback
            ["--set", "telemetry.source.options={a: " + "[" * 5_000 + "}"],
            "telemetry.source.options: value is not valid YAML: nested deeper than it can be read (lists or "
            "mappings inside each other hundreds of times) (from --set telemetry.source.options)",
            id="nested_past_the_parser",
        ),
        (
            ["--set", "telemetry.stream.checkpoint=/etc/hostname/cp"],
            "telemetry.stream.checkpoint: '/etc/hostname/cp' cannot be created: '/etc/hostname' is a file",
        ),
    ],
)
def test_a_config_mistake_is_refused_by_its_key_before_spark_starts(capsys, argv, message):
    status, err = run(capsys, "telemetry", "--config", PIPELINE_YAML, *argv)
    assert status == 2, err
    assert err.startswith(f"timestone pipeline telemetry: {message}"), err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_misspelt_section_in_a_file_is_refused(tmp_path, capsys):
    config = tmp_path / "pipeline.yaml"
    config.write_text("telemtry:\n  tables:\n    root: /data/lake\n")
    status, err = run(capsys, "telemetry", "--config", str(config))
    assert status == 2
    assert err == (
        f"timestone pipeline telemetry: telemtry: unknown section (known sections: telemetry) (in {config}, "
        "line 1)\n"
    )


def test_the_actions_pipeline_refuses_a_missing_file_and_an_unwritable_root(tmp_path, capsys):
    missing = tmp_path / "nope.yaml"
    assert run(capsys, "actions", "--config", str(missing)) == (
        2,
        f"timestone pipeline actions: {missing}: cannot read the file: No such file or directory\n",
    )
    status, err = run(capsys, "actions", "--set", "tables_root=/etc/hostname")
    assert status == 2 and "tables_root: '/etc/hostname' is a file" in err
    status, err = run(capsys, "actions", "--set", "status_topics=actions/reports/+,dev#/x")
    assert (status, err) == (
        2,
        "timestone pipeline actions: status_topics: 'dev#/x' is not a topic filter: misplaced wildcard in "
        "topic filter 'dev#/x' (from --set status_topics)\n",
    )


def test_set_indexes_lists_and_appends_at_their_length():
    document = load_config_document(PIPELINE_YAML, "", [], sections_of(PIPELINES["telemetry"]))
    apply_override(document, "telemetry.quality.suites[0].expectations[1].regex=^dev-[0-9]+$")
    apply_override(document, "telemetry.quality.suites[1]={name: extra, expectations: []}")
    apply_override(document, "telemetry.source.topics=[a/+/b]")
    apply_override(document, "telemetry.source.topics[1]=c/#")
    suites = document["telemetry"]["quality"]["suites"]
    assert suites[0]["expectations"][1]["regex"] == "^dev-[0-9]+$"
    assert suites[1] == {"name": "extra", "expectations": []}
    assert document["telemetry"]["source"]["topics"] == ["a/+/b", "c/#"]
    with pytest.raises(ConfigError, match=r"telemetry\.tables: is a mapping, not a list"):
        apply_override(document, "telemetry.tables[0]=x")
    with pytest.raises(ConfigError, match="expected a dotted key"):
        apply_override(document, "telemetry..root=x")


def test_unreachable_brokers_end_an_available_now_run_the_same_way_standalone_or_cluster(tmp_path, capsys):
    dead, other = free_port(), free_port()
    where = [
        "--set",
        f"telemetry.tables.root={tmp_path / 'tables'}",
        "--set",
        f"telemetry.stream.checkpoint={tmp_path / 'checkpoint'}",
    ]
    standalone = ["--set", f"telemetry.source.brokers=[edge1=http://127.0.0.1:{dead}]"]
    status, err = run(capsys, "telemetry", "--config", PIPELINE_YAML, "--available-now", *where, *standalone)
    assert status == 4
    assert err == (
        f"timestone pipeline telemetry: broker not answering: edge1 (http://127.0.0.1:{dead}): Connection "
        "refused; a run with --available-now reads every broker or none\n"
    )
    cluster = [
        "--set",
        f"telemetry.source.bootstrap_servers=[http://127.0.0.1:{dead}, http://127.0.0.1:{other}]",
    ]
    status, err = run(capsys, "telemetry", "--config", PIPELINE_YAML, "--available-now", *where, *cluster)
    assert status == 4
    assert err == (
        "timestone pipeline telemetry: no member of the cluster answered (bootstrap_servers: "
        f"http://127.0.0.1:{dead}: Connection refused; http://127.0.0.1:{other}: Connection refused)\n"
    )
    assert not (tmp_path / "tables").exists() and not (tmp_path / "checkpoint").exists()


def test_a_standalone_broker_named_as_a_cluster_member_ends_an_available_now_run(tmp_path, capsys):
    """It answers its offsets API but is no cluster member: read as a cluster, the run would read nothing
    and end "caught up" (a continuous query would wait for a cluster for ever)."""
    with BrokerProcess(tmp_path / "broker") as broker:
        argv = ["telemetry", "--config", PIPELINE_YAML, "--available-now"]
        argv += ["--set", f"telemetry.tables.root={tmp_path / 'tables'}"]
        argv += ["--set", f"telemetry.source.bootstrap_servers=[{broker.offsets_url}]"]
        status, err = run(capsys, *argv)
    assert status == 4
    assert err == (
        f"timestone pipeline telemetry: no member of the cluster answered (bootstrap_servers: "
        f"{broker.offsets_url}: no cluster member (a standalone broker goes in brokers, not in "
        "bootstrap_servers))\n"
    )
    assert not (tmp_path / "tables").exists()


def test_a_brokers_admin_port_given_for_its_offsets_api_ends_an_available_now_run_saying_so(tmp_path, capsys):
    """A 404 to the listing, which every offsets API serves: another server answers there (the broker's
    admin HTTP here), said as such for a broker and for a cluster member alike."""
    no_api = (
        "no offsets API there (is the URL the broker's offsets_api address, not its admin_http one or "
        "another server's?)"
    )
    with BrokerProcess(tmp_path / "broker") as broker:
        admin = f"http://127.0.0.1:{broker.admin_port}"
        argv = ["telemetry", "--config", PIPELINE_YAML, "--available-now"]
        argv += ["--set", f"telemetry.tables.root={tmp_path / 'tables'}"]
        status, err = run(capsys, *argv, "--set", f"telemetry.source.brokers=[edge1={admin}]")
        assert (status, err) == (
            4,
            f"timestone pipeline telemetry: broker not answering: edge1 ({admin}): 404 not_found: Not Found: "
            f"{no_api}; a run with --available-now reads every broker or none\n",
        )
        status, err = run(capsys, *argv, "--set", f"telemetry.source.bootstrap_servers=[{admin}]")
        assert (status, err) == (
            4,
            "timestone pipeline telemetry: no member of the cluster answered (bootstrap_servers: "
            f"{admin}: 404 not_found: Not Found: {no_api})\n",
        )
    assert not (tmp_path / "tables").exists()


def test_the_actions_job_without_any_broker_answering_stops_before_spark(tmp_path, capsys):
    dead = free_port()
    brokers = f"brokers=[{{name: edge1, mqtt_port: {dead}, offsets_api: 'http://127.0.0.1:{dead}'}}]"
    argv = ["actions", "--set", brokers, "--set", f"tables_root={tmp_path / 't'}"]
    argv += ["--set", f"checkpoint_root={tmp_path / 'c'}"]
    status, err = run(capsys, *argv)
    assert status == 4
    assert err == (
        "timestone pipeline actions: no broker answered to tell whether they form a cluster: edge1 (their "
        "offsets APIs; set cluster: true or false to start without asking)\n"
    )


@pytest.mark.parametrize("value", ["/data/lake #2", "/data/lake   # old root", "[a, b] # two"])
def test_an_override_whose_value_holds_a_comment_is_refused_not_cut_short(value):
    """``--set telemetry.tables.root=/data/lake #2`` set the root to ``/data/lake``: YAML reads `` #`` as the
    start of a comment and dropped the rest; such a value is refused, saying to quote it."""
    sections = sections_of(PIPELINES["telemetry"])
    with pytest.raises(ConfigError, match=r"^telemetry\.tables\.root: the value holds a YAML comment"):
        load_config_document(None, PIPELINE_YAML, [f"telemetry.tables.root={value}"], sections)
    document: dict[str, object] = {}
    apply_override(document, "a.b='/data/lake #2'")
    apply_override(document, "a.c=p@ss#word")
    assert document == {"a": {"b": "/data/lake #2", "c": "p@ss#word"}}


def test_a_refused_value_names_the_set_or_the_file_line_it_came_from(tmp_path, capsys):
    """A value refused after ``--set`` said its key but not that the command line, not the file, gave it;
    one from the file now names the file and its line."""
    config = tmp_path / "pipeline.yaml"
    config.write_text("telemetry:\n  tables:\n    root: 5\n")
    status, from_file = run(capsys, "telemetry", "--config", str(config))
    _, from_set = run(capsys, "telemetry", "--config", PIPELINE_YAML, "--set", "telemetry.tables.root=[1]")

    assert status == 2
    assert from_file == (
        f"timestone pipeline telemetry: telemetry.tables.root: expected a string, got int 5 (in {config}, "
        "line 3)\n"
    )
    assert from_set == (
        "timestone pipeline telemetry: telemetry.tables.root: expected a string, got list [1] (from --set "
        "telemetry.tables.root)\n"
    )


#: A checkpoint of two batches as Spark writes it (the telemetry query's, less the state store).
CHECKPOINT_FILES = {
    "metadata": '{"id":"937622d0-e816-4971-8840-7d9caae90fa5"}\n',
    "offsets/0": 'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1796096343123,"conf":{}}\n{"e1": {"#p0": 6}}',
    "offsets/1": 'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1796096344123,"conf":{}}\n{"e1": {"#p0": 9}}',
    "commits/0": 'v1\n{"nextBatchWatermarkMs":0}',
    "commits/1": 'v1\n{"nextBatchWatermarkMs":0}',
}


@pytest.mark.parametrize(
    ("damaged", "text", "why"),
    [
        ("offsets/1", "", "empty"),
        ("offsets/1", 'v1\n{"batchWatermarkMs":0,"conf":{}\n{"edge1": {"#p0": 9}}', "line 2 is not JSON"),
        ("offsets/1", 'v1\n{"batchWatermarkMs":0}\n{"edge1": garbage}', "line 3 is not JSON"),
        ("offsets/1", 'v1\n{"batchWatermarkMs":0}', "no offsets after its metadata line"),
        ("offsets/1", 'V 1\n{"batchWatermarkMs":0}\n{"edge1": {"#p0": 9}}', "line 1 is 'V 1', not a version"),
        ("offsets/0", 'v1\n{"batchWatermarkMs":0}\n{"edge1": {', "line 3 is not JSON"),
        ("commits/1", "", "empty"),
        ("commits/1", "v1\n{nextBatchWatermarkMs:0}", "line 2 is not JSON"),
        ("metadata", "{not json", "line 1 is not JSON"),
        ("metadata", '{"name": "telemetry"}', "no query id"),
        ("metadata", "[" * 100_000, "line 1 is not JSON: nested deeper than it can be read"),
        ("commits/1", "v1\n" + '{"a":' * 100_000, "line 2 is not JSON: nested deeper than it can be read"),
    ],
)
def test_a_damaged_checkpoint_is_refused_naming_its_file_before_spark_starts(
    tmp_path, capsys, damaged, text, why
):
    """A checkpoint file edited by hand or cut short (a copy, a full disk) failed the query inside Spark
    with Jackson's or Python's parse error, naming no file ('Unexpected end-of-input: expected close marker
    for Object'), and the supervisor restarted it from the same file for ever (an --available-now run gave
    up after 4 tries). The files Spark reads to resume are checked first: exit 2, one line naming the file."""
    checkpoint = tmp_path / "checkpoint"
    for name, content in {**CHECKPOINT_FILES, damaged: text}.items():
        (checkpoint / name).parent.mkdir(parents=True, exist_ok=True)
        (checkpoint / name).write_text(content)
    argv = ["telemetry", "--config", PIPELINE_YAML, "--available-now"]
    argv += ["--set", f"telemetry.stream.checkpoint={checkpoint}"]
    argv += ["--set", f"telemetry.tables.root={tmp_path}"]
    argv += ["--set", f"telemetry.source.brokers=[edge1=http://127.0.0.1:{free_port()}]"]
    status, err = run(capsys, *argv)
    assert status == 2, err
    assert err.startswith(
        f"timestone pipeline telemetry: telemetry.stream.checkpoint: {checkpoint / damaged} is damaged ({why}"
    ), err
    assert "start a new checkpoint" in err and len(err.strip().splitlines()) == 1, err


def test_an_intact_checkpoint_and_an_older_damaged_batch_spark_does_not_read_pass(tmp_path, capsys):
    """Only what Spark reads to resume is checked: the newest two offsets, the newest commit, the metadata."""
    checkpoint = tmp_path / "checkpoint"
    files = {**CHECKPOINT_FILES, "offsets/2": CHECKPOINT_FILES["offsets/1"], "offsets/0": "{"}
    for name, content in files.items():
        (checkpoint / name).parent.mkdir(parents=True, exist_ok=True)
        (checkpoint / name).write_text(content)
    (checkpoint / "offsets" / ".2.crc").write_bytes(b"\x00\x01")  # Spark's checksums: not batch files
    dead = free_port()
    argv = ["telemetry", "--config", PIPELINE_YAML, "--available-now"]
    argv += ["--set", f"telemetry.stream.checkpoint={checkpoint}"]
    argv += ["--set", f"telemetry.tables.root={tmp_path}"]
    argv += ["--set", f"telemetry.source.brokers=[edge1=http://127.0.0.1:{dead}]"]
    status, err = run(capsys, *argv)
    assert status == 4 and "broker not answering" in err, err  # past the checks, at the brokers


@pytest.mark.parametrize("query", ["reports", "fanout"])
def test_the_actions_job_refuses_a_damaged_checkpoint_of_either_query_naming_its_file(
    tmp_path, capsys, query
):
    """The actions job's two queries resume from ``checkpoint_root/reports`` and ``checkpoint_root/fanout``:
    a damaged file there failed the query inside Spark with a parse error naming no file, restarted for
    ever; it is refused before Spark starts, as the telemetry job's is."""
    root = tmp_path / "checkpoints"
    for name, content in {**CHECKPOINT_FILES, "commits/1": '{"nextBatch'}.items():
        (root / query / name).parent.mkdir(parents=True, exist_ok=True)
        (root / query / name).write_text(content)
    dead = free_port()
    brokers = f"brokers=[{{name: edge1, mqtt_port: {dead}, offsets_api: 'http://127.0.0.1:{dead}'}}]"
    argv = ["actions", "--set", brokers, "--set", f"tables_root={tmp_path / 't'}"]
    status, err = run(capsys, *argv, "--set", f"checkpoint_root={root}")
    assert status == 2, err
    assert err.startswith(
        f"timestone pipeline actions: checkpoint_root: {root / query / 'commits' / '1'} is damaged ("
    ), err
    assert len(err.strip().splitlines()) == 1, err
