"""The timestone source reading a broker's offsets API over HTTPS, its certificate issued by a private CA
(``timestone pki``): ``caFile`` trusts that CA, ``certFile`` and ``keyFile`` present the reader's certificate
to a broker asking for one (mutual TLS). Without them the query fails naming the broker and why, at once.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession

from broker_edge.runtime.local_pki import LocalPki
from pipelines.preflight import BrokersUnreachable, require_brokers
from sources.options import SourceOptionError, parse_options
from tests.e2e.commitlog.e2e_helpers import publish_numbered
from tests.e2e.conftest import RunningBroker
from tests.e2e.sources.test_scoped_token_spark import read_available_now

pytestmark = [pytest.mark.spark, pytest.mark.timeout(180)]

TOKEN = "reader-s3cret"


@pytest.fixture
def pki(tmp_path: Path) -> LocalPki:
    return LocalPki(tmp_path / "pki", name="plant-ca")


@pytest.fixture
def secured(brokers: Callable[..., RunningBroker], pki: LocalPki) -> tuple[RunningBroker, str]:
    """A broker whose offsets API serves HTTPS with a certificate of ``pki``'s CA and asks readers for a
    token and a certificate of that CA; its https:// URL."""
    server = pki.server("edge")
    tls = {"certfile": str(server.cert), "keyfile": str(server.key), "cafile": str(pki.ca.cert)}
    broker = brokers(offsets_api={"token": TOKEN, "tls": {**tls, "require_client_cert": True}})
    publish_numbered(broker, "plant/meter", 3)
    return broker, f"https://127.0.0.1:{broker.broker.offsets_port}"


def read_all(spark: SparkSession, url: str, checkpoint: Path, **options: str) -> list[tuple[str, int, bytes]]:
    """Every record of ``plant/#`` on the broker at ``url``, read from the start (``read_available_now``
    with this module's token and ``options``)."""
    reading = {"startingOffsets": "earliest", "authToken": TOKEN, "fetchRetries": "0", **options}
    rows = read_available_now(spark, url, checkpoint, topics="plant/#", **reading)
    return sorted((row.topic, row.offset, bytes(row.payload)) for row in rows)


def test_a_broker_of_a_private_ca_asking_for_client_certificates_is_read_with_its_files(
    secured: tuple[RunningBroker, str], pki: LocalPki, timestone_spark: SparkSession, tmp_path: Path
) -> None:
    _broker, url = secured
    reader = pki.client("spark-reader")
    files = {"caFile": str(pki.ca.cert), "certFile": str(reader.cert), "keyFile": str(reader.key)}

    rows = read_all(timestone_spark, url, tmp_path / "checkpoint", **files)

    assert rows == [("plant/meter", n, str(n).encode()) for n in range(3)]


def test_a_broker_of_a_ca_not_trusted_fails_the_query_naming_the_broker_and_the_options(
    secured: tuple[RunningBroker, str], pki: LocalPki, timestone_spark: SparkSession, tmp_path: Path
) -> None:
    """Without ``caFile`` the broker's certificate is checked against the system's CAs and fails: a query
    failing at once, where it was taken for a broker down (an ``availableNow`` run ended reading nothing)."""
    _broker, url = secured
    reader = pki.client("spark-reader")

    with pytest.raises(StreamingQueryException) as failed:
        read_all(
            timestone_spark, url, tmp_path / "checkpoint", certFile=str(reader.cert), keyFile=str(reader.key)
        )

    text = str(failed.value)
    assert f"broker 'edge' ({url}) TLS failed" in text and "see the options caFile, certFile, keyFile" in text
    assert "CERTIFICATE_VERIFY_FAILED" in text


