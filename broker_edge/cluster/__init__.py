"""Brokers as one cluster: etcd membership and partition leadership, a replicated log, forwarding.

A broker joins a cluster through the ``cluster:`` section of its configuration; without it nothing in this
package is loaded. ``view`` holds what every part shares: the members, the partitions of the topic space,
who leads each one under which epoch, and its in-sync replicas. See docs/cluster.md for the model.
"""
