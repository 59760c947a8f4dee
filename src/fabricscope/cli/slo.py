"""``fabricscope slo``: SLO windows, breach localization and rules over OTLP spans; receiver; generator."""

from __future__ import annotations

import json
import re
import signal
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import typer

from fabricscope.model.errors import ConfigError

_DUR = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|h)\s*$")
_UNIT_NS = {"ms": 10**6, "s": 10**9, "m": 60 * 10**9, "h": 3600 * 10**9}

_ANALYZE_HELP = """Windows (rate, P50/P99/P99.9, error rate, SLA attainment, token latency) per service and method, each hop's share of end-to-end latency, and the rule findings with the hop to blame.

FILES are OTLP JSON or JSON lines (the Collector's file exporter); --access-log adds access logs with a latency field. Rules (defaults, OPERATIONS.md section 7): P99 > 15 ms for 3 minutes -> breach, blamed on the slow hop (a service, a service/tool-call, or the caller->callee network), backup-model recommendation; an endpoint over 25 ms ten times -> eject for 5 minutes (recommendation); failed requests > 0.1% per minute -> alert. --rules FILE overrides them (docs/slo.md).

Examples:

  fabricscope slo generate traces.jsonl --traces 2000 --qps 10 --slow-hop tool --slow-fraction 0.3

  fabricscope slo analyze traces.jsonl --slo-ms 25 --window 1m

  fabricscope slo analyze traces.jsonl --json --db diag.duckdb
"""

_GENERATE_HELP = """Write synthetic multi-agent traces (task dispatch -> domain agent -> LLM gateway + tool agent; 10 services) as OTLP JSON lines, with one known slow hop in a fraction of the chains; the truth goes to OUT.truth.json.

Examples:

  fabricscope slo generate healthy.jsonl --traces 1000 --slow-hop none

  fabricscope slo generate slow.jsonl --traces 1000 --slow-hop any --slow-fraction 1.0 --seed 7

  fabricscope slo generate hard.jsonl --traces 500 --slow-hop tool --slowdown-ms 2,5 --parallel-tools 3 --jitter 0.5 --retry-fraction 0.2 --skew-ms 0.5
"""

_SERVE_HELP = """Receive OTLP spans (gRPC TraceService/Export and HTTP POST /v1/traces, protobuf or JSON), run the rules every --interval over the last --horizon of span time (back from the newest span received, not from the wall clock), probe --health endpoints (grpc.health.v1), print findings as they appear. Loopback by default; --token-file / --user with --password-file for credentials, --tls-cert/--tls-key for TLS. Refuses over --max-spans buffered (RESOURCE_EXHAUSTED / HTTP 429) and spans the rules cannot read (INVALID_ARGUMENT / HTTP 400). Ctrl-C or SIGTERM stops it, flushing to --out.

Examples:

  fabricscope slo serve --grpc 127.0.0.1:0 --http 127.0.0.1:0 --out spans.jsonl --duration 1
"""


def _dur_ns(text: str, what: str) -> int:
    m = _DUR.match(text)
    if m is None or float(m.group(1)) <= 0:
        raise ConfigError(f"slo: {what} {text!r} is not a duration like 500ms, 30s, 1m, 1h")
    return int(float(m.group(1)) * _UNIT_NS[m.group(2)])


def _analyze(table: Any, *, slo_ms: float, rules: Any, window_ns: int, step_ns: int) -> dict[str, Any]:
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    from fabricscope.slo.chains import analyze_chains, hop_shares
    from fabricscope.slo.rules import evaluate_rules
    from fabricscope.slo.windows import window_stats

    # the windows and the chains are independent; numpy's sorts release the GIL, so on a
    # multi-core host the two overlap (about a fifth off the analysis of 10M spans)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="slo-windows") as pool:
        fut = pool.submit(window_stats, table, window_ns=window_ns, step_ns=step_ns, slo_ms=slo_ms,
                          service_slo_ms=rules.service_slo_ms)
        ch = analyze_chains(table, slo_ns=int(slo_ms * 1e6))
        ws = fut.result()
    findings = evaluate_rules(table, ch, rules, stats=None if step_ns != int(rules.window_s * 1e9)
                              or window_ns != step_ns else ws)
    return {"spans": len(table), "traces": len(ch.e2e_ns),
            "sla_attainment": float(np.mean(ch.e2e_ns <= slo_ms * 1e6)),
            "e2e_p99_ms": float(np.quantile(ch.e2e_ns, 0.99) / 1e6), "slo_ms": slo_ms,
            "windows": ws.rows(), "hops": hop_shares(ch), "findings": findings}


