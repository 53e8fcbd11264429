"""A configuration error says where its key was set: the ``--set`` that set it, else the file and line."""

from __future__ import annotations

from broker_edge.config.loader import ConfigError, sourced

TEXT = "limits:\n  max_connections: 5\nlisteners:\n  - name: a\n  - name: b\n    port: x\n"


def test_the_line_of_the_key_or_of_the_nearest_key_above_it(tmp_path) -> None:
    path = tmp_path / "broker.yaml"
    path.write_text(TEXT)

    assert (
        str(sourced(ConfigError("listeners[1].port", "bad"), path))
        == f"listeners[1].port: bad (in {path}, line 6)"
    )
    assert sourced(ConfigError("limits.max_topics", "bad"), path).source == f"in {path}, line 1"
    assert sourced(ConfigError("listeners[1]", "bad"), path).source == f"in {path}, line 5"


def test_a_set_that_set_the_key_or_a_key_above_it_wins_over_the_file(tmp_path) -> None:
    path = tmp_path / "broker.yaml"
    path.write_text(TEXT)
    overrides = ["limits={max_connections: -1}", "listeners[1].port=x"]

    assert (
        sourced(ConfigError("limits.max_connections", "bad"), path, overrides).source == "from --set limits"
    )
    assert sourced(ConfigError("listeners[1].port", "bad"), path, overrides).source == (
        "from --set listeners[1].port"
    )
    assert sourced(ConfigError("listeners[1].name", "bad"), path, overrides).source == f"in {path}, line 5"


def test_an_error_naming_no_key_of_the_file_is_left_as_it_is(tmp_path) -> None:
    """A file another setting names (the ACL file) is named by the error itself."""
    path = tmp_path / "broker.yaml"
    path.write_text(TEXT)
    acl = ConfigError(str(tmp_path / "acl.yaml"), "not UTF-8 text")

    assert sourced(acl, path) is acl
    assert sourced(ConfigError("", "no key"), path).source == ""
    assert sourced(ConfigError("limits.max_connections", "bad"), None).source == ""


def test_an_env_value_is_named_once(tmp_path) -> None:
    """The variable an error already names (not set, no name) is not said again after the file's line."""
    path = tmp_path / "broker.yaml"
    path.write_text("auth:\n  password_file: !env PASSWORDS\n  allow_anonymous: !env\n")
    unset = ConfigError(
        "auth.password_file", "the environment variable PASSWORDS (!env PASSWORDS) is not set"
    )
    nameless = ConfigError("auth.allow_anonymous", "!env needs the name of an environment variable, got ''")

    assert sourced(unset, path).source == f"in {path}, line 2"
    assert sourced(nameless, path).source == f"in {path}, line 3"
    assert (
        sourced(ConfigError("auth.password_file", "bad"), path).source == f"in {path}, line 2, !env PASSWORDS"
    )
