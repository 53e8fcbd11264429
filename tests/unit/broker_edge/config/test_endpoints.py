"""One way to name a broker: ``BrokerEndpoint`` and its text form, shared by the source and the pipelines."""

import subprocess
import sys

import pytest
import yaml

from broker_edge.config.endpoints import BrokerEndpoint, format_endpoints, parse_endpoint, parse_endpoints
from broker_edge.config.loader import ConfigError, load_dataclass
from pipelines.actions.config import ActionsConfig
from pipelines.telemetry.config import SourceConfig
from sources.options import parse_options


def test_name_equals_url_and_a_bare_url_named_after_itself():
    assert parse_endpoint("edge1=http://10.0.0.1:8081/") == BrokerEndpoint("edge1", "http://10.0.0.1:8081")
    assert parse_endpoint(" https://h:9 ").name == "https://h:9"


def test_the_text_form_reads_back_what_it_wrote():
    endpoints = (BrokerEndpoint("a", "http://h:1"), BrokerEndpoint("b", "https://h:2"))
    assert parse_endpoints(format_endpoints(endpoints)) == endpoints


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("10.0.0.1:8081", "http(s) base URL"),
        ("a=http://h:1,a=http://h:2", "repeated: a"),
        ("a=http://h,", "empty"),
    ],
)
def test_bad_text_is_refused_with_what_is_wrong(text, fragment):
    with pytest.raises(ConfigError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        parse_endpoints(text)


def test_the_source_the_ota_job_and_the_telemetry_config_use_the_same_endpoint():
    options = parse_options({"brokers": "edge1=http://h:1", "topics": "t/#", "authToken": "x"})
    actions = load_dataclass(ActionsConfig, {"brokers": [{"name": "edge1", "offsets_api": "http://h:1"}]})
    assert options.brokers[0] == BrokerEndpoint("edge1", "http://h:1", "x")
    assert type(actions.brokers[0]) is type(options.brokers[0]) is BrokerEndpoint
    assert actions.brokers[0].offsets_api == options.brokers[0].offsets_api


def test_a_config_error_names_the_field():
    with pytest.raises(ConfigError, match=r"brokers\[0\]\.offsets_api"):
        load_dataclass(ActionsConfig, {"brokers": [{"offsets_api": "ftp://h"}]})
    with pytest.raises(ConfigError, match=r"brokers\[1\]"):
        SourceConfig(brokers=["edge1=http://h:1", "not a url"])


def test_two_brokers_of_one_name_in_the_ota_jobs_file_are_refused_naming_the_second(tmp_path):
    brokers = [
        {"name": "edge1", "offsets_api": "http://127.0.0.1:1", "mqtt_port": 1},
        {"name": "edge2", "offsets_api": "http://127.0.0.1:2", "mqtt_port": 2},
        {"name": "edge1", "offsets_api": "http://127.0.0.1:3", "mqtt_port": 3},
    ]
    with pytest.raises(ConfigError) as error:
        load_dataclass(ActionsConfig, {"brokers": brokers, "cluster": False})
    assert str(error.value) == (
        "brokers[2].name: 'edge1' is already brokers[0]'s: each broker needs a name of its own "
        "(its reports' offsets are checkpointed by name)"
    )
    config = tmp_path / "actions.yaml"
    config.write_text(yaml.safe_dump({"brokers": brokers, "cluster": False}))
    command = [sys.executable, "-m", "pipelines.cli", "pipeline", "actions", "--config", str(config)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [f"timestone pipeline actions: {error.value} (in {config}, line 9)"]
