"""The router and what it routes with: the subscription trie and the retained messages."""
