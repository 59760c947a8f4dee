"""The fabric model: inventory, builders, routing (paths, ECMP hashing)."""

from fabricscope.fabric.builders import fat_tree_fabric, leaf_spine_fabric
from fabricscope.fabric.hashing import HashConfig, hash_key
from fabricscope.fabric.inventory import (
    Device,
    Fabric,
    FabricIndex,
    Link,
    Port,
    directed_link_id,
    link_id,
    port_device,
)
from fabricscope.fabric.routing import Routing

__all__ = [
    "Device",
    "Fabric",
    "FabricIndex",
    "HashConfig",
    "Link",
    "Port",
    "Routing",
    "directed_link_id",
    "fat_tree_fabric",
    "hash_key",
    "leaf_spine_fabric",
    "link_id",
    "port_device",
]
