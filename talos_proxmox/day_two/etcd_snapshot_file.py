"""What an etcd snapshot file is, read without etcd: whether it is one, whether it is whole, and which
members it holds, so a recovery is refused before any node is touched when the file could not restore
this cluster. No Pulumi here.

An etcd snapshot (`etcdctl snapshot save`, Talos's EtcdSnapshot, talos-backup) is etcd's bbolt database
followed by the sha256 of that database (32 bytes: etcd's maintenance API appends it; etcdutl takes
`size % 512 == 32` as its sign). A copy of a member's `member/snap/db` has no such hash, and restores
only with Talos's `recover_skip_hash_check`.

bbolt's format (go.etcd.io/bbolt, little-endian): pages of `page_size` bytes, each with a 16-byte header
(id u64, flags u16, count u16, overflow u32); pages 0 and 1 are meta pages (magic 0xED0CDAED, version 2,
page size, flags, root bucket {page u64, sequence u64}, freelist, high water mark, txid, and an FNV-1a
64 checksum of the meta's first 56 bytes); the valid one with the higher txid is current. A bucket is a
B+tree of branch (0x01) and leaf (0x02) pages; a leaf element (flags u32, pos u32, key size u32, value
size u32) with flag 0x01 is a sub-bucket whose value starts with its root page id (0: the bucket's page
is inline, after those 16 bytes). etcd keeps its members in bucket `members`: key the member id in hex,
value JSON with `peerURLs` and `name` (Talos names each member after its node's hostname).
"""

from __future__ import annotations

import hashlib
import json
import struct
import urllib.parse
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

HASH_SIZE = 32
_MAGIC, _VERSION = 0xED0CDAED, 2
_BRANCH, _LEAF = 0x01, 0x02
_BUCKET = 0x01
_PAGE_HEADER = struct.Struct("<QHHI")
_META = struct.Struct("<IIIIQQQQQQ")
_LEAF_ELEMENT = struct.Struct("<IIII")
_BRANCH_ELEMENT = struct.Struct("<IIQ")


class SnapshotError(ValueError):
    """Not an etcd snapshot, or a damaged one; the message says what was found."""


@dataclass(frozen=True)
class Member:
    name: str
    peer_urls: tuple[str, ...]

    @property
    def peer_hosts(self) -> tuple[str, ...]:
        return tuple(urllib.parse.urlsplit(url).hostname or "" for url in self.peer_urls)


@dataclass(frozen=True)
class SnapshotFacts:
    size: int
    has_hash: bool  # False: a data-directory copy (Talos must skip the hash check)
    members: tuple[Member, ...]


def _fnv1a_64(data: bytes) -> int:
    value = 0xCBF29CE484222325
    for byte in data:
        value = ((value ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return value


def _meta(db: bytes, offset: int) -> Optional[tuple[int, int, int]]:
    """(page size, root page, txid) of the meta page at `offset`, or None if it is not a valid one."""
    if offset + 16 + _META.size > len(db):
        return None
    magic, version, page_size, _flags, root, _seq, _freelist, _pgid, txid, checksum = _META.unpack_from(db, offset + 16)
    if magic != _MAGIC or version != _VERSION or checksum != _fnv1a_64(db[offset + 16:offset + 16 + 56]):
        return None
    return page_size, root, txid


def _items(db: bytes, page_size: int, page: int, inline: Optional[bytes] = None,
           depth: int = 0) -> Iterator[tuple[int, bytes, bytes]]:
    """(flags, key, value) of every leaf element under a page (or an inline bucket page)."""
    if depth > 64:
        raise SnapshotError("its B+tree is deeper than any bbolt file's (a cycle?)")
    data, base = (inline, 0) if inline is not None else (db, page * page_size)
    if base + _PAGE_HEADER.size > len(data):
        raise SnapshotError(f"it is truncated or damaged: it refers to page {page}, beyond its end")
    _id, flags, count, _overflow = _PAGE_HEADER.unpack_from(data, base)
    for i in range(count):
        element = base + _PAGE_HEADER.size + i * _LEAF_ELEMENT.size
        if flags == _LEAF:
            element_flags, pos, key_size, value_size = _LEAF_ELEMENT.unpack_from(data, element)
            start = element + pos
            yield element_flags, bytes(data[start:start + key_size]), bytes(data[start + key_size:start + key_size + value_size])
        elif flags == _BRANCH:
            _pos, _key_size, child = _BRANCH_ELEMENT.unpack_from(data, element)
            yield from _items(db, page_size, child, depth=depth + 1)
        else:
            raise SnapshotError(f"page {page} is neither a branch nor a leaf (flags {flags:#x})")


def _bucket(db: bytes, page_size: int, value: bytes) -> Iterator[tuple[int, bytes, bytes]]:
    root, _sequence = struct.unpack_from("<QQ", value, 0)
    return _items(db, page_size, root) if root else _items(db, page_size, 0, inline=value[16:])


def read_snapshot(data: bytes) -> SnapshotFacts:
    """The facts of a snapshot file's bytes; SnapshotError when it is no etcd snapshot or is damaged."""
    has_hash = len(data) % 512 == HASH_SIZE
    db = data[:-HASH_SIZE] if has_hash else data
    if has_hash and hashlib.sha256(db).digest() != data[-HASH_SIZE:]:
        raise SnapshotError("its sha256 does not match its content (a damaged or truncated snapshot)")
    first = _meta(db, 0)
    metas = [m for m in (first, _meta(db, first[0] if first else 4096)) if m is not None]
    if not metas:
        raise SnapshotError("it is not an etcd snapshot (no bbolt database header)")
    page_size, root, _txid = max(metas, key=lambda m: m[2])
    try:
        buckets = {key: value for flags, key, value in _items(db, page_size, root) if flags & _BUCKET}
        if b"members" not in buckets:
            raise SnapshotError("it is a bbolt database without etcd's members bucket (not etcd's)")
        members = []
        for _flags, _key, value in _bucket(db, page_size, buckets[b"members"]):
            member = json.loads(value)
            members.append(Member(str(member.get("name") or ""), tuple(member.get("peerURLs") or ())))
    except (struct.error, json.JSONDecodeError, UnicodeDecodeError, AttributeError) as exc:
        raise SnapshotError(f"it is damaged ({type(exc).__name__})") from None
    return SnapshotFacts(size=len(data), has_hash=has_hash, members=tuple(members))


def foreign_snapshot_problem(facts: SnapshotFacts, control_planes: Sequence[tuple[str, str]]) -> Optional[str]:
    """Why the snapshot is not this cluster's (None: it is): none of its members is one of the stack's
    control planes [(name, ip)], by hostname or by peer address."""
    names = {name for name, _ in control_planes}
    addresses = {ip for _, ip in control_planes}
    if any(m.name in names or set(m.peer_hosts) & addresses for m in facts.members):
        return None
    found = ", ".join(f"{m.name or '?'} ({', '.join(m.peer_urls)})" for m in facts.members) or "none"
    return (f"is a snapshot of another cluster: its etcd members are {found}, and none is a control plane of "
            f"this stack ({', '.join(f'{n} ({ip})' for n, ip in control_planes)})")
