"""How the Sparkplug host reads a STATE on its own topic: a JSON object with ``online`` true is a birth."""

import json

import pytest

from pipelines.sparkplug_host.host import STATE_MAX_BRACKETS, says_online, state_payload


def test_its_own_birth_says_online_and_its_death_does_not():
    assert says_online(state_payload(True, 1_700_000_000_000))
    assert not says_online(state_payload(False, 1_700_000_000_000))


@pytest.mark.parametrize(
    "payload",
    [b"", b"online", b"\xff\xfe", b"[true]", b'"online"', b'{"online": "true"}', b'{"online": 1}', b"{}"],
)
def test_what_is_not_an_object_with_online_true_does_not_say_online(payload):
    assert not says_online(payload)


def test_a_state_nested_past_the_bound_is_not_parsed_and_does_not_say_online(monkeypatch):
    """Brackets nested deep made the JSON reader recurse to the interpreter's limit, where finalisers run
    meanwhile failed; such a STATE is refused before it is parsed."""
    levels = STATE_MAX_BRACKETS - 1  # the object's own bracket and these: as many as the bound
    deep = {"online": True, "extra": json.loads("[" * levels + "]" * levels)}
    assert says_online(json.dumps(deep).encode())

    def refuse(*_args, **_kwargs):
        raise AssertionError("parsed")

    monkeypatch.setattr(json, "loads", refuse)
    assert not says_online(b"[" * 100_000)
    one_past = b"[" * (levels + 1) + b"]" * (levels + 1)
    assert not says_online(b'{"online": true, "extra": ' + one_past + b"}")
