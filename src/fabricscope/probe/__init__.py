"""Active mesh probing: wire format, plan, localization (pure); agent, traceroute, lab (edge)."""