def test_tls_files_that_do_not_load_fail_the_options_naming_the_option(tmp_path: Path, pki: LocalPki) -> None:
    base = {"brokers": "edge=https://127.0.0.1:1", "topics": "#"}
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("no certificate here\n")
    reader = pki.client("spark-reader")

    with pytest.raises(SourceOptionError, match=r"'caFile': cannot load CA certificates from .*not\.pem"):
        parse_options({**base, "caFile": str(not_pem)})
    with pytest.raises(SourceOptionError, match="'certFile': cannot load certificate and key") as no_key:
        parse_options({**base, "certFile": str(not_pem)})
    assert f"({not_pem}): " in str(no_key.value) and "None" not in str(no_key.value)
    with pytest.raises(SourceOptionError, match=rf"\({not_pem}, key {reader.key}\): "):
        parse_options({**base, "certFile": str(not_pem), "keyFile": str(reader.key)})
    with pytest.raises(SourceOptionError, match="'keyFile': is the key of certfile, which is not set"):
        parse_options({**base, "keyFile": str(reader.key)})
    options = parse_options(
        {**base, "cafile": str(pki.ca.cert), "CERTFILE": str(reader.cert), "keyFile": str(reader.key)}
    )
    assert options.tls is not None and options.tls.cafile == str(pki.ca.cert)


def test_an_available_now_runs_check_of_the_brokers_uses_the_same_files(
    secured: tuple[RunningBroker, str], pki: LocalPki
) -> None:
    """The telemetry job's check before an ``--available-now`` run (``pipelines.preflight``) reads the
    brokers as the source does: with ``caFile``, ``certFile`` and ``keyFile``."""
    _broker, url = secured
    reader = pki.client("spark-reader")
    options = {"brokers": f"edge={url}", "topics": "plant/#", "authToken": TOKEN}
    files = {"caFile": str(pki.ca.cert), "certFile": str(reader.cert), "keyFile": str(reader.key)}

    require_brokers(parse_options({**options, **files}))
    with pytest.raises(BrokersUnreachable, match="certificate verify failed"):
        require_brokers(parse_options(options))


def test_a_broker_refusing_the_readers_certificate_fails_the_query_naming_the_alert(
    secured: tuple[RunningBroker, str], pki: LocalPki, timestone_spark: SparkSession, tmp_path: Path
) -> None:
    """Without ``certFile`` the broker refuses the reader at the handshake with TLS's alert: a query failing
    at once, naming the broker, the alert and the options, where the broker closed the connection without
    the alert and was taken for a broker down (an ``availableNow`` run ended reading nothing)."""
    _broker, url = secured

    with pytest.raises(StreamingQueryException) as failed:
        read_all(timestone_spark, url, tmp_path / "checkpoint", caFile=str(pki.ca.cert), fetchRetries="3")

    text = str(failed.value)
    assert f"broker 'edge' ({url}) TLS failed" in text and "see the options caFile, certFile, keyFile" in text
    assert "TLSV13_ALERT_CERTIFICATE_REQUIRED" in text


def test_a_cluster_whose_members_refuse_the_readers_certificate_fails_the_query_naming_the_alert(
    secured: tuple[RunningBroker, str], pki: LocalPki, timestone_spark: SparkSession, tmp_path: Path
) -> None:
    """``bootstrapServers`` naming a member that refuses the reader at the TLS handshake (no ``certFile``):
    the query fails naming the cluster, the alert and the options, where the member was one that did not
    answer and the cluster was taken for down (an ``availableNow`` run ended reading nothing)."""
    _broker, url = secured
    rows: list = []
    source = (
        timestone_spark.readStream.format("timestone")
        .option("bootstrapServers", url)
        .option("clusterName", "plant")
        .option("topics", "plant/#")
        .option("startingOffsets", "earliest")
        .option("authToken", TOKEN)
        .option("caFile", str(pki.ca.cert))
        .option("fetchRetries", "0")
        .load()
    )
    writer = source.writeStream.foreachBatch(lambda frame, _id: rows.extend(frame.collect()))
    query = (
        writer.option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True).start()
    )
    try:
        with pytest.raises(StreamingQueryException) as failed:
            query.awaitTermination(120)
    finally:
        query.stop()

    text = str(failed.value)
    assert (
        f"broker 'plant' ({url}) TLS failed" in text and "see the options caFile, certFile, keyFile" in text
    )
    assert "TLSV13_ALERT_CERTIFICATE_REQUIRED" in text and rows == []
