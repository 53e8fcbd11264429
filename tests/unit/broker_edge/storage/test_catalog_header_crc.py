"""A new catalog's checksum is known without loading the CRC32C package (the broker opens an empty data
directory before anything needs a checksum)."""

from __future__ import annotations

from crc32c import crc32c

from broker_edge.storage.catalog import EMPTY_CRC, HEADER, MAGIC, VERSION


def test_the_empty_catalogs_crc_is_its_headers():
    assert crc32c(HEADER.pack(MAGIC, VERSION)) == EMPTY_CRC
