"""Configuration: typed YAML documents loaded into dataclasses, validated at the edge."""

from broker_edge.config.loader import ConfigError, load_dataclass, load_yaml_file

__all__ = ["ConfigError", "load_dataclass", "load_yaml_file"]
