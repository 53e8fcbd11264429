"""Nothing one end of the uplink sends can stop the other end's broker, or read past what it is served.

A site's BATCH or a hub's DOWN at an offset past what a log holds (2**63-1, 2**64+5), and header numbers no
log can hold (``1e400``, a float, a bool, a negative count, a string), close only that connection, with an
ERROR naming the field on the hub; the broker goes on, and restarts after a clean stop and after SIGKILL
with every log it held. A site asking for ``#`` is sent only what the hub's configuration serves it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from broker_edge.bounds import MAX_OFFSET
from broker_edge.offsets_api.client import OffsetsClient
from broker_edge.runtime.launcher import BrokerProcess, free_port, wait_for_port
from broker_edge.runtime.local_pki import LocalPki
from broker_edge.settings.uplink import site_topic
from broker_edge.uplink.wire import ACK, BATCH, DOWN, ENDS, ERROR, HELLO, STATE, Message
from tests.e2e.broker_clients import PahoClient, wait_for
from tests.e2e.conftest import RunningBroker
from tests.e2e.uplink.uplink_harness import (
    ScriptedHub,
    batch_message,
    converse_as_site,
    downlink_as_site,
    frames_at,
    hub_port,
    hub_section,
    pki_in,
    raw_message,
    site_section,
)

pytestmark = pytest.mark.timeout(120)

PAST_A_LOG = [2**63 - 1, 2**64 + 5]
"""The offsets of the attack: the largest signed 64-bit integer, and one past what 64 bits hold."""

Brokers = Callable[..., RunningBroker]


@pytest.fixture
def pki(tmp_path: Path) -> LocalPki:
    return pki_in(tmp_path)


@pytest.fixture
def hub_process(tmp_path: Path, pki: LocalPki) -> Iterator[tuple[BrokerProcess, int]]:
    """A hub broker in its own process, and the port of its uplink endpoint."""
    port = free_port()
    hub = BrokerProcess(tmp_path / "hub", uplink_hub=hub_section(pki, port=port)).start()
    wait_for_port(port)
    yield hub, port
    hub.stop()


def restart(broker: BrokerProcess, how: str, uplink_port: int | None = None) -> None:
    """Stop ``broker`` cleanly or SIGKILL it, and start it again on the same data."""
    if how == "clean stop":
        broker.stop()
    else:
        broker.kill()
    broker.start()
    if uplink_port is not None:
        wait_for_port(uplink_port)


def payloads(broker: BrokerProcess, topic: str) -> list[bytes]:
    return [record.payload for record in OffsetsClient(broker.offsets_url).fetch_records(topic, 0).data]


def refusal(answers: list[Message | None]) -> str:
    """The hub's ERROR message after its ENDS (the connection then closed)."""
    assert answers[0] is not None and answers[0].kind == ENDS
    assert len(answers) == 2 and answers[1] is not None and answers[1].kind == ERROR, answers
    return str(answers[1].header["message"])


@pytest.mark.parametrize("how", ["clean stop", "SIGKILL"])
def test_a_site_batch_past_what_a_log_holds_closes_its_connection_and_the_hub_restarts_with_every_log(
    hub_process: tuple[BrokerProcess, int], pki: LocalPki, how: str
) -> None:
    hub, port = hub_process
    good = batch_message("telemetry/good", 0, frames_at(0, [b"r0", b"r1"]))
    answers = converse_as_site(pki, "plant-a", port, [good])
    assert answers[1] is not None and answers[1].kind == ACK
    assert answers[1].header["ends"] == {"telemetry/good": 2}
    device = PahoClient(hub.port, "hub-device")
    device.publish("plant/own", "acknowledged", 1)
    device.close()

    for first in PAST_A_LOG:
        frames = frames_at(min(first, 2**64 - 1), [b"absurd"])
        message = refusal(
            converse_as_site(pki, "plant-a", port, [batch_message("telemetry/big", first, frames)])
        )
        assert "'telemetry/big' first" in message and str(MAX_OFFSET) in message
    # the next batch writes whatever the partition log holds unwritten (the absurd frame, were it there)
    answers = converse_as_site(
        pki, "plant-a", port, [batch_message("telemetry/after", 0, frames_at(0, [b"a"]))]
    )
    assert answers[1] is not None and answers[1].header["ends"] == {"telemetry/after": 1}

    restart(hub, how, port)
    log_text = hub.log_path.read_text()
    assert "Traceback" not in log_text and "OverflowError" not in log_text
    assert payloads(hub, site_topic("plant-a", "telemetry/good")) == [b"r0", b"r1"]
    assert payloads(hub, "plant/own") == [b"acknowledged"]
    assert not OffsetsClient(hub.offsets_url).list_logs(site_topic("plant-a", "telemetry/big"))
    answers = converse_as_site(pki, "plant-a", port, [])
    assert answers[0] is not None and answers[0].header["ends"] == {"telemetry/good": 2, "telemetry/after": 1}


