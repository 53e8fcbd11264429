"""Readers' tokens: what a request's Authorization header allows, and a tokens file that may not load."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml

from broker_edge.config.loader import ConfigError
from broker_edge.security.reader_tokens import ReaderToken, ReaderTokens


def test_a_token_allows_its_filters_only_and_anything_else_is_no_access() -> None:
    tokens = ReaderTokens([ReaderToken("plant-a", "a-5e1", ["plant-a/#"]), ReaderToken("ops", "ops-77")])
    plant_a = tokens.access("Bearer a-5e1")
    assert plant_a is not None and plant_a.name == "plant-a"
    assert plant_a.may_read("plant-a/m1/telemetry") and not plant_a.may_read("plant-b/m1/telemetry")
    ops = tokens.access("bearer ops-77")  # the scheme is case-insensitive (RFC 7235)
    assert ops is not None and ops.may_read("plant-b/m1/telemetry") and not ops.may_read("$SYS/broker/x")
    for header in (None, "", "Bearer", "Bearer ", "Basic a-5e1", "Bearer a-5e1x", "a-5e1"):
        assert tokens.access(header) is None, header
    assert tokens.names == ["ops", "plant-a"]


@pytest.mark.parametrize(
    ("tokens", "message"),
    [
        ([ReaderToken("job", "s1"), ReaderToken("job", "s2")], "two tokens are named 'job'"),
        ([ReaderToken("a", "same"), ReaderToken("b", "same")], "'b' has the same secret as 'a'"),
    ],
)
def test_names_and_secrets_are_each_one_tokens(tokens: list[ReaderToken], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ReaderTokens(tokens)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"name": "", "token": "x"}, "name"),
        ({"name": "a", "token": " x"}, "token"),
        ({"name": "a", "token": "x", "topics": []}, "topics"),
        ({"name": "a", "token": "x", "topics": ["a/#/b"]}, r"topics\[0\]"),
        ({"name": "a", "token": "x", "topics": ["$share/g/a/#"]}, r"topics\[0\]"),
    ],
)
def test_a_token_that_is_not_one_names_its_field(fields: dict, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        ReaderToken(**fields)


def test_a_tokens_file_that_does_not_load_keeps_the_tokens_in_force(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text(yaml.safe_dump({"tokens": [{"name": "job", "token": "t1"}]}))
    path.chmod(0o600)
    tokens = ReaderTokens([ReaderToken("inline", "t0")], str(path))
    assert tokens.access("Bearer t1") is not None and tokens.access("Bearer t0") is not None
    path.write_text(yaml.safe_dump({"tokens": [{"name": "job", "token": "t1", "topics": ["a/#/b"]}]}))
    with pytest.raises(ConfigError) as refused:
        tokens.reload()
    said = str(refused.value)  # the key, then the file and its line, where they ran together ("yaml.tokens")
    assert said.startswith("tokens[0].topics[0]: ") and said.endswith(f"(in {path}, line 5)"), said
    path.write_text("tokens:\n  - {name: job, tokn: t1}\n")  # a key mistyped by hand
    with pytest.raises(ConfigError, match=rf"^tokens\[0\]\.tokn: unknown key .*\(in {path}, line 2\)$"):
        tokens.reload()
    assert tokens.access("Bearer t1") is not None  # the tokens in force stay
    path.unlink()
    with pytest.raises(ConfigError, match="tokens_file: cannot read"):
        tokens.reload()
    path.write_text(yaml.safe_dump({"tokens": [{"name": "job-2", "token": "t2"}]}))
    assert tokens.reload() == 2
    assert tokens.access("Bearer t1") is None and tokens.access("Bearer t2") is not None


def test_a_tokens_file_given_to_the_services_group_is_quiet_and_one_every_user_reads_is_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """docs/operations.md gives the tokens file to the service's group, 0640, as the broker runs as
    ``timestone``: that drew 'readable by group or others: keep it at mode 0600', which the service could
    then not read. Only a file every user may read is said, as for a password file or a key."""
    path = tmp_path / "tokens.yaml"
    path.write_text(yaml.safe_dump({"tokens": [{"name": "job", "token": "t1"}]}))
    caplog.set_level(logging.WARNING)
    path.chmod(0o640)
    ReaderTokens([], str(path))
    assert caplog.records == []
    path.chmod(0o644)
    ReaderTokens([], str(path))
    (record,) = caplog.records
    assert record.getMessage() == (
        f"reader tokens file {path} is readable by every user (mode 644): use 0600, or 0640 with the group "
        "of the broker's user"
    )
