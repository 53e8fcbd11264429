"""Coordination through etcd: membership, the view of the cluster, the controller."""
