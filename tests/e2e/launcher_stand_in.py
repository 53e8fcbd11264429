"""A stand-in for `timestone broker` that listens on its MQTT port only and then idles: a broker caught
between binding its first listener and its next, for the launcher's tests.

Run: python -m tests.e2e.launcher_stand_in broker --config FILE
"""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import yaml

if __name__ == "__main__":
    config = yaml.safe_load(Path(sys.argv[sys.argv.index("--config") + 1]).read_text())
    listener = config["listeners"][0]
    with socket.create_server((listener["host"], listener["port"])):
        print("listening on the MQTT port only", flush=True)
        time.sleep(600)
