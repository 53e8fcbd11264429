"""Broker benchmark suite: Timestone's edge broker side by side with Mosquitto and amqtt.

Run it with `python -m bench` (see bench/README.md); it writes bench/RESULTS.md.
"""