def register(app: typer.Typer) -> None:
    """Add the ``slo`` command group."""
    slo = typer.Typer(help="Service SLOs for inference and agents: windows, SLA attainment, breach localization "
                      "to the slow hop, outlier and error-rate rules over OpenTelemetry spans.\n\nExamples:\n\n"
                      "  fabricscope slo generate traces.jsonl --traces 2000 --qps 10 --slow-hop tool --slow-fraction 0.3\n\n"
                      "  fabricscope slo analyze traces.jsonl --slo-ms 25 --window 1m", no_args_is_help=True)
    app.add_typer(slo, name="slo")

    @slo.command("analyze", help=_ANALYZE_HELP)
    def analyze(files: list[Path] = typer.Argument(None, help="OTLP JSON / JSON-lines span files."),
                slo_ms: float = typer.Option(25.0, "--slo-ms", help="Per-request SLO (ms) for SLA attainment."),
                rules_file: Path | None = typer.Option(None, "--rules", help="Rules YAML (docs/slo.md)."),
                window: str = typer.Option("1m", "--window", help="Window width (500ms, 30s, 1m...)."),
                step: str | None = typer.Option(None, "--step", help="Window step (default: the width)."),
                access_log: list[Path] = typer.Option(None, "--access-log", help="Access log files."),
                log_format: str = typer.Option("json", "--log-format", help="json, nginx or envoy."),
                latency_field: str = typer.Option("duration_ms", "--latency-field", help="Latency field / index."),
                latency_unit: str = typer.Option("ms", "--latency-unit", help="s, ms, us or ns."),
                as_json: bool = typer.Option(False, "--json", help="Print JSON."),
                db: Path | None = typer.Option(None, "--db", help="Add the findings to this DiagnosisStore."),
                ) -> None:
        from fabricscope.model.errors import TraceFormatError
        from fabricscope.slo.accesslog import AccessLogFormat, read_access_log
        from fabricscope.slo.otlp import concat_tables, read_spans
        from fabricscope.slo.rules import findings_json, load_rules

        win_ns = _dur_ns(window, "--window")
        step_ns = _dur_ns(step, "--step") if step else win_ns
        rules = replace(load_rules(rules_file), slo_ms=slo_ms) if rules_file is None else load_rules(rules_file)
        if rules_file is None:
            rules = replace(rules, window_s=win_ns / 1e9)
        tables = [read_spans(list(files))] if files else []
        fmt = AccessLogFormat(kind=log_format, latency_field=latency_field, latency_unit=latency_unit)
        tables += [read_access_log(p, fmt) for p in access_log or ()]
        if not tables:
            raise TraceFormatError("slo analyze: give span files or --access-log files")
        res = _analyze(concat_tables(tables), slo_ms=slo_ms, rules=rules, window_ns=win_ns, step_ns=step_ns)
        findings = res["findings"]
        if db is not None:
            from fabricscope.diagnosis.model import Observed
            from fabricscope.store.findings import DiagnosisStore

            store = DiagnosisStore(db)
            added = store.add_findings(Observed(source="slo", finding=f, reported_ns=f.window[1]) for f in findings)
            store.con.close()
            typer.echo(f"added {added} findings to {db}", err=True)
        if as_json:
            out = dict(res, findings=findings_json(findings))
            typer.echo(json.dumps(_nonan(out), indent=1))
            return
        typer.echo(f"{res['spans']} spans, {res['traces']} traces; SLA attainment {res['sla_attainment']:.2%} "
                   f"within {slo_ms:g} ms; end-to-end P99 {res['e2e_p99_ms']:.1f} ms")
        typer.echo("hop                                    kind     share  ref ms  p99 ms  blamed")
        for h in res["hops"][:12]:
            typer.echo(f"{h['hop'][:38]:38} {h['kind']:8} {h['share_of_e2e']:5.1%} {h['ref_ms']:7.2f} "
                       f"{h['p99_ms']:7.2f} {h['traces_blamed']:7}")
        if not findings:
            typer.echo("no rule fired")
        for f in findings:
            typer.echo(f"[{f.kind}] {f.subject} (score {f.score:.2f}): {f.action}")
            for e in f.evidence:
                typer.echo(f"    - {e}")

    @slo.command("generate", help=_GENERATE_HELP)
    def generate(out: Path = typer.Argument(..., help="Output OTLP JSON-lines file."),
                 traces: int = typer.Option(1000, "--traces", help="Number of traces (chains)."),
                 slow_hop: str = typer.Option("any", "--slow-hop", help="none, service, tool, network or any."),
                 slow_fraction: float = typer.Option(1.0, "--slow-fraction", help="Fraction of slow chains."),
                 qps: float = typer.Option(1000.0, "--qps", help="Chains per second."),
                 error_rate: float = typer.Option(0.0, "--error-rate", help="Fraction of chains with a failure."),
                 seed: int = typer.Option(0, "--seed", help="Random seed."),
                 slowdown: str = typer.Option("8,30", "--slowdown-ms", help="Slowdown range LOW,HIGH (ms) of a "
                                              "slow hop."),
                 jitter: float = typer.Option(0.2, "--jitter", help="Lognormal sigma of every hop's time "
                                              "(0.5-0.6: heavy tails)."),
                 parallel_tools: int = typer.Option(1, "--parallel-tools", help="Tool calls a domain agent "
                                                    "makes at once (1: one after another)."),
                 persistent_hop: str = typer.Option("", "--persistent-hop", help="A hop slow in every trace "
                                                    "through it (e.g. tool-sql/tool.sql_query)."),
                 persistent_ms: float = typer.Option(20.0, "--persistent-ms", help="Its extra time (ms)."),
                 retry_fraction: float = typer.Option(0.0, "--retry-fraction", help="Fraction of chains whose "
                                                      "tool call fails once and is retried."),
                 skew_ms: float = typer.Option(0.0, "--skew-ms", help="Clock skew between services (ms)."),
                 ) -> None:
        from fabricscope.twin.agent_traces import SLOW_KINDS, AgentTraceConfig, write_agent_traces

        if slow_hop not in ("none", "any", *SLOW_KINDS):
            raise ConfigError(f"slo generate: --slow-hop {slow_hop!r} is not none, any, {', '.join(SLOW_KINDS)}")
        try:
            lo, hi = (float(x) for x in slowdown.split(","))
        except ValueError:
            raise ConfigError(f"slo generate: --slowdown-ms {slowdown!r} is not LOW,HIGH in ms (e.g. 2,5)") from None
        cfg = AgentTraceConfig(n_traces=traces, qps=qps, error_rate=error_rate,
                               slow_fraction=0.0 if slow_hop == "none" else slow_fraction,
                               slow_kinds=SLOW_KINDS if slow_hop in ("any", "none") else (slow_hop,),
                               slowdown_ms=(lo, hi), jitter=jitter, parallel_tools=parallel_tools,
                               persistent_hop=persistent_hop, persistent_ms=persistent_ms if persistent_hop else 0.0,
                               retry_fraction=retry_fraction, skew_ms=skew_ms)
        truth = write_agent_traces(out, cfg, seed=seed)
        typer.echo(f"wrote {len(truth)} traces ({sum(1 for t in truth if t.kind)} with a slow hop) to {out}; "
                   f"truth in {out}.truth.json")

    @slo.command("serve", help=_SERVE_HELP)
    def serve(grpc_addr: str | None = typer.Option("127.0.0.1:4317", "--grpc", help="gRPC listen address."),
              http_addr: str | None = typer.Option("127.0.0.1:4318", "--http", help="HTTP listen address."),
              rules_file: Path | None = typer.Option(None, "--rules", help="Rules YAML."),
              health: list[str] = typer.Option(None, "--health", help="host:port to probe."),
              out: Path | None = typer.Option(None, "--out", help="Append received spans here (JSON lines)."),
              interval: str = typer.Option("10s", "--interval", help="Rule and probe interval."),
              horizon: str = typer.Option("10m", "--horizon", help="Span time the rules look at, back from the "
                                          "newest span received."),
              max_spans: int = typer.Option(200_000, "--max-spans", help="Buffered-span cap (also the cap on "
                                            "spans kept for the rules)."),
              token_file: Path | None = typer.Option(None, "--token-file", help="File holding a bearer token."),
              user: str | None = typer.Option(None, "--user", help="Basic-auth user name."),
              password_file: Path | None = typer.Option(None, "--password-file", help="File holding the password."),
              tls_cert: Path | None = typer.Option(None, "--tls-cert", help="Server certificate (PEM)."),
              tls_key: Path | None = typer.Option(None, "--tls-key", help="Server key (PEM)."),
              slo_ms: float = typer.Option(25.0, "--slo-ms", help="Per-request SLO (ms)."),
              duration: float = typer.Option(0.0, "--duration", help="Stop after this many seconds (0: run)."),
              ) -> None:
        import logging
        from collections import deque

        from fabricscope.model.errors import FabricscopeError
        from fabricscope.service.otlp_receiver import JsonlSink, OtlpReceiver, ReceiverAuth
        from fabricscope.slo.health import probe_all
        from fabricscope.slo.otlp import SpanTable, concat_tables, spans_from_batches
        from fabricscope.slo.rules import load_rules
        from fabricscope.telemetry.target import TLSFiles

        rules = replace(load_rules(rules_file), slo_ms=slo_ms) if rules_file is None else load_rules(rules_file)
        iv_s = _dur_ns(interval, "--interval") / 1e9
        horizon_ns = _dur_ns(horizon, "--horizon")
        if max_spans <= 0:
            raise ConfigError(f"slo serve: --max-spans {max_spans} must be > 0")
        grpc_addr, http_addr = _listen(grpc_addr, "--grpc"), _listen(http_addr, "--http")
        if grpc_addr is None and http_addr is None:
            raise ConfigError("slo serve: --grpc and --http are both off; nothing would receive spans")
        if (user is None) != (password_file is None):
            raise ConfigError("slo serve: --user and --password-file go together")
        auth = None
        if token_file or user:
            auth = ReceiverAuth(token=_secret(token_file, "--token-file") if token_file else None, username=user,
                                password=_secret(password_file, "--password-file") if password_file else None)
        tls = None
        if tls_cert or tls_key:
            if not (tls_cert and tls_key):
                raise ConfigError("slo serve: --tls-cert and --tls-key go together")
            tls = TLSFiles(cert_pem=tls_cert.read_bytes(), key_pem=tls_key.read_bytes())
            tls.check(f"slo serve: --tls-cert {tls_cert} / --tls-key {tls_key}")
        # failed logins, refused batches and sink errors are logged by the receiver: one line each on stderr
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        # The rules' windows are in span time, so the horizon is too: the rules see the traces that end
        # within --horizon of the newest span end received (not of the wall clock, which would keep a
        # replay of hours of old spans whole, or drop the spans of a sender whose clock is off).
        # Tables are decoded once on arrival; a whole table past the horizon is dropped, and the kept
        # spans are capped at --max-spans (oldest first), so memory is bounded either way.
        recent: deque[tuple[int, SpanTable]] = deque()
        kept = {"spans": 0, "newest_ns": 0, "dropped": 0, "outside": 0}
        lock = threading.Lock()
        file_sink = JsonlSink(out) if out else None

        def sink(batches: list[dict[str, Any]]) -> None:
            if file_sink is not None:
                file_sink(batches)
            table = spans_from_batches(batches, source="receiver")
            if len(table) == 0:
                return
            end = int(table.end_ns.max())
            with lock:
                recent.append((end, table))
                kept["spans"] += len(table)
                kept["newest_ns"] = max(kept["newest_ns"], end)
                while recent and (recent[0][0] < kept["newest_ns"] - horizon_ns or kept["spans"] > max_spans):
                    n = len(recent.popleft()[1])
                    kept["spans"] -= n
                    kept["dropped"] += n

        rx = OtlpReceiver(sink, grpc_address=grpc_addr, http_address=http_addr,
                          max_buffered_spans=max_spans, auth=auth, tls=tls, validate=_validate_spans)
        stop = threading.Event()
        code = {"rc": 0}

        def on_signal(signum: int, _frame: Any) -> None:
            code["rc"] = 130 if signum == signal.SIGINT else 143
            stop.set()

        if threading.current_thread() is threading.main_thread():  # before the ports are announced
            signal.signal(signal.SIGINT, on_signal)
            signal.signal(signal.SIGTERM, on_signal)
        rx.start()  # its security warnings (no auth / no TLS off loopback) go to the log on stderr
        typer.echo(f"OTLP receiver: gRPC port {rx.grpc_port or '-'}, HTTP port {rx.http_port or '-'}", err=True)
        seen: dict[tuple[str, str, int], int] = {}
        live: dict[str, str] = {}
        t_end = time.monotonic() + duration if duration > 0 else float("inf")
        try:
            while not stop.is_set() and time.monotonic() < t_end:
                stop.wait(min(iv_s, max(0.0, t_end - time.monotonic())))
                if stop.is_set():
                    break
                try:
                    rx.flush()
                except FabricscopeError as exc:  # a batch the validator let through but the sink refused
                    typer.echo(f"warning: slo serve: dropped a batch: {exc}", err=True)
                for p in probe_all(list(health or ()), timeout_s=min(1.0, iv_s)):
                    if live.get(p.endpoint) != p.status:
                        live[p.endpoint] = p.status
                        typer.echo(f"health {p.endpoint}: {p.status}{f' ({p.error})' if p.error else ''}")
                with lock:
                    tables = [tb for _, tb in recent]
                    newest = kept["newest_ns"]
                if not tables:
                    continue
                table, outside = _within(concat_tables(tables), newest - horizon_ns)
                kept["outside"] = outside
                if len(table) == 0:
                    continue
                res = _analyze(table, slo_ms=slo_ms, rules=rules, window_ns=int(rules.window_s * 1e9),
                               step_ns=int(rules.window_s * 1e9))
                for f in res["findings"]:
                    key = (f.kind, f.subject, f.window[0])
                    if key not in seen:
                        seen[key] = f.window[1]
                        typer.echo(f"[{f.kind}] {f.subject}: {f.action}; " + "; ".join(f.evidence[:2]))
                        sys.stdout.flush()
                for k in [k for k, w1 in seen.items() if w1 < newest - 2 * horizon_ns]:
                    del seen[k]  # bounded: a finding that left the horizon cannot be reported again
        finally:
            st = rx.stop(deadline_s=5.0)
            typer.echo(f"stopped: {st.spans_accepted} spans accepted, {st.spans_refused} refused, "
                       f"{st.spans_flushed} flushed, {st.bad_requests} bad requests, {st.auth_failures} failed "
                       f"logins; {kept['dropped'] + kept['outside']} spans left out of the rules (older than the horizon)",
                       err=True)
        if code["rc"]:
            sys.exit(code["rc"])


