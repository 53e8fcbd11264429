"""Whether the job's brokers form one cluster, and which of them answer: the one place the job asks.

A cluster member describes its cluster at ``GET /v1/cluster`` on its offsets API and a standalone broker
does not serve that path: a member answers 200, a standalone broker 404, a broker that is down nothing. A
broker that refuses the token (401) is :class:`TokenRefused`, which no restart fixes (exit status 5, as the
telemetry job and a query failing on it end).
"""

from __future__ import annotations

import enum
import urllib.error
import urllib.request
from collections.abc import Sequence

from broker_edge.config import ConfigError
from broker_edge.config.endpoints import BrokerEndpoint
from broker_edge.security.client_tls import ClientTls, context_for
from pipelines.preflight import REFUSED_TOKEN, BrokersUnreachable, TokenRefused

__all__ = ["BrokerKind", "brokers_form_a_cluster", "live_endpoints", "probe"]

PROBE_PATH = "/v1/cluster"
PROBE_TIMEOUT_S = 5.0


class BrokerKind(enum.Enum):
    MEMBER = "cluster member"
    STANDALONE = "standalone"
    DOWN = "down"


def probe(
    endpoint: BrokerEndpoint, timeout_s: float = PROBE_TIMEOUT_S, tls: ClientTls | None = None
) -> BrokerKind:
    """What ``endpoint`` is now: a cluster member, a standalone broker, or not answering (its ``https://``
    offsets API checked with ``tls``); :class:`TokenRefused` when it refuses the token."""
    request = urllib.request.Request(f"{endpoint.offsets_api}{PROBE_PATH}", method="GET")
    if endpoint.token:
        request.add_header("Authorization", f"Bearer {endpoint.token}")
    try:
        context = context_for(endpoint.offsets_api, tls)
        with urllib.request.urlopen(request, timeout=timeout_s, context=context):
            return BrokerKind.MEMBER
    except urllib.error.HTTPError as error:
        if error.code == 401:
            raise TokenRefused(
                f"{endpoint.name} ({endpoint.offsets_api}): {REFUSED_TOKEN} of its offsets API (401; set "
                "brokers[].token)"
            ) from None
        return BrokerKind.STANDALONE
    except (OSError, ValueError):
        return BrokerKind.DOWN


def brokers_form_a_cluster(
    endpoints: Sequence[BrokerEndpoint], timeout_s: float = PROBE_TIMEOUT_S, tls: ClientTls | None = None
) -> bool:
    """True when the brokers that answer are all cluster members, False when all are standalone.

    A mix is a configuration error (one job cannot both publish once and publish to each broker); a list of
    which none answers is :class:`BrokersUnreachable` (nothing can be decided; set ``cluster`` to say)."""
    kinds = {endpoint.name: probe(endpoint, timeout_s, tls) for endpoint in endpoints}
    answered = {kind for kind in kinds.values() if kind is not BrokerKind.DOWN}
    if not answered:
        raise BrokersUnreachable(
            f"no broker answered to tell whether they form a cluster: {', '.join(sorted(kinds))} "
            "(their offsets APIs; set cluster: true or false to start without asking)"
        )
    if len(answered) > 1:
        listed = ", ".join(f"{name}: {kind.value}" for name, kind in sorted(kinds.items()))
        raise ConfigError("brokers", f"cluster members and standalone brokers mixed ({listed})")
    return answered == {BrokerKind.MEMBER}


def live_endpoints(
    endpoints: Sequence[BrokerEndpoint],
    first: int = 0,
    timeout_s: float = PROBE_TIMEOUT_S,
    tls: ClientTls | None = None,
) -> list[BrokerEndpoint]:
    """The members of ``endpoints`` that answer now, in list order starting from index ``first``."""
    ordered = [endpoints[(first + n) % len(endpoints)] for n in range(len(endpoints))]
    return [endpoint for endpoint in ordered if probe(endpoint, timeout_s, tls) is BrokerKind.MEMBER]
