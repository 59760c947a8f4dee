"""``fabricscope optics``: grade transceivers, predict failures, train, make a synthetic fleet, plot."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import typer

_DAY_NS = 86_400 * 10**9
_DUR = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(d|h|m|s)\s*$")
_UNIT_NS = {"d": _DAY_NS, "h": 3_600 * 10**9, "m": 60 * 10**9, "s": 10**9}

_GRADE_HELP = """Grade every transceiver lane now, with reason codes and the action to take.

INPUT is any mix of: `ethtool -m` outputs (text or `--json`; name them DEVICE__PORT.txt or start them with a `# device=.. port=..` line), SONiC STATE_DB dumps (JSON with TRANSCEIVER_* tables), and history tables (.csv / .parquet with the columns of docs/optics-inputs.md). Grades: good, moderate, needs-attention, bad (and no-data). Reasons such as rx-power-low-margin, bias-drift, tx-power-fading, connector-loss, lane-imbalance, thermal, switch-airflow, fec-margin, crc-rising; actions such as clean both connector ends, replace the patch cord, replace the module, check the switch fan. Bad input is warned (file and position) and the rest graded.

Examples:

  fabricscope optics twin fleet/ --modules 300 --days 14

  fabricscope optics grade fleet/history.parquet --links fleet/links.csv

  fabricscope optics grade fleet/history.parquet --json --out grades.json

  fabricscope optics grade fleet/history.parquet --links fleet/links.csv --stream
"""

_PREDICT_HELP = """Predict which modules fail within the horizon, with a calibrated risk (0-1), the grade, the reasons and the action.

