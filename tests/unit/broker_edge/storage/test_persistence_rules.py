"""A topic's rule number is the same whether `should_persist` asked for it first or not."""

from __future__ import annotations

from broker_edge.storage.config import PersistRule
from broker_edge.storage.persistence import NO_MATCH, PersistenceRules


def _rules() -> PersistenceRules:
    return PersistenceRules([PersistRule("fleet/#", qos=(1,)), PersistRule("+/alarm", qos=(0, 1))])


def test_rule_number_after_should_persist_is_the_rule_found_without_it():
    topics = ["fleet/device-1", "x/alarm", "other/topic", "fleet/alarm"]
    fresh = [_rules().rule_number(topic) for topic in topics]
    asked = _rules()
    for topic in topics:
        asked.should_persist(topic, 1)
    assert [asked.rule_number(topic) for topic in topics] == fresh == [0, 1, NO_MATCH, 0]
