"""``timestone cluster status --config FILE``: a broker's file it cannot use is refused as the broker would
refuse it, naming the key and where the file sets it."""

from __future__ import annotations

from broker_edge.cluster.coordination.status import cluster_main


def test_a_bad_value_of_the_brokers_file_names_the_file_and_its_line(tmp_path, capsys) -> None:
    """The line named the key, ``cluster.node_id: expected a string, got int 5``, but not which file."""
    config = tmp_path / "broker.yaml"
    config.write_text("cluster:\n  node_id: 5\n")

    assert cluster_main(["status", "--config", str(config)]) == 2
    assert capsys.readouterr().err == (
        f"timestone cluster status: cluster.node_id: expected a string, got int 5 (in {config}, line 2)\n"
    )
