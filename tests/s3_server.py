"""An S3 endpoint on loopback for tests: moto's server in a process of its own, one bucket per test.

Not moto's threaded server: some delta-rs calls hold the GIL while they wait for the endpoint's answer,
which a server thread of the same process could then never give.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

REGION = "us-east-1"
ACCESS_KEY = "timestone-test"
SECRET_KEY = "timestone-test-secret"


@dataclass(frozen=True)
class S3Endpoint:
    """A running S3 endpoint: its URL and the storage options delta-rs and the tasks' writers take."""

    url: str

    def storage_options(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.url,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
            "AWS_ALLOW_HTTP": "true",
            "AWS_CONDITIONAL_PUT": "etag",  # concurrent commits need an atomic put-if-absent
        }

    def client(self):  # boto3's client, typed loosely: boto3 ships no type information
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.url,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
        )

    def new_bucket(self) -> str:
        name = f"lake-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str, prefix: str = "") -> set[str]:
        """Every object key under ``prefix`` in ``bucket``."""
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return {item["Key"] for page in pages for item in page.get("Contents", [])}


@contextmanager
def s3_endpoint() -> Iterator[S3Endpoint]:
    """moto's S3 server on a free loopback port for the duration of the block."""
    from broker_edge.runtime.launcher import free_port, wait_for_port

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port, timeout_s=60, alive=server.poll)
        yield S3Endpoint(f"http://127.0.0.1:{port}")
    finally:
        server.terminate()
        server.wait(timeout=30)
