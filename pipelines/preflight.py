"""What a pipeline checks of the world before Spark starts: that the brokers it must read answer.

A run with ``--available-now`` reads what the brokers hold now and stops. The ``timestone`` source itself
carries on past a broker that does not answer (a continuous query must outlive a broker restart), so such
a run would end "successfully" with no records from it; reading a cluster, it would fail deep inside Spark.
Both are one error here instead, before anything starts: every standalone broker must answer, and at
least one member of a cluster (the source finds the others). A broker that answers but refuses the token
(401, 403) is no network trouble: :class:`TokenRefused`, which no restart fixes, as a continuous run's
query that fails on it (``pipelines.supervisor``).
"""

from __future__ import annotations

from broker_edge.offsets_api.client import OffsetsClient
from broker_edge.offsets_api.errors import NO_OFFSETS_API, OffsetsApiError
from broker_edge.security.client_tls import ClientTls, context_for
from sources.options import SourceOptions

__all__ = ["PROBE_TIMEOUT_S", "BrokersUnreachable", "TokenRefused", "require_brokers"]

PROBE_TIMEOUT_S = 5.0


REFUSED_TOKEN = "it refused the token"


class BrokersUnreachable(Exception):
    """The brokers a run must read did not answer; the message names each and why."""


class TokenRefused(Exception):
    """A broker a run must read refused its token (401, 403): a configuration mistake no restart fixes; the
    message names each such broker and its answer."""


def _answer(
    url: str,
    token: str | None,
    pattern: str | None,
    timeout_s: float,
    tls: ClientTls | None,
    member: bool = False,
) -> str | None:
    """Why the offsets API at ``url`` cannot be read (``member``: as a cluster member's), or None when it
    answered."""
    context = context_for(url, tls)
    listed = False
    try:
        with OffsetsClient(url, token, timeout_s, context, retries=0) as client:
            client.list_logs(pattern)
            listed = True
            if member:
                client.cluster()
    except OffsetsApiError as error:
        if error.status in (401, 403):
            return f"{REFUSED_TOKEN} ({error})"
        if error.status == 404 and not listed:
            return f"{error}: {NO_OFFSETS_API}"
        if member and error.status == 404:
            return "no cluster member (a standalone broker goes in brokers, not in bootstrap_servers)"
        return str(error)
    except Exception as error:  # BrokerUnavailable, with the refused connection or timeout as its cause
        cause = error.__cause__
        why = getattr(cause, "strerror", None) or str(cause or error).removeprefix(f"{url}: ")
        return str(why)
    return None


def _refused(reasons: dict[str, str | None]) -> None:
    """Raise :class:`TokenRefused` naming those of ``reasons`` (a broker's name or URL: why it cannot be
    read) that refused the token, if any did."""
    refused = [f"{who}: {why}" for who, why in reasons.items() if why and why.startswith(REFUSED_TOKEN)]
    if refused:
        raise TokenRefused(f"{'; '.join(refused)} (see the source options authToken, authToken.<broker id>)")


def require_brokers(options: SourceOptions, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Raise :class:`TokenRefused` if a broker of ``options`` refuses the token, else
    :class:`BrokersUnreachable` unless they can be read now."""
    pattern = options.topics[0] if len(options.topics) == 1 else None
    if options.reads_cluster:
        reasons = {
            url: _answer(url, options.auth_token, pattern, timeout_s, options.tls, member=True)
            for url in options.bootstrap_servers
        }
        if all(reasons.values()):
            _refused(reasons)
            listed = "; ".join(f"{url}: {why}" for url, why in reasons.items())
            raise BrokersUnreachable(f"no member of the cluster answered (bootstrap_servers: {listed})")
        return
    reasons = {
        f"{broker.name} ({broker.offsets_api})": _answer(
            broker.offsets_api, broker.token, pattern, timeout_s, options.tls
        )
        for broker in options.brokers
    }
    _refused(reasons)
    down = [f"{who}: {why}" for who, why in reasons.items() if why is not None]
    if down:
        raise BrokersUnreachable(
            f"broker{'s' if len(down) > 1 else ''} not answering: {'; '.join(down)}; "
            "a run with --available-now reads every broker or none"
        )
