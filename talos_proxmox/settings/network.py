"""The `network` section: the nodes' subnet, gateway, nameservers and MTU. No Pulumi here."""

from __future__ import annotations

import ipaddress
from typing import Any, Optional

from talos_proxmox.settings.model import NetworkSettings
from talos_proxmox.settings.nodes import _is_network_or_broadcast
from talos_proxmox.settings.values import _MTU_RANGE, _Reader, _cidr, _int_in, _ip, _ip_list


def _read_network(r: _Reader, raw: Any) -> Optional[NetworkSettings]:
    s = r.section(raw, "network", ("subnet", "gateway", "nameservers", "mtu"))
    subnet = r.value(s, "subnet", "network.subnet", lambda v: ipaddress.ip_network(_cidr(v)),
                     "is not a network in CIDR form (expected e.g. 10.255.200.0/24)")
    gateway = r.value(s, "gateway", "network.gateway", _ip, "is not an IP address (expected e.g. 10.255.200.1)")
    nameservers = r.value(s, "nameservers", "network.nameservers", _ip_list,
                          "is not a non-empty list of IP addresses", default=("9.9.9.9",))
    mtu = r.value(s, "mtu", "network.mtu", _int_in(*_MTU_RANGE), f"is not an MTU in {_MTU_RANGE[0]}-{_MTU_RANGE[1]}", default=None)
    if subnet is not None and gateway is not None:
        if ipaddress.ip_address(gateway) not in subnet:
            r.fail("network.gateway", gateway, f"is outside network.subnet {subnet}")
        elif _is_network_or_broadcast(gateway, subnet):
            r.fail("network.gateway", gateway, f"is the network or broadcast address of {subnet}")
    if subnet is None or gateway is None:
        return None
    return NetworkSettings(subnet=subnet, gateway=gateway, nameservers=nameservers, mtu=mtu)
