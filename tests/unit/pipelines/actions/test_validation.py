"""One definition of a valid ``actions`` row: every problem names the field, and a valid row has none."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from pipelines.actions.operator import NewAction
from pipelines.actions.validation import (
    FIELD_RULES,
    KINDS,
    MAX_DEVICE_IDS,
    InvalidAction,
    check_action_row,
    problems,
)

SHA256 = "9f2c" + "0" * 60


def ota_row(**changes) -> dict:
    """A valid OTA row as the table holds it (a map column comes back from Arrow as key/value pairs)."""
    row = NewAction(
        action_id="a-1", group="canary", version="2.0.0", url="https://fw.example/fw.bin", sha256=SHA256
    ).row(datetime.now(UTC))
    for path, value in changes.items():
        node = row
        *parents, last = path.split("__")
        for part in parents:
            node = node[part]
        node[last] = value
    return row


def fields(row: dict) -> list[str]:
    return [problem.field for problem in problems(row)]


def test_a_valid_ota_row_and_a_valid_command_row_have_no_problem():
    assert problems(ota_row()) == []
    command = NewAction(
        action_id="c-1", kind="command", command="reboot", args={"delay": "5"}, device_ids=["d1", "d2"]
    ).row(datetime.now(UTC))
    command["payload"]["args"] = list(command["payload"]["args"].items())  # as Arrow reads a map
    assert problems(command) == []


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        ({"target__group": None}, "target", "no target"),
        ({"target__group": None, "target__device_ids": []}, "target", "never every device"),
        ({"target__all": True}, "target", "give exactly one target"),
        ({"target__group": "a/b"}, "target.group", "one topic level"),
        ({"target__group": "+"}, "target.group", "one topic level"),
        ({"target__group": "  "}, "target.group", "must not be empty"),
        ({"payload__url": None}, "payload.url", "required for an ota action"),
        ({"payload__url": "notaurl"}, "payload.url", "not an http(s) URL"),
        ({"payload__url": "ftp://fw.example/x"}, "payload.url", "not an http(s) URL"),
        ({"payload__sha256": None}, "payload.sha256", "required for an ota action"),
        ({"payload__sha256": "abc"}, "payload.sha256", "64 hexadecimal digits"),
        ({"payload__version": None}, "payload.version", "required for an ota action"),
        ({"payload__size": -5}, "payload.size", "must be from 1"),
        ({"payload__command": "reboot"}, "payload.command", "not used by an ota action"),
        ({"kind": "firmware"}, "kind", "unknown kind 'firmware'; one of command, ota"),
        ({"rollout__max_per_minute": 0, "rollout__broadcast": False}, "rollout.max_per_minute", "from 1"),
        ({"rollout__max_per_minute": 10, "rollout__broadcast": True}, "rollout", "a broadcast has no rate"),
        ({"rollout__broadcast": False}, "rollout", "a paced rollout needs a rate"),
        ({"abort_criteria__failure_pct": 0.0}, "abort_criteria.failure_pct", "above 0"),
        ({"abort_criteria__failure_pct": 150.0}, "abort_criteria.failure_pct", "at most 100"),
        ({"abort_criteria__min_executed": 0}, "abort_criteria.min_executed", "from 1"),
        ({"in_progress_timeout_s": -1}, "in_progress_timeout_s", "from 1"),
        ({"id": ""}, "id", "must not be empty"),
        ({"created_at": None}, "created_at", "required"),
    ],
)
def test_each_problem_names_its_field(changes, field, words):
    row = ota_row(**changes)
    with pytest.raises(InvalidAction) as caught:
        check_action_row(row)
    assert caught.value.field == field, problems(row)
    assert words in str(caught.value) and str(caught.value).startswith(f"{field}: ")


def test_device_id_lists_refuse_duplicates_unsafe_ids_and_oversized_lists():
    row = ota_row(target__group=None, target__device_ids=["d1", "d2", "d1"])
    assert [str(p) for p in problems(row)] == ["target.device_ids: lists d1 more than once"]
    row = ota_row(target__group=None, target__device_ids=["d1", "dev/2"])
    assert "[1] 'dev/2': contains '/'" in str(problems(row)[0])
    many = [f"d{i}" for i in range(MAX_DEVICE_IDS + 1)]
    assert "target a group instead" in str(problems(ota_row(target__group=None, target__device_ids=many))[0])


def test_a_row_without_a_payload_lists_every_missing_field_of_its_kind():
    row = ota_row(payload=None)
    assert fields(row) == ["payload.version", "payload.url", "payload.sha256"]
    command = ota_row(kind="command", payload=None)
    assert fields(command) == ["payload.command"]


def test_the_definition_is_data_that_names_every_payload_field_it_checks():
    checked = {rule.field for rule in FIELD_RULES}
    for kind in KINDS.values():
        assert {f"payload.{name}" for name in kind.uses} <= checked
        assert set(kind.required) <= set(kind.uses)


@pytest.mark.parametrize(
    ("device_id", "said"),
    [
        ("dev\u009b1", "contains control characters"),  # C1: a terminal's CSI
        ("dev\u00851", "contains control characters"),  # C1: next line
        ("\ufeffdev-3", "contains a byte order mark (U+FEFF)"),  # two files joined, each with its BOM
    ],
)
def test_a_device_id_with_c1_controls_or_a_byte_order_mark_is_refused(device_id: str, said: str) -> None:
    """Only C0 controls and DEL were refused: an id read from joined files targeted a device named
    '\\ufeffdev-3', not dev-3, and C1 controls passed where the docs say no control characters do."""
    from pipelines.actions.checks import topic_level, usable_as_topic_level

    assert topic_level(device_id) == said or (topic_level(device_id) or "").startswith(said)
    assert not usable_as_topic_level(device_id)
    assert topic_level("dé-1") is None  # printable non-ASCII stays allowed


def test_a_device_list_file_skips_indented_comments(tmp_path) -> None:
    """An indented comment ('  # the night shift') was read as a device id and refused."""
    from pipelines.actions.cli import listed_ids

    listed = tmp_path / "devices.txt"
    listed.write_bytes("\ufeff# line 1\r\ndev-1\r\n  # the night shift\r\n\r\n  dev-2  \r\n".encode())
    assert listed_ids(str(listed)) == ["dev-1", "dev-2"]
