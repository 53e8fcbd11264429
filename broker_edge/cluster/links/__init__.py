"""Peer links: one WebSocket between every pair of brokers."""