ABSURD_HEADERS = {
    "seq 1e400": (BATCH, '{"seq":1e400,"codec":"none","topics":[["t",0,1,SIZE]],"site_ends":{}}', "seq"),
    "first 1e400": (BATCH, '{"seq":0,"codec":"none","topics":[["t",1e400,1,SIZE]],"site_ends":{}}', "first"),
    "first a float": (BATCH, '{"seq":0,"codec":"none","topics":[["t",0.0,1,SIZE]],"site_ends":{}}', "first"),
    "first a bool": (BATCH, '{"seq":0,"codec":"none","topics":[["t",true,1,SIZE]],"site_ends":{}}', "first"),
    "first a string": (BATCH, '{"seq":0,"codec":"none","topics":[["t","0",1,SIZE]],"site_ends":{}}', "first"),
    "count negative": (BATCH, '{"seq":0,"codec":"none","topics":[["t",0,-1,SIZE]],"site_ends":{}}', "count"),
    "count huge": (BATCH, '{"seq":0,"codec":"none","topics":[["t",0,99999999999999999999,SIZE]]}', "count"),
    "size 1e400": (BATCH, '{"seq":0,"codec":"none","topics":[["t",0,1,1e400]],"site_ends":{}}', "size"),
    "seq NaN": (BATCH, '{"seq":NaN,"codec":"none","topics":[["t",0,1,SIZE]],"site_ends":{}}', "NaN"),
    "site_ends 1e400": (
        BATCH,
        '{"seq":0,"codec":"none","topics":[["t",0,1,SIZE]],"site_ends":{"t":[1e400,0]}}',
        "site_ends",
    ),
    "STATE site_ends -1": (STATE, '{"site_ends":{"t":[-1,0]}}', "site_ends"),
    "STATE last_append_ms Infinity": (STATE, '{"site_ends":{"t":[5,Infinity]}}', "Infinity"),
}


