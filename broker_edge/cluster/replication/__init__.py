"""The replicated log: the leader's side, the followers' fetchers, leader epochs."""
