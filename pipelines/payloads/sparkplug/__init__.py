"""Sparkplug B: its payload schema, topic namespace, messages, and the edge node sessions a host keeps.

``schema`` loads the specification's protobuf schema; ``topics`` reads the ``spBv1.0`` topic namespace;
``messages`` reads one message into its metrics; ``session`` is the state a host application keeps per edge
node (the births' aliases, the sequence numbers, who is online); ``aliases`` which birth in force gives each
of an edge node's aliases; ``encode`` writes messages, for the
simulated fleet and the tests.
"""
