"""The broker's configuration, composed from every section."""
