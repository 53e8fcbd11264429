"""Fixtures shared by the whole suite: one local SparkSession per test session, free loopback ports."""

from __future__ import annotations

import importlib.machinery
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from broker_edge.runtime.launcher import free_port, wait_for_port
from tests.durations import DurationRecorder, longest_groups_first, module_of

# A pytest-xdist worker runs from ``python -c``: its __main__ has neither spec nor file, which
# pyspark.sql.connect (imported by great_expectations) takes for a doctest run and answers with sys.exit(0).
# A spec named __main__ tells it otherwise, and multiprocessing's spawn skips such a main as it skips ``-c``.
_main = sys.modules["__main__"]
if getattr(_main, "__spec__", None) is None and not hasattr(_main, "__file__"):
    _main.__spec__ = importlib.machinery.ModuleSpec("__main__", None)

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
# The suite's Spark settings (spark-conf/spark-defaults.conf: the JVMs' client compiler only), inherited by
# the drivers the tests start as processes; the standalone cluster's master and workers take the same option.
os.environ.setdefault("SPARK_CONF_DIR", str(Path(__file__).with_name("spark-conf")))
os.environ.setdefault("SPARK_DAEMON_JAVA_OPTS", "-XX:TieredStopAtLevel=1")

# Property tests check behaviour, not speed (bench/ measures speed): no per-example deadline, no slowness
# health check, so a busy machine cannot fail them.
settings.register_profile("timestone", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("timestone")


SHARED_BY_THE_SESSION = frozenset({"s3", "demo_run"})
"""Session fixtures costing up to minutes: their tests run on one worker so each starts once. (Each worker
has a SparkSession of its own: starting one costs seconds, and the Spark tests are too many for one.)"""


DURATIONS = Path(__file__).with_name("durations.json")
"""Seconds per test module (``make test-durations``): the groups costing most are handed out first."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--record-durations",
        metavar="PATH",
        type=Path,
        help="write the seconds each test module took to PATH (tests/durations.json: make test-durations)",
    )


def _group(item: pytest.Item) -> str:
    fixtures = set(getattr(item, "fixturenames", ()))
    return "session-fixtures" if fixtures & SHARED_BY_THE_SESSION else module_of(item.nodeid)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Groups for pytest-xdist's ``--dist loadgroup`` (``make test``): the tests of the session's costly
    fixtures on one worker, every other module whole on one worker, so no such fixture starts twice; the
    costliest groups first (tests/durations.py). First among the hooks: xdist reads the marks in its own.
    Without xdist the marks do nothing and the order stays as collected."""
    groups = [_group(item) for item in items]
    for item, group in zip(items, groups, strict=True):
        item.add_marker(pytest.mark.xdist_group(group))
    if config.getoption("loadgroup", False):  # a worker's collection, which xdist's queue follows
        items[:] = longest_groups_first(items, groups, DURATIONS)


def pytest_configure(config: pytest.Config) -> None:
    """xdist's controller keeps the groups in the order the workers collected them (not sorted by their
    number of tests, its default); ``--record-durations`` registers the recorder there."""
    if config.getoption("dist", "no") == "loadgroup":
        config.option.loadscopereorder = False
    record = config.getoption("record_durations")
    if record is not None and not hasattr(config, "workerinput"):
        config.pluginmanager.register(DurationRecorder(record), "timestone-durations")


# The shared session evaluates its queries' expressions as Spark interprets them, without the Java that Spark
# generates and compiles (Janino) for each query: on the tests' few rows the compiling cost more than the
# running (README, *Developing*). The jobs the tests start as processes of their own (the demo, the job's
# process and cluster tests) keep Spark's generated code, as production runs it.
INTERPRETED_EXPRESSIONS = {
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
}


@pytest.fixture(scope="session")
def spark():
    """The one local SparkSession of the test session (starting one costs seconds)."""
    from pipelines.spark_session import local_spark_session

    session = local_spark_session(app_name="timestone-tests", master="local[2]", conf=INTERPRETED_EXPRESSIONS)
    yield session
    session.stop()


@pytest.fixture(scope="session", autouse=True)
def brokers_forked():
    """Broker processes (``BrokerProcess``) forked from one that has imported the broker already
    (tests/harness/broker_zygote.py): a cluster member's start costs a fifth of the CPU it costs as a process
    of its own. ``TIMESTONE_TESTS_FORK=0`` starts each as its own process."""
    from broker_edge.runtime.launcher import BrokerProcess
    from tests.harness.broker_zygote import ForkServer

    if os.environ.get("TIMESTONE_TESTS_FORK") == "0":
        yield
        return
    server = ForkServer().start(dict(os.environ, PYTHONUNBUFFERED="1"))
    BrokerProcess.spawn = server.spawn
    yield
    BrokerProcess.spawn = None
    server.stop()


@pytest.fixture(scope="session")
def s3():
    """An S3 endpoint on loopback (moto's server) for the test session; a test takes a bucket of its own."""
    from tests.s3_server import s3_endpoint

    with s3_endpoint() as endpoint:
        yield endpoint


@pytest.fixture(autouse=True)
def root_logging_restored():
    """The root logger as the test found it: a command run in-process (a pipeline, the broker's main)
    installs its handler and level on the root logger, which would otherwise print every later test's
    records at that level on the terminal, outside any test's capture."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in root.handlers[:]:
        if type(handler) is logging.StreamHandler and handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)


@pytest.fixture
def quiet_broker_log(caplog):
    """The broker's loggers at WARNING for this test, whatever an earlier test left: no record per connection
    (the test's capturing handler would keep them, and they are not the broker's)."""
    caplog.set_level(logging.WARNING, logger="broker_edge")


@pytest.fixture
def mosquitto(tmp_path):
    """(host, port) of a Mosquitto started for this test: an independent MQTT broker to check against."""
    binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    port = free_port()
    config = tmp_path / "mosquitto.conf"
    config.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n")
    process = subprocess.Popen(
        [binary, "-c", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_for_port(port)
        yield "127.0.0.1", port
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory):
    """One ``timestone demo`` (20 devices) for the whole test session: its output and the tables it wrote."""
    from tests.e2e.notebooks.notebook_harness import run_demo

    return run_demo(tmp_path_factory.mktemp("repository"), devices=20)
