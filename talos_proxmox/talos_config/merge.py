"""Deep merge of Helm values, with Helm's own rules for user-supplied values (`-f`, `--set`).

Maps merge key by key; anything else (lists, scalars) in the override replaces the base value; a key
set to None in the override removes that key, as `helm install -f` treats a null. Talos machine
config patches follow other rules (lists append, keyed lists merge): see talos_proxmox/talos_config/machine_config.py.
"""

from __future__ import annotations

import copy
from typing import Any, Mapping


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """A new dict: `override` on top of `base`. Neither argument is changed."""
    merged = copy.deepcopy(dict(base))
    for key, value in override.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(_without_nulls(value))
    return merged


def _without_nulls(value: Any) -> Any:
    """A new map brought in whole carries no nulls either: Helm drops them the same way."""
    if isinstance(value, Mapping):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    return value
