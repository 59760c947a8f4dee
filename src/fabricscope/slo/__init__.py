"""Service SLOs for inference and agents: OTLP spans / access logs -> windows, chains, rules, findings."""

from fabricscope.slo.accesslog import AccessLogFormat, read_access_log
from fabricscope.slo.chains import Chains, analyze_chains, hop_shares
from fabricscope.slo.otlp import (
           SpanTable,
           concat_tables,
           parse_otlp_json,
           read_spans,
           spans_from_batches,
)
from fabricscope.slo.rules import RuleConfig, evaluate_rules, findings_json, load_rules
from fabricscope.slo.windows import WindowStats, window_stats

__all__ = ["AccessLogFormat", "Chains", "RuleConfig", "SpanTable", "WindowStats", "analyze_chains",
           "concat_tables", "evaluate_rules", "findings_json", "hop_shares", "load_rules", "parse_otlp_json",
           "read_access_log", "read_spans", "spans_from_batches", "window_stats"]
