"""The broker as a child process, for end-to-end tests (see ``broker_edge.launcher``)."""

from broker_edge.launcher import BrokerProcess

__all__ = ["BrokerProcess"]