@pytest.mark.parametrize("case", sorted(ABSURD_HEADERS))
def test_an_absurd_number_in_a_sites_header_closes_only_its_connection_with_an_error_naming_it(
    brokers: Brokers, pki: LocalPki, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    hub = brokers("hub", uplink_hub=hub_section(pki))
    port = hub_port(hub)
    kind, header, field = ABSURD_HEADERS[case]
    frames = frames_at(0, [b"x"])
    message = raw_message(kind, header.replace("SIZE", str(len(frames))), frames if kind == BATCH else b"")
    with caplog.at_level(logging.WARNING):
        assert field in refusal(converse_as_site(pki, "plant-a", port, [message]))
    assert not [record for record in caplog.records if record.exc_info], "a traceback was logged"
    assert all("OverflowError" not in record.getMessage() for record in caplog.records)
    # only that connection: the same site is served again, and its batch appended
    answers = converse_as_site(pki, "plant-a", port, [batch_message("t", 0, frames)])
    assert answers[1] is not None and answers[1].header["ends"] == {"t": 1}


def test_a_hello_asking_for_a_downlink_from_an_absurd_end_is_refused(brokers: Brokers, pki: LocalPki) -> None:
    hub = brokers("hub", uplink_hub=hub_section(pki))
    hello = (
        '{"version":1,"site":"plant-a","downlink":{"filters":["actions/all"],"ends":{"actions/all":1e400}}}'
    )
    answers = converse_as_site(pki, "plant-a", hub_port(hub), [], hello=raw_message(HELLO, hello))
    assert len(answers) == 1 and answers[0] is not None and answers[0].kind == ERROR
    assert "the downlink's ends of 'actions/all'" in str(answers[0].header["message"])


@pytest.mark.parametrize("how", ["clean stop", "SIGKILL"])
def test_a_hub_down_past_what_a_log_holds_closes_the_link_and_the_site_restarts_with_every_log(
    tmp_path: Path, pki: LocalPki, how: str
) -> None:
    script = [
        batch_message("actions/all", first, frames_at(min(first, 2**64 - 1), [b"absurd"]), kind=DOWN)
        for first in PAST_A_LOG
    ]
    hub = ScriptedHub(pki, script)
    site = BrokerProcess(tmp_path / "site", uplink=site_section(pki, "plant-s", hub.port)).start()
    try:
        device = PahoClient(site.port, "site-device")
        device.publish("telemetry/t", "kept", 1)
        assert wait_for(
            lambda: hub.closed_by_site >= 2, timeout=20
        )  # the site closed the link, dialled again
        restart(site, how)
        device = PahoClient(site.port, "site-device-2")
        device.publish("telemetry/t", "after", 1)
        device.close()
        log_text = site.log_path.read_text()
        assert "Traceback" not in log_text and "OverflowError" not in log_text
        assert f"must be within [0, {MAX_OFFSET}]" in log_text
        assert payloads(site, "telemetry/t") == [b"kept", b"after"]
        assert not OffsetsClient(site.offsets_url).list_logs("actions/all")
    finally:
        site.stop()
        hub.close()


def test_a_site_asking_for_every_topic_gets_only_what_the_hub_serves_it(
    brokers: Brokers, pki: LocalPki
) -> None:
    hub = brokers(
        "hub",
        uplink_hub=hub_section(pki, site_downlink={"plant-b": ["actions/all", "actions/groups/line-2"]}),
    )
    cloud = PahoClient(hub.port, "cloud")
    for topic in ("actions/all", "actions/devices/d1", "actions/groups/line-2", "plant-secrets/telemetry"):
        cloud.publish(topic, "x", 1)
    cloud.close()
    port = hub_port(hub)
    assert downlink_as_site(pki, "plant-b", port, ["#"], quiet_s=2.0) == {
        "actions/all",
        "actions/groups/line-2",
    }
    # a site with no entry of its own is served the hub's `downlink` (the action topics), whatever it asks
    served = downlink_as_site(pki, "plant-c", port, ["#"], quiet_s=2.0)
    assert served == {"actions/all", "actions/devices/d1", "actions/groups/line-2"}
    # and a site may ask for less
    assert downlink_as_site(pki, "plant-c", port, ["actions/all"], quiet_s=2.0) == {"actions/all"}


def test_a_site_reporting_more_topics_than_the_hub_keeps_logs_is_bounded_and_said(
    brokers: Brokers, pki: LocalPki, caplog: pytest.LogCaptureFixture
) -> None:
    """A site's reports of its logs' ends (for its lag) hold at most ``storage.max_topics`` topics: a
    certificate holder reporting ever new topics cannot grow the hub's memory without end."""
    hub = brokers("hub", uplink_hub=hub_section(pki), storage={"max_topics": 4})
    port = hub_port(hub)
    frames = frames_at(0, [b"x"])
    reports = [
        batch_message("t", 0, frames, seq=0, site_ends={f"d/{n}": [5, 0] for n in range(10)}),
        batch_message("t", 1, frames_at(1, [b"y"]), seq=1, site_ends={"d/0": [7, 0], "d/99": [5, 0]}),
    ]
    with caplog.at_level(logging.WARNING, logger="broker_edge.uplink.hub"):
        answers = converse_as_site(pki, "plant-a", port, reports)
    assert [answer.header["ends"] for answer in answers[1:] if answer is not None] == [{"t": 1}, {"t": 2}]
    site = hub.call(lambda: hub.broker.uplink_hub.status.site("plant-a"))
    assert sorted(site.site_ends) == ["d/0", "d/1", "d/2", "d/3"]
    assert site.site_ends["d/0"] == [7, 0]  # a topic known keeps being updated
    said = [record.getMessage() for record in caplog.records if "storage.max_topics" in record.getMessage()]
    assert said == ["site plant-a reports more topics than storage.max_topics (4): 6 left out of its lag"]
