"""A client connection and the state it shares with others: terms, states, inbound."""
