"""``GET /v1/cluster``: any member tells a reader where everything is, from its own ``ClusterView``.

Readers of the logs (the Spark source, the OTA jobs) are given a few members of a cluster, not its layout.
Asking etcd would give them a dependency (and credentials) they do not need: every member already keeps the
members and partition states current, so it answers from memory, read-only, behind the offsets API's token.

The answer (``layout_document``)::

    {"node_id": "b1", "fenced": false, "partition_count": 16,
     "members": [{"node_id": "b1", "mqtt": "10.0.0.21:1883", "offsets_api": "http://10.0.0.21:9884"}, ...],
     "partitions": [{"partition": 0, "leader": "b2", "epoch": 3, "replicas": ["b2", "b1", "b3"],
                     "isr": ["b2", "b1", "b3"]}, ...]}

``fenced`` says the answering member cannot prove its etcd lease right now: its picture may be stale, so a
reader should prefer another member's. A member also says what it observes (the partitions it holds no copy
of and fetches for its subscribers, and the fetches it sent for each)::

    "observer": {"partitions": [3, 7], "fetches": {"3": 41, "7": 12}}

``broker_edge.offsets_api.discovery`` reads it back.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from broker_edge.cluster.view import ClusterView

if TYPE_CHECKING:
    from aiohttp import web

__all__ = ["CLUSTER_PATH", "cluster_info_route", "layout_document"]

CLUSTER_PATH = "/v1/cluster"


def layout_document(view: ClusterView) -> dict[str, Any]:
    """The JSON object of ``GET /v1/cluster`` for ``view`` (members and partitions sorted)."""
    return {
        "node_id": view.node_id,
        "fenced": view.fenced,
        "partition_count": view.partitions,
        "members": [  # where readers and devices reach each member (not the members' own endpoint)
            {"node_id": member.node_id, "mqtt": member.mqtt, "offsets_api": member.offsets_api}
            for _, member in sorted(view.members.items())
        ],
        "partitions": [json.loads(state.to_json()) for _, state in sorted(view.states.items())],
    }


def cluster_info_route(
    view: ClusterView, observer: Callable[[], dict[str, Any]] | None = None
) -> Callable[[web.Application], None]:
    """A function adding ``GET /v1/cluster`` to an offsets API app (``create_app(routes=[...])``);
    ``observer`` gives the document's ``observer`` entry."""

    def add(app: web.Application) -> None:
        from aiohttp import web

        async def handle(_request: web.Request) -> web.StreamResponse:
            document = layout_document(view)
            if observer is not None:
                document["observer"] = observer()
            return web.json_response(document)

        app.router.add_get(CLUSTER_PATH, handle)

    return add
