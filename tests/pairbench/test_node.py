"""pairbench.measure.node: the pseudonym a visit publishes for the node it ran on."""

import re

from pairbench.measure.node import pseudonym


def test_one_node_reads_the_same_within_a_run_and_differently_across_runs():
    # exact values, pinned: the pseudonym is the first 8 hex digits of
    # sha256(b"pairbench.node/v1\0" + secret + b"\0" + host), so every process, machine and
    # pairbench version names one node of one run alike (the audit compares them across visits)
    assert pseudonym("gpu-node-017", b"run one") == "node-c980e267"
    assert pseudonym("gpu-node-018", b"run one") == "node-a6f54024"
    assert pseudonym("gpu-node-017", b"run two") == "node-7af6f746"


def test_the_pseudonym_is_a_fixed_shape_whatever_the_host_name():
    name = pseudonym("gpu-node-017.cluster.example.org", b"secret")
    assert re.fullmatch(r"node-[0-9a-f]{8}", name)


def test_later_blocks_are_pinned_to_the_first_block_s_node():
    from pairbench.measure.node import pin_extra

    assert pin_extra(None, "cn07") == "--nodelist=cn07"
    assert pin_extra("--qos=short", "cn07") == "--qos=short --nodelist=cn07"
    assert pin_extra("--qos=short", None) == "--qos=short"  # the first block: not pinned
    assert pin_extra("--nodelist=cn01", "cn07") == "--nodelist=cn01"  # the config's own choice stands
    assert pin_extra("-w cn01", "cn07") == "-w cn01"