HISTORY is a history table (or any input `optics grade` takes). The model is the shipped default (trained on synthetic fleets of fabricscope's own generator) unless --model names one from `optics train`.

Examples:

  fabricscope optics twin fleet/ --modules 300 --days 14

  fabricscope optics predict fleet/history.parquet --links fleet/links.csv --top 10

  fabricscope optics predict fleet/history.parquet --horizon 7d --at 2025-01-12T00:00:00Z --json

  fabricscope optics predict fleet/history.parquet --links fleet/links.csv --stream --top 10
"""

_TRAIN_HELP = """Train the failure predictor on your own history and failure labels (an RMA / ticket export: device, port, serial, failure time, optional cause).

Examples:

  fabricscope optics twin fleet/ --modules 300 --days 14 --seed 3

  fabricscope optics train fleet/history.parquet --labels fleet/labels.csv --links fleet/links.csv -o my-model.json

  fabricscope optics predict fleet/history.parquet --model my-model.json --top 5
"""

_TWIN_HELP = """Write a synthetic fleet: history.parquet (the history table), labels.csv (failures), truth.json (each module's mode, onset and failure) and links.csv (the cabling).

Degradation modes: aging laser, dirty connector, bent fiber, hot module / switch airflow, FEC degradation, sudden death; nuisances: vendor offsets, diurnal temperature, reseats, modules parked near a threshold, gaps, duplicates, counter resets (docs/design/optics-fleet.md).

Examples:

  fabricscope optics twin fleet/ --modules 300 --days 14

  fabricscope optics twin big/ --modules 1500 --days 21 --sample-s 600 --seed 7
"""

_PLOT_HELP = """Plot every lane of one module over time (rx / tx power, bias, temperature, with its thresholds).

Examples:

  fabricscope optics twin fleet/ --modules 300 --days 14

  fabricscope optics plot fleet/history.parquet --module leaf-000:Ethernet0 -o module.png
"""


def parse_duration(text: str, flag: str) -> int:
    """``7d``, ``12h``, ``30m``, ``45s`` -> ns."""
    from fabricscope.model.errors import ConfigError

    m = _DUR.match(text)
    if not m or float(m.group(1)) <= 0:
        raise ConfigError(f"{flag}: {text!r}: expected a duration like 7d, 36h or 30m")
    return int(float(m.group(1)) * _UNIT_NS[m.group(2)])


def _at_arg(text: str | None) -> int | None:
    """``--at`` checked before any input is read."""
    from fabricscope.model.errors import ConfigError
    from fabricscope.optics.readers.ethtool import parse_ts

    if text is None:
        return None
    try:
        return parse_ts(text)
    except ValueError:
        raise ConfigError(f"--at: {text!r}: expected ns since the epoch or ISO-8601 "
                          "(2025-01-12T00:00:00Z)") from None


def _at(given: int | None, history: Any) -> int:
    from fabricscope.model.errors import ConfigError

    if len(history) == 0:
        raise ConfigError("optics: the inputs hold no readings (nothing to grade)")
    return int(history.ts.max()) if given is None else given


def _read(inputs: list[Path], ts: int) -> Any:
    from fabricscope.optics.readers.inputs import read_inputs

    t0 = time.perf_counter()
    h = read_inputs(inputs, ts_ns=ts)
    print(f"read {len(h):,} lane samples of {len(h.modules):,} modules from {len(inputs)} "
          f"file(s) in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    for w in h.warnings[:20]:
        print(f"warning: {w}", file=sys.stderr)
    if len(h.warnings) > 20:
        print(f"warning: ... and {len(h.warnings) - 20} more", file=sys.stderr)
    return h


#: a single Parquet history at least this large is graded / predicted streamed by default
STREAM_BYTES = 1 << 30
#: worker processes of a streamed run (the reading stays in the main one)
STREAM_WORKERS = 2


def _use_stream(inputs: list[Path], stream: bool | None) -> bool:
    """Stream when asked, or by default for one Parquet history of >= STREAM_BYTES."""
    from fabricscope.model.errors import ConfigError

    parquet = len(inputs) == 1 and inputs[0].suffix.lower() in (".parquet", ".pq", ".parq")
    if stream and not parquet:
        raise ConfigError(f"--stream: needs exactly one Parquet history table, got "
                          f"{', '.join(str(i) for i in inputs)}")
    if stream is not None:
        return stream
    try:
        return parquet and inputs[0].stat().st_size >= STREAM_BYTES
    except OSError:
        return False


def _progress() -> Any:
    t0 = time.perf_counter()
    shown = [-1]

    def show(done: int, total: int) -> None:
        pct = int(100 * done / max(total, 1))
        if pct // 10 > shown[0] or done >= total:
            shown[0] = pct // 10
            print(f"streamed {done:,} of {total:,} rows ({pct} %) in "
                  f"{time.perf_counter() - t0:.1f} s", file=sys.stderr)

    return show


def _streamed(path: Path, at_given: int | None, peers: dict[str, str] | None,
              explicit: bool) -> Any:
    """Features of ``path`` read in chunks (None where an auto-chosen stream is impossible)."""
    from fabricscope.optics.readers.table import UnorderedHistoryError
    from fabricscope.optics.stream import stream_features

    try:
        sf = stream_features(str(path), at_ns=at_given, peers=peers, progress=_progress(),
                             workers=STREAM_WORKERS)
    except UnorderedHistoryError as exc:
        if explicit:
            raise
        print(f"warning: {exc}; reading it whole instead", file=sys.stderr)
        return None
    print(f"streamed {sf.rows:,} lane samples of {len(sf.history.modules):,} modules in "
          f"{sf.seconds:.1f} s", file=sys.stderr)
    for w in sf.history.warnings[:20]:
        print(f"warning: {w}", file=sys.stderr)
    if len(sf.history.warnings) > 20:
        print(f"warning: ... and {len(sf.history.warnings) - 20} more", file=sys.stderr)
    return sf


def _peers(links: Path | None, inventory: Path | None) -> dict[str, str] | None:
    if links is None and inventory is None:
        return None
    peers: dict[str, str] = {}
    if links is not None:
        from fabricscope.optics.readers.links import read_links

        got, warns = read_links(links)
        peers.update(got)
        for w in warns:
            print(f"warning: {w}", file=sys.stderr)
    if inventory is not None:
        from fabricscope.fabric.io import read_fabric

        peers.update(read_fabric(inventory).peer_port)
    return peers


def _print_modules(mods: list[dict[str, Any]], summary: dict[str, Any], *, top: int,
                   risk: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=170)
    order = {"bad": 0, "needs-attention": 1, "moderate": 2, "good": 3, "no-data": 4}
    if risk:
        mods = sorted(mods, key=lambda m: -(m.get("risk") or 0.0))
    else:
        mods = sorted(mods, key=lambda m: (order.get(m["grade"], 5), -(m.get("score") or 0.0)))
    shown = [m for m in mods if risk or m["grade"] not in ("good", "no-data")][:top]
    t = Table(title=f"{'Highest failure risk' if risk else 'Modules that need attention'} "
                    f"({len(shown)} of {len(mods)})", title_justify="left")
    cols = ["module", "serial", "part", "grade"] + (["risk", "fails?", "eta d"] if risk else [])
    for c in [*cols, "reasons", "action"]:
        t.add_column(c, justify="right" if c in ("risk", "eta d") else "left")
    for m in shown:
        reasons = ", ".join(r["code"] if isinstance(r, dict) else str(r) for r in m.get("reasons", []))
        cells = [f"{m['device']}:{m['port']}", m.get("serial", ""), m.get("part_number", ""),
                 m["grade"]]
        if risk:
            eta = m.get("eta_days")
            cells += [f"{m['risk']:.2f}", "yes" if m.get("predicted_failure") else "no",
                      f"{eta:.1f}" if isinstance(eta, (int, float)) else "-"]
        cells += [reasons or "-", m.get("action") or "-"]
        t.add_row(*cells)
    console.print(t)
    grades = summary.get("grades", {})
    console.print("grades: " + ", ".join(f"{k} {v}" for k, v in grades.items()))


def register(app: typer.Typer) -> None:
    """Add the ``optics`` command group."""
    optics = typer.Typer(
        help="Optics health: grade every transceiver lane with reasons, predict failures days "
        "ahead, train on your own history, make a synthetic fleet.\n\nExamples:\n\n"
        "  fabricscope optics twin fleet/ --modules 300 --days 14\n\n"
        "  fabricscope optics predict fleet/history.parquet --top 10",
        no_args_is_help=True,
    )
    app.add_typer(optics, name="optics")

    @optics.command("grade", help=_GRADE_HELP)
    def grade(
        inputs: list[Path] = typer.Argument(..., metavar="INPUT", help="ethtool -m outputs, SONiC dumps, history tables."),
        at: str | None = typer.Option(None, "--at", help="Grade as of this time (ISO-8601 or ns; default: the last sample)."),
        ts: str | None = typer.Option(None, "--ts", help="Sample time of snapshot inputs that carry none (default: now)."),
        links: Path | None = typer.Option(None, "--links", help="Cabling CSV (device_a,port_a,device_b,port_b) for per-direction link loss."),
        inventory: Path | None = typer.Option(None, "--inventory", help="Fabric inventory whose cables give the peers."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object per module plus the fleet summary."),
        out: Path | None = typer.Option(None, "--out", "-o", help="Also write the JSON to this file."),
        top: int = typer.Option(30, "--top", help="Rows in the table."),
        stream: bool | None = typer.Option(None, "--stream/--no-stream", help="Read one Parquet history in chunks of whole modules (bounded memory; default: on for files of 1 GiB or more)."),
    ) -> None:
        from fabricscope.cli._outputs import check_output_file
        from fabricscope.optics.grade import grade_fleet

        if out is not None:
            check_output_file(out, flag="--out", suffixes=(".json",))
        snap = _snapshot_ts(ts)
        at_given = _at_arg(at)
        peers = _peers(links, inventory)
        sf = (_streamed(inputs[0], at_given, peers, stream is True)
              if _use_stream(inputs, stream) else None)
        if sf is not None:
            g = grade_fleet(sf.history, at_ns=sf.features.at_ns, peers=peers,
                            features=sf.features)
        else:
            h = _read(inputs, snap)
            at_ns = _at(at_given, h)
            g = grade_fleet(h, at_ns=at_ns, peers=peers)
        doc = g.to_json()
        if out is not None:
            out.write_text(json.dumps(doc, indent=1, default=str) + "\n", encoding="utf-8")
        if as_json:
            print(json.dumps(doc, indent=1, default=str))
        else:
            _print_modules(doc["modules"], doc["summary"], top=top, risk=False)

    @optics.command("predict", help=_PREDICT_HELP)
    def predict(
        inputs: list[Path] = typer.Argument(..., metavar="HISTORY", help="History table(s) or other optics inputs."),
        horizon: str = typer.Option("7d", "--horizon", help="Failure horizon (the model's own; another value is refused)."),
        at: str | None = typer.Option(None, "--at", help="Predict as of this time (ISO-8601 or ns; default: the last sample)."),
        model_file: Path | None = typer.Option(None, "--model", help="A model from `optics train` (default: the shipped one)."),
        links: Path | None = typer.Option(None, "--links", help="Cabling CSV for per-direction link loss."),
        inventory: Path | None = typer.Option(None, "--inventory", help="Fabric inventory whose cables give the peers."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object per module plus the fleet summary."),
        out: Path | None = typer.Option(None, "--out", "-o", help="Also write the JSON to this file."),
        top: int = typer.Option(20, "--top", help="Rows in the table (highest risk first)."),
        stream: bool | None = typer.Option(None, "--stream/--no-stream", help="Read one Parquet history in chunks of whole modules (bounded memory; default: on for files of 1 GiB or more)."),
    ) -> None:
        from fabricscope.cli._outputs import check_output_file
        from fabricscope.model.errors import ConfigError

        if out is not None:
            check_output_file(out, flag="--out", suffixes=(".json",))
        horizon_ns = parse_duration(horizon, "--horizon")
        at_given = _at_arg(at)
        from fabricscope.optics.predict import Model, default_model, predict_fleet

        model = Model.load(model_file) if model_file is not None else default_model()
        if horizon_ns != model.horizon_ns:
            raise ConfigError(
                f"--horizon {horizon}: the model predicts failures within "
                f"{model.horizon_ns / _DAY_NS:g} days; train one for this horizon with "
                "`optics train --horizon`")
        peers = _peers(links, inventory)
        sf = (_streamed(inputs[0], at_given, peers, stream is True)
              if _use_stream(inputs, stream) else None)
        t0 = time.perf_counter()
        if sf is not None:
            from fabricscope.optics.grade import grade_fleet

            h = sf.history
            at_ns = sf.features.at_ns
            gr = grade_fleet(h, at_ns=at_ns, peers=peers, features=sf.features)
            pred = predict_fleet(h, model, at_ns=at_ns, peers=peers, grades=gr)
        else:
            h = _read(inputs, _snapshot_ts(None))
            at_ns = _at(at_given, h)
            t0 = time.perf_counter()
            pred = predict_fleet(h, model, at_ns=at_ns, peers=peers)
        doc = pred.to_json()
        print(f"graded and predicted {len(h.modules):,} modules in {time.perf_counter() - t0:.1f} s",
              file=sys.stderr)
        if out is not None:
            out.write_text(json.dumps(doc, indent=1, default=str) + "\n", encoding="utf-8")
        if as_json:
            print(json.dumps(doc, indent=1, default=str))
        else:
            _print_modules(doc["modules"], doc["summary"], top=top, risk=True)

    @optics.command("train", help=_TRAIN_HELP)
    def train(
        inputs: list[Path] = typer.Argument(..., metavar="HISTORY", help="History table(s)."),
        labels: Path = typer.Option(..., "--labels", help="Failure labels CSV (device, port, serial, failure time, cause)."),
        out: Path = typer.Option(..., "--out", "-o", help="Model file to write (.json)."),
        horizon: str = typer.Option("7d", "--horizon", help="Predict failures within this horizon."),
        links: Path | None = typer.Option(None, "--links", help="Cabling CSV for per-direction link loss."),
        inventory: Path | None = typer.Option(None, "--inventory", help="Fabric inventory whose cables give the peers."),
        seed: int = typer.Option(0, "--seed", help="Seed of the learner."),
    ) -> None:
        from fabricscope.cli._outputs import check_output_file
        from fabricscope.model.errors import ConfigError
        from fabricscope.optics.predict import train as train_model
        from fabricscope.optics.predict import training_examples
        from fabricscope.optics.readers.table import read_labels

        check_output_file(out, flag="--out", suffixes=(".json",))
        horizon_ns = parse_duration(horizon, "--horizon")
        h = _read(inputs, _snapshot_ts(None))
        lab = read_labels(labels)
        for w in lab.warnings[:20]:
            print(f"warning: {w}", file=sys.stderr)
        if len(lab) == 0:
            raise ConfigError(f"--labels {labels}: no failures in the labels: nothing to learn from")
        t0 = time.perf_counter()
        ex = training_examples(h, lab, horizon_ns=horizon_ns, peers=_peers(links, inventory))
        model = train_model([ex], seed=seed, horizon_ns=horizon_ns)
        model.save(out)
        print(f"trained on {len(h.modules):,} modules and {len(lab):,} failures in "
              f"{time.perf_counter() - t0:.1f} s; wrote {out}", file=sys.stderr)

    @optics.command("twin", help=_TWIN_HELP)
    def twin(
        out: Path = typer.Argument(..., metavar="OUT", help="Folder to write the fleet into."),
        modules: int = typer.Option(1500, "--modules", help="Transceivers in the fleet."),
        days: float = typer.Option(21.0, "--days", help="Days of history."),
        sample_s: int = typer.Option(600, "--sample-s", help="Seconds between samples."),
        seed: int = typer.Option(0, "--seed", help="Seed (same seed, same fleet)."),
        force: bool = typer.Option(False, "--force", help="Write into a folder that holds an earlier fleet."),
    ) -> None:
        from fabricscope.cli._outputs import check_output_dir
        from fabricscope.twin.optics_fleet import FleetConfig, write_fleet

        check_output_dir(out, flag="OUT", marker="truth.json", force=force)
        cfg = FleetConfig(modules=modules, days=days, sample_s=sample_s)
        t0 = time.perf_counter()
        files = write_fleet(cfg, out, seed=seed)
        print(f"wrote {files.history}, {files.labels}, {files.truth}, {files.links} in "
              f"{time.perf_counter() - t0:.1f} s")

    @optics.command("plot", help=_PLOT_HELP)
    def plot(
        inputs: list[Path] = typer.Argument(..., metavar="HISTORY", help="History table(s) or other optics inputs."),
        module: str = typer.Option(..., "--module", "-m", help="DEVICE:PORT of the module."),
        out: Path = typer.Option(..., "--out", "-o", help="PNG file to write."),
    ) -> None:
        from fabricscope.cli._outputs import check_output_file
        from fabricscope.optics.plot import plot_module

        check_output_file(out, flag="--out", suffixes=(".png", ".svg"))
        h = _read(inputs, _snapshot_ts(None))
        print(f"wrote {plot_module(h, module, out)}")


def _snapshot_ts(text: str | None) -> int:
    from fabricscope.model.errors import ConfigError
    from fabricscope.optics.readers.ethtool import parse_ts

    if text is None:
        return time.time_ns()
    try:
        return parse_ts(text)
    except ValueError:
        raise ConfigError(f"--ts: {text!r}: expected ns since the epoch or ISO-8601") from None
