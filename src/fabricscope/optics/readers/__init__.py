"""Optics readers at the edge: every transceiver source becomes a :class:`FleetHistory`.

``ethtool -m`` text / ``--json`` (:mod:`.ethtool`), SONiC STATE_DB dumps (:mod:`.sonic`), and
the history table as CSV / Parquet plus failure labels (:mod:`.table`). Pure parsing of bytes
already fetched; no sockets, no DB drivers. See docs/optics-inputs.md.
"""

from fabricscope.optics.readers.ethtool import (
    ParsedModule,
    parse_ethtool_json,
    parse_ethtool_module,
    read_ethtool_files,
)
from fabricscope.optics.readers.sonic import read_sonic_state_db
from fabricscope.optics.readers.table import Labels, read_history, read_labels, write_history

__all__ = [
    "Labels",
    "ParsedModule",
    "parse_ethtool_json",
    "parse_ethtool_module",
    "read_ethtool_files",
    "read_history",
    "read_labels",
    "read_sonic_state_db",
    "write_history",
]
