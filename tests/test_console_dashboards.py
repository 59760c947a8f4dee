"""The Grafana dashboards shipped with the console: well-formed, and every metric a panel
queries exists in the console's exposition (a panel querying a metric that does not exist
fails here), and every query is valid PromQL (promtool, when installed)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fabricscope.service.console.metrics import render_metrics
from test_console_prometheus import EXTRA, FakeSink, populated_state

DASHBOARDS = Path(str(resources.files("fabricscope.api") / "dashboards"))
EXPECTED = {"fabric-health.json", "telemetry.json", "probing.json", "stragglers.json",
            "optics.json", "console.json"}

# PromQL words that are not metric names (functions are recognised by the "(" after them)
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset",
            "and", "or", "unless", "atan2", "inf", "nan", "start", "end"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (a small tokenizer, not a parser):
    strings, label matchers ``{...}``, ranges ``[5m]``, grouping clauses ``by (...)``,
    Grafana variables and numbers are dropped; an identifier followed by ``(`` is a
    function; ``label_values(metric, label)`` keeps its metric."""
    s = re.sub(r"label_values\(\s*([A-Za-z_:][\w:]*)\s*(,[^)]*)?\)", r" \1 ", expr)
    s = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', " ", s)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    s = re.sub(r"\$\{[^}]*\}|\$\w+", " ", s)
    s = re.sub(r"\boffset\s+-?\w+", " ", s)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][\w:]*", s):
        word = m.group(0)
        if word.lower() in KEYWORDS:
            continue
        if re.match(r"\s*\(", s[m.end():]):
            continue  # a function or aggregation
        if m.start() > 0 and (s[m.start() - 1].isdigit() or s[m.start() - 1] == "."):
            continue  # the exponent or unit of a number (1e3)
        names.add(word)
    return names


def load() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def exprs(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, expr) for every panel target and every query variable."""
    out = [(f"panel {p.get('title')!r} target {t.get('refId')}", t["expr"])
           for p in doc["panels"] for t in p.get("targets", ())]
    for v in doc.get("templating", {}).get("list", ()):
        if v.get("type") == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            out.append((f"variable {v['name']}", q))
    return out


def exposed_names() -> set[str]:
    body = render_metrics(populated_state(), EXTRA, sinks=[FakeSink("alertmanager", 1, 0, 0)])
    return {s.name for f in text_string_to_metric_families(body.decode()) for s in f.samples}


def test_the_tokenizer_finds_metrics_and_only_metrics() -> None:
    assert metric_names('sum by (kind) (rate(fabricscope_findings_total{source="telemetry", '
                        'job=~"$job"}[$__rate_interval]))') == {"fabricscope_findings_total"}
    assert metric_names("topk(20, a_metric) / on(job) group_left(x) b_metric > 1.1e3") == \
        {"a_metric", "b_metric"}
    assert metric_names("sum(x offset 5m) or vector(0)") == {"x"}
    assert metric_names("label_values(fabricscope_console_uptime_seconds, job)") == \
        {"fabricscope_console_uptime_seconds"}
    assert metric_names('count(y{a="by (z)"} > bool 2) without (instance)') == {"y"}


def test_the_dashboards_are_all_there_and_well_formed() -> None:
    docs = load()
    assert set(docs) == EXPECTED  # collectives: not built yet (docs/console-metrics.md)
    uids = set()
    for name, doc in docs.items():
        assert doc["uid"] and doc["uid"] not in uids and len(doc["uid"]) <= 40, name
        uids.add(doc["uid"])
        assert doc["title"].startswith("fabricscope / "), name
        assert doc["schemaVersion"] >= 36, name
        ds = [v for v in doc["templating"]["list"] if v["name"] == "DS_PROMETHEUS"]
        assert ds and ds[0]["type"] == "datasource" and ds[0]["query"] == "prometheus", name
        assert doc["panels"], name
        ids = [p["id"] for p in doc["panels"]]
        assert len(ids) == len(set(ids)), name
        for p in doc["panels"]:
            where = f"{name}: panel {p.get('title')!r}"
            g = p["gridPos"]
            assert {"h", "w", "x", "y"} <= set(g) and g["x"] + g["w"] <= 24, where
            assert p["datasource"]["uid"] == "${DS_PROMETHEUS}", where
            assert p["targets"], where
            for t in p["targets"]:
                assert t["datasource"]["uid"] == "${DS_PROMETHEUS}" and t["refId"], where
                assert metric_names(t["expr"]), f"{where}: selects no metric"
        # panels do not overlap
        cells = set()
        for p in doc["panels"]:
            g = p["gridPos"]
            for x in range(g["x"], g["x"] + g["w"]):
                for y in range(g["y"], g["y"] + g["h"]):
                    assert (x, y) not in cells, f"{name}: panel {p['title']!r} overlaps"
                    cells.add((x, y))


def test_every_queried_metric_exists_in_the_exposition() -> None:
    have = exposed_names()
    missing = [f"{name}: {where}: {m}" for name, doc in load().items()
               for where, expr in exprs(doc) for m in sorted(metric_names(expr))
               if m not in have]
    assert not missing, "dashboards query metrics the console does not expose:\n" + \
        "\n".join(missing)
    # and the check would catch one that does not exist
    assert "fabricscope_incidents_openn" not in have


def test_every_query_is_valid_promql(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed: apt-get install prometheus")
    rules = []
    for name, doc in load().items():
        for k, (_, expr) in enumerate(exprs(doc)):
            if expr.startswith("label_values("):
                continue  # a Grafana variable query, not PromQL
            q = expr.replace("$__rate_interval", "1m").replace("$job", ".*")
            rules.append({"record": f"dash:{name.removesuffix('.json').replace('-', '_')}:{k}",
                          "expr": q})
    f = tmp_path / "rules.yml"
    f.write_text(json.dumps({"groups": [{"name": "dashboards", "rules": rules}]}))
    r = subprocess.run([promtool, "check", "rules", str(f)], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{len(rules)} rules found" in r.stdout
