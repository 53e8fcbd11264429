"""Where the Spark tasks write a table's data files: a local directory or an S3 bucket, through pyarrow.

delta-rs commits the files (in the driver) and reads the table's storage options in its own spelling
(``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL``, ...). The tasks write the same files with pyarrow's file
systems, which take the same settings under other names: :class:`FileLocation` carries the table's URI and
its storage options into the tasks (it is pickled with the task) and opens the matching pyarrow file
system there. Options only delta-rs reads (locking, conditional put) are ignored here; without keys, pyarrow
takes the credentials the executor's environment provides (environment variables, an instance profile).
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow.fs as pafs

#: URI schemes the tasks write to with pyarrow's S3 file system.
S3_SCHEMES = ("s3", "s3a")


class UnsupportedLocation(ValueError):
    """A table location the tasks cannot write data files to."""


def local_directory(location: str) -> str | None:
    """The filesystem path of a local location (a path or a ``file://`` URI); None for other URIs."""
    if location.startswith("file://"):
        return urllib.parse.unquote(urllib.parse.urlparse(location).path)
    return None if "://" in location else location


def check_root(root: str) -> None:
    """delta-rs reads a '%' and two hex digits in a local path as a URL escape (it decodes even a
    ``file://`` URI's path twice) and writes or looks for the table elsewhere: such a root is refused."""
    directory = local_directory(root)
    if directory is not None and urllib.parse.unquote(directory) != directory:
        raise ValueError(
            f"table root {directory!r} holds a '%' and two hex digits, which delta-rs reads as a URL "
            "escape (its tables could not be created or read): choose a root without them"
        )


@dataclass(frozen=True)
class FileLocation:
    """A table directory as the tasks see it: its URI (or local path) and its storage options."""

    uri: str
    storage_options: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if local_directory(self.uri) is None and _scheme(self.uri) not in S3_SCHEMES:
            raise UnsupportedLocation(
                f"{self.uri}: the Spark tasks write data files to local paths and s3:// URIs only"
            )

    @property
    def is_local(self) -> bool:
        return local_directory(self.uri) is not None

    def open(self) -> tuple[pafs.FileSystem, str]:
        """The pyarrow file system and the table directory's path in it."""
        directory = local_directory(self.uri)
        if directory is not None:
            return pafs.LocalFileSystem(), os.path.abspath(directory)
        parsed = urllib.parse.urlparse(self.uri)
        return s3_file_system(self.storage_options), f"{parsed.netloc}{parsed.path}".rstrip("/")


def s3_file_system(options: Mapping[str, str]) -> pafs.S3FileSystem:
    """pyarrow's S3 file system configured from delta-rs / object_store style storage options."""
    given = {key.lower().removeprefix("aws_"): value for key, value in options.items()}
    settings: dict[str, Any] = {}
    if "access_key_id" in given:
        settings["access_key"] = given["access_key_id"]
        settings["secret_key"] = given.get("secret_access_key", "")
    token = given.get("session_token") or given.get("token")
    if token:
        settings["session_token"] = token
    region = given.get("region") or given.get("default_region")
    if region:
        settings["region"] = region
    endpoint = given.get("endpoint_url") or given.get("endpoint")
    if endpoint:
        parsed = urllib.parse.urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
        settings["endpoint_override"] = parsed.netloc
        settings["scheme"] = parsed.scheme
    if _true(given.get("virtual_hosted_style_request")):
        settings["force_virtual_addressing"] = True
    return pafs.S3FileSystem(**settings)


def _scheme(uri: str) -> str:
    return uri.split("://", 1)[0].lower() if "://" in uri else ""


def _true(value: str | None) -> bool:
    return value is not None and value.strip().lower() in ("1", "true", "yes")
