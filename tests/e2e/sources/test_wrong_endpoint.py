"""A broker's address that is not its offsets API (its admin HTTP port, pasted by mistake) is said as such.

Every offsets API serves its listing (``GET /v1/logs``), so a 404 there means another server answers: the
source's error names the broker, its URL and that, where it was a bare ``404 not_found: Not Found``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from broker_edge.runtime.launcher import BrokerProcess
from sources.options import parse_options
from sources.slice_reader import BrokerAnswerError
from sources.timestone_source import TimestoneStreamReader

NO_API = (
    "no offsets API there (is the URL the broker's offsets_api address, not its admin_http one or another "
    "server's?)"
)


@pytest.mark.parametrize("read_by", ["partitions", "topics"])
def test_a_brokers_admin_port_given_for_its_offsets_api_is_named_in_the_error(
    tmp_path: Path, read_by: str
) -> None:
    with BrokerProcess(tmp_path / "broker") as broker:
        admin = f"http://127.0.0.1:{broker.admin_port}"

        def reader(url: str) -> TimestoneStreamReader:
            options = {"brokers": f"b1={url}", "topics": "plant/#", "readBy": read_by, "fetchRetries": "1"}
            return TimestoneStreamReader(parse_options(options))

        with pytest.raises(BrokerAnswerError) as refused:
            reader(admin).initialOffset()
        assert str(refused.value) == (
            f"timestone source: broker 'b1' ({admin}) answered its listing with 404 not_found: Not Found: "
            f"{NO_API} (see the option brokers)"
        )
        assert refused.value.status == 404
        assert reader(broker.offsets_url).initialOffset()  # the right address is read
