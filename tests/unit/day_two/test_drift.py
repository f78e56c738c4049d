"""What a refresh makes of a node's running configuration (talos_proxmox.day_two.drift): the same documents
in another layout are no drift; a change is reported line by line with secrets masked."""

from talos_proxmox.day_two import drift

APPLIED = """version: v1alpha1
machine:
    type: worker
    token: abcdef.0123456789abcdef
    sysctls:
        net.core.somaxconn: "1024"
"""


def test_the_same_documents_reencoded_are_no_drift():
    reencoded = "version: v1alpha1\nmachine: {type: worker, token: abcdef.0123456789abcdef,\n" \
                "  sysctls: {net.core.somaxconn: '1024'}}\n---\n"
    assert drift.same_configuration(APPLIED, reencoded)
    assert not drift.same_configuration(APPLIED, APPLIED.replace('"1024"', '"4096"'))
    assert not drift.same_configuration(APPLIED, "not: [valid")


def test_the_report_names_the_node_counts_the_lines_and_masks_secrets():
    running = APPLIED.replace('"1024"', '"4096"').replace("0123456789abcdef", "fedcba9876543210")
    summary, *lines = drift.drift_report("node 10.0.0.5", APPLIED, running)
    assert summary == ("node 10.0.0.5: its running config differs from the stack's (1 line(s) set by hand, 1 to "
                       "apply back; secrets masked)")  # the token differs too, but masked it reads the same
    assert '-        net.core.somaxconn: "4096"' in lines and '+        net.core.somaxconn: "1024"' in lines
    assert not [line for line in lines if "abcdef" in line or "fedcba" in line]


def test_a_node_on_another_talos_version_is_named_with_what_the_next_up_does():
    assert drift.version_drift("node cp-1", "v1.13.6", "v1.13.7") == (
        "node cp-1: runs Talos v1.13.6, the stack says v1.13.7: the next up rolls it to v1.13.7, one node at a time as "
        "upgrades go")
    assert drift.version_drift("node cp-1", "v1.13.7", "1.13.7") is None
    assert drift.version_drift("node cp-1", None, "v1.13.7") is None


def test_a_control_plane_missing_from_etcd_is_named_with_the_way_back():
    line = drift.missing_member("node cp-2")
    assert line.startswith("node cp-2: a control plane that is not an etcd member")
    assert "`pulumi up` does not guess" in line
