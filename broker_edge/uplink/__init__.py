"""The edge uplink: a site sends its logs to a hub over one connection it opens (docs/uplink.md)."""
