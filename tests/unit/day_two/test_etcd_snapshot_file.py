"""etcd snapshot files read without etcd (talos_proxmox.day_two.etcd_snapshot_file), on snapshots the real etcd
made (tests/data/etcd/make_snapshots.py): the members found, a data-directory copy told apart, damage and
other files refused with the reason, and a snapshot of another cluster named as such."""

import pytest

from talos_proxmox.day_two.etcd_snapshot_file import (
    Member,
    SnapshotError,
    foreign_snapshot_problem,
    read_snapshot,
)
from tests.paths import REPO

DATA = REPO / "tests" / "data" / "etcd"
OURS = (DATA / "dr-cp-1.snapshot").read_bytes()
OTHER = (DATA / "other-cluster.snapshot").read_bytes()
CONTROL_PLANES = [("dr-cp-1", "127.0.0.122"), ("dr-cp-2", "127.0.0.123")]


def test_a_snapshot_s_members_and_hash_are_read():
    facts = read_snapshot(OURS)
    assert (facts.size, facts.has_hash) == (len(OURS), True)
    assert facts.members == (Member("dr-cp-1", ("https://127.0.0.122:2380",)),)
    assert foreign_snapshot_problem(facts, CONTROL_PLANES) is None


def test_a_data_directory_copy_has_no_hash_and_still_reads():
    facts = read_snapshot(OURS[:-32])
    assert facts.has_hash is False and facts.members == read_snapshot(OURS).members


def test_a_member_matching_by_address_alone_is_this_cluster_s():
    assert foreign_snapshot_problem(read_snapshot(OURS), [("renamed-cp", "127.0.0.122")]) is None


def test_another_cluster_s_snapshot_is_named_with_its_members_and_ours():
    assert foreign_snapshot_problem(read_snapshot(OTHER), CONTROL_PLANES) == (
        "is a snapshot of another cluster: its etcd members are prod-cp-1 (https://10.20.0.11:2380), and none is "
        "a control plane of this stack (dr-cp-1 (127.0.0.122), dr-cp-2 (127.0.0.123))")


@pytest.mark.parametrize("data, reason", [
    (OURS[:-33] + bytes([OURS[-33] ^ 1]) + OURS[-32:], "its sha256 does not match its content"),
    (OURS[:8192] + OURS[-32:], "its sha256 does not match its content"),
    (b"\0" * 4096, "it is not an etcd snapshot (no bbolt database header)"),
    (b"not a snapshot at all\n", "it is not an etcd snapshot (no bbolt database header)"),
    (OURS[:4096], "it is truncated or damaged: it refers to page 4, beyond its end"),
], ids=["flipped-byte", "truncated", "zeros", "text", "first-page-only"])
def test_damage_and_other_files_are_refused_with_the_reason(data, reason):
    with pytest.raises(SnapshotError) as err:
        read_snapshot(data)
    assert str(err.value).startswith(reason)
