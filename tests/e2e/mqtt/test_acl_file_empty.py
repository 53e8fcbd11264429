"""An ACL file with no rules (empty, only comments, ``rules: []``, or emptied by an edit before a SIGHUP)
denies what no rule allows: ``acl.file`` says the broker is to be closed by rules, and a file that config
management or an editor left empty let every client publish and subscribe to everything. The default of a
broker with no ACL at all (everything allowed) and an explicit ``acl.default`` stay as they were."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker_edge.protocol.packets import Will
from broker_edge.security.acl import AccessControl, AclConfig
from tests.e2e.broker_clients import RawClient


@pytest.mark.parametrize("text", ["", "# rules to come\n", "rules: []\n"])
def test_a_broker_whose_acl_file_has_no_rules_allows_nothing(start_broker, tmp_path: Path, text: str):
    acl = tmp_path / "acl.yaml"
    acl.write_text(text)
    broker = start_broker(acl={"file": str(acl)})
    assert RawClient(broker.port, 5).connect("a", will=Will("any/topic", b"w")).reason_code == 0x87
    opened = start_broker(acl={"file": str(acl), "default": "allow"})
    assert RawClient(opened.port, 5).connect("b", will=Will("any/topic", b"w")).reason_code == 0


def test_an_acl_file_emptied_before_a_reload_allows_nothing(tmp_path: Path):
    acl = tmp_path / "acl.yaml"
    acl.write_text("rules:\n  - {permission: allow, action: all, topic: 'ok/#'}\n")
    config = AclConfig(file=str(acl))
    control = AccessControl.from_config(config)
    assert control.can_publish("c", None, "ok/1") and not control.can_publish("c", None, "other")
    acl.write_text("")
    assert control.reload(config) == 0
    assert not control.can_publish("c", None, "ok/1") and not control.can_publish("c", None, "other")
    assert AccessControl.from_config(AclConfig()).can_publish("c", None, "other")
