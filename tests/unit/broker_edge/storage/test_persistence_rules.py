"""A topic's rule number is the same whether `should_persist` asked for it first or not, and a new log
keeps the one its first publish was asked with."""

from __future__ import annotations

from pathlib import Path

from broker_edge.protocol.topics import topic_matches
from broker_edge.storage import LogStore, StorageConfig
from broker_edge.storage.config import PersistRule
from broker_edge.storage.persistence import CREATES_LOG, LOGGED, NO_MATCH, NOT_LOGGED, PersistenceRules
from broker_edge.storage.topic_table import NO_RULE


def _rules() -> PersistenceRules:
    return PersistenceRules([PersistRule("fleet/#", qos=(1,)), PersistRule("+/alarm", qos=(0, 1))])


def test_rule_number_after_should_persist_is_the_rule_found_without_it():
    topics = ["fleet/device-1", "x/alarm", "other/topic", "fleet/alarm"]
    fresh = [_rules().rule_number(topic) for topic in topics]
    asked = _rules()
    for topic in topics:
        asked.should_persist(topic, 1)
    assert [asked.rule_number(topic) for topic in topics] == fresh == [0, 1, NO_MATCH, 0]


def test_a_new_log_holds_its_rule_number_from_its_first_append(tmp_path: Path):
    rules = [PersistRule("fleet/#", qos=(1,)), PersistRule("+/alarm", qos=(0, 1))]
    with LogStore(tmp_path / "data", StorageConfig(persist=rules)) as store:
        for topic in ("fleet/device-1", "x/alarm"):
            assert store.should_persist(topic, 1)
            store.append_message(topic, b"{}")
        held = [store._table.rule[store.topic_id(topic)] for topic in ("fleet/device-1", "x/alarm")]
    assert held == [0, 1] and NO_RULE not in held


def test_persist_as_tells_a_publish_that_creates_its_log_from_one_that_has_one(tmp_path: Path):
    rules = [PersistRule("fleet/#", qos=(1,))]
    with LogStore(tmp_path / "data", StorageConfig(persist=rules)) as store:
        before = store.persist_as("fleet/device-1", 1)
        store.append_message("fleet/device-1", b"{}")
        answers = [
            before,
            store.persist_as("fleet/device-1", 1),
            store.persist_as("fleet/device-1", 0),
            store.persist_as("office/door", 1),
        ]
    assert answers == [CREATES_LOG, LOGGED, NOT_LOGGED, NOT_LOGGED]


def test_the_catch_all_rule_matches_what_the_topic_filter_matches():
    rules = PersistenceRules(
        [PersistRule("$SYS/#", qos=(0,)), PersistRule("#", qos=(1,)), PersistRule("+/x")]
    )
    topics = ["a", "a/b/c", "/", "$SYS/broker/load", "$other", "+x", "#"]
    expected = [
        next((n for n, rule in enumerate(rules.rules) if topic_matches(rule.pattern, topic)), NO_MATCH)
        for topic in topics
    ]

    assert [rules.rule_number(topic) for topic in topics] == expected == [1, 1, 1, 0, NO_MATCH, 1, 1]
    assert [rules.should_persist(topic, 1) for topic in topics] == [True] * 3 + [False] * 2 + [True] * 2
