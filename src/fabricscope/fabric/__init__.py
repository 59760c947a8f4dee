"""The fabric model: inventory, builders, routing (paths, ECMP hashing)."""

from fabricscope.fabric.builders import (
    dual_tor_fabric,
    fat_tree_fabric,
    leaf_spine_fabric,
    multi_plane_fabric,
    rail_optimized_fabric,
)
from fabricscope.fabric.catalog import BUILDERS, build_fabric
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
from fabricscope.fabric.io import fabric_from_dict, fabric_to_dict, read_fabric, write_fabric
from fabricscope.fabric.routing import PathTable, Routing, SprayTable
from fabricscope.fabric.summary import summarize

__all__ = [
    "BUILDERS",
    "Device",
    "Fabric",
    "FabricIndex",
    "HashConfig",
    "Link",
    "PathTable",
    "Port",
    "Routing",
    "SprayTable",
    "build_fabric",
    "directed_link_id",
    "dual_tor_fabric",
    "fabric_from_dict",
    "fabric_to_dict",
    "fat_tree_fabric",
    "hash_key",
    "leaf_spine_fabric",
    "link_id",
    "multi_plane_fabric",
    "port_device",
    "rail_optimized_fabric",
    "read_fabric",
    "summarize",
    "write_fabric",
]
