"""Run an amqtt broker from a YAML config with logging at WARNING (amqtt's own CLI logs every connection).

Executed by amqtt's virtualenv interpreter, not the project's: it imports nothing from the project.
Usage: amqtt_launch.py CONFIG.yaml
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys


def main(config_path: str) -> int:
    """Start the broker and serve until SIGTERM or SIGINT."""
    from amqtt.broker import Broker
    from amqtt.utils import read_yaml_config

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    broker = Broker(read_yaml_config(config_path), loop=loop)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    async def serve() -> None:
        await broker.start()
        await stop.wait()
        await asyncio.wait_for(broker.shutdown(), timeout=5)

    try:
        loop.run_until_complete(serve())
    finally:
        loop.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