def _within(table: Any, cutoff_ns: int) -> tuple[Any, int]:
    """The spans of the traces that end at or after ``cutoff_ns`` (whole traces, so no hop loses its
    children at the edge), and how many spans were left out."""
    import numpy as np

    if len(table) == 0:
        return table, 0
    _, inv = np.unique(table.trace_id, return_inverse=True)
    t_end = np.full(int(inv.max()) + 1, np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(t_end, inv, table.end_ns)
    keep = t_end[inv] >= cutoff_ns
    if keep.all():
        return table, 0
    cols = ("trace_id", "span_id", "parent_id", "service", "name", "kind", "start_ns", "end_ns", "status",
            "endpoint", "out_tokens", "ttft_ns")
    return replace(table, **{c: getattr(table, c)[keep] for c in cols}), int((~keep).sum())


def _listen(addr: str | None, flag: str) -> str | None:
    """A ``host:port`` listen address checked (gRPC would silently bind port 99999 as 34463); ``""``: off."""
    if not addr:
        return None
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"slo serve: {flag} {addr!r} is not host:port with a port in 0..65535 ('' turns it off)")
    return addr


def _secret(path: Path, flag: str) -> str:
    """A credentials file's content, stripped; an empty file is a ConfigError naming the flag."""
    text = path.read_text(encoding="utf-8").strip()
    if not text:
        raise ConfigError(f"slo serve: {flag} {path}: the file is empty")
    return text


def _validate_spans(doc: dict[str, Any]) -> None:
    """Decode one export request the way the rules will (raises TraceFormatError naming the bad span)."""
    from fabricscope.slo.otlp import spans_from_batches

    spans_from_batches([doc], source="request")


def _nonan(x: Any) -> Any:
    if isinstance(x, float):
        return None if x != x else x
    if isinstance(x, dict):
        return {k: _nonan(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_nonan(v) for v in x]
    return x
