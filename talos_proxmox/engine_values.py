"""Values as the Pulumi engine hands them to a dynamic provider, made what they were. No Pulumi import."""

from __future__ import annotations

from typing import Any, Mapping


def with_integers(value: Any) -> Any:
    """`value` with each whole-number float made an int again. The engine carries every number as a
    protobuf double, so a patch's `mtu: 1420` reaches a dynamic provider as 1420.0, which Talos's
    integer fields (and Go's YAML decoder) refuse, and a VM's 2 cores as 2.0."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, Mapping):
        return {key: with_integers(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [with_integers(item) for item in value]
    return value
