"""The broker's features across brokers: sessions, wills, retained messages, shared subscriptions."""
