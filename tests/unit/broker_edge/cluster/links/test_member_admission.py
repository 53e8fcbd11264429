"""Who the members' endpoint admits (``member_api.member_authenticator``): current members, as themselves;
a node that proves its id but is no member now only to ``GET /v1/cluster`` (a member fenced off etcd, its
lease ended, asks there whether this node is a member before sending its clients here), nothing else."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import make_mocked_request

from broker_edge.cluster.links.member_api import member_authenticator
from broker_edge.cluster.links.member_clients import NODE_HEADER
from broker_edge.cluster.view import ClusterView
from broker_edge.offsets_api.requests import ApiError
from broker_edge.placement import Member


def view_of_a_and_b() -> ClusterView:
    view = ClusterView("a", 4)
    for node in ("a", "b"):
        view.members[node] = Member(node, "127.0.0.1:1883", "http://127.0.0.1:9884")
    return view


def test_a_node_no_longer_a_member_may_ask_who_is_one_and_nothing_else() -> None:
    authenticate = member_authenticator(view_of_a_and_b(), None)  # loopback: the node it claims
    asking = make_mocked_request("GET", "/v1/cluster", headers={NODE_HEADER: "c"})
    assert authenticate(asking).member == "c"
    for method, path in (("GET", "/v1/peer"), ("POST", "/v1/replica/fetch"), ("POST", "/v1/cluster")):
        with pytest.raises(ApiError) as refused:
            authenticate(make_mocked_request(method, path, headers={NODE_HEADER: "c"}))
        assert refused.value.status == 403 and "c is not a member" in str(refused.value)


def test_a_member_is_admitted_as_itself() -> None:
    authenticate = member_authenticator(view_of_a_and_b(), None)
    assert (
        authenticate(make_mocked_request("POST", "/v1/replica/fetch", headers={NODE_HEADER: "b"})).member
        == "b"
    )
