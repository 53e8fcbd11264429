"""The hub's ``ENDS`` (where each of a site's topics ends on it) went in one message listing every topic, and
a site takes at most ``HUB_MESSAGE_BYTES`` (16 MiB) from the hub: past about 450,000 topics (topic names of
about 30 characters) the answer did not fit, the site's connection failed before it was answered, and it
dialled again forever with nothing sent. The site now says the largest message it takes in its ``HELLO``,
and the hub sends ``ENDS`` in pages that fit it. Here the site takes messages far smaller than 16 MiB, so
that a few thousand topics (and twenty thousand) need many pages."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from broker_edge.settings.uplink import site_topic
from broker_edge.uplink import site_link
from tests.e2e.broker_clients import wait_for
from tests.e2e.conftest import RunningBroker
from tests.e2e.uplink.test_uplink_many_topics import copy_to_hub, fill_site
from tests.e2e.uplink.uplink_harness import hub_port, hub_section, pki_in, site_section

pytestmark = pytest.mark.timeout(90)


@pytest.mark.parametrize(("topics", "site_takes"), [(2_000, 16 * 1024), (20_000, 128 * 1024)])
def test_a_site_of_more_topics_than_one_message_of_ends_holds_resumes_where_the_hub_ends(
    brokers: Callable[..., RunningBroker],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    topics: int,
    site_takes: int,
) -> None:
    monkeypatch.setattr(site_link, "HUB_MESSAGE_BYTES", site_takes)
    pki = pki_in(tmp_path)
    names = fill_site(tmp_path / "site", topics, int(time.time() * 1000))
    copy_to_hub(tmp_path / "site", tmp_path / "hub", "plant-p")  # the hub holds every record already
    hub = brokers("hub", uplink_hub=hub_section(pki))
    site = brokers("site", uplink=site_section(pki, "plant-p", hub_port(hub), heartbeat_s=5.0))
    link = site.broker.site_link
    assert link is not None
    assert wait_for(lambda: site.call(lambda: link.connected), 30)
    last = names[-1]  # listed last: in the last page
    site.call(lambda: site.broker.publish(last, b"new", qos=1))
    hub_store = hub.broker.store
    assert hub_store is not None
    assert wait_for(lambda: hub.call(lambda: hub_store.durable_end(site_topic("plant-p", last))) == 2, 30)
    uplink_hub = hub.broker.uplink_hub
    assert uplink_hub is not None
    status = hub.call(lambda: uplink_hub.status.site("plant-p"))
    assert (status.received_records, status.duplicate_records) == (1, 0)  # nothing sent again
    assert site.call(lambda: len(link.hub_ends)) == topics
