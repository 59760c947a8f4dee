"""The cluster end to end (issue 14): a twin gNMI target -> cluster collectors -> NATS -> workers.

Real processes: one ``nats-server -js``, one twin gNMI target (a leaf-spine twin of 499 leaves
+ 1 spine = 500 devices, over real gRPC), three ``fabricscope gnmi collect --cluster`` members
and two ``fabricscope worker`` processes sharing one durable consumer. Scale chosen to fit two
shared CPU cores: one counter path per device sampled every 1 s (500 updates/s).

The twin records every (device, timestamp) it sends and every Subscribe session it opens, the
workers tap every event they take as new (``--tap``). One collector is killed with SIGKILL
and later started again. Checked:

* its devices stream again (their events reach a worker) within lease + slack <= 10 s;
* every sample the twin sent to a surviving member, in the measured window, reached a worker;
  what is missing belongs to the killed member's devices, sent in its takeover window;
* no (target, path, timestamp) reached the workers twice, nothing arrived the twin did not send,
  and no device ever had two Subscribe sessions at once (no double streaming on handover).

``Scenario`` is reused by ``benchmarks/bench_cluster.py`` (the 500-device measurements).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

NATS = shutil.which("nats-server") or "/usr/sbin/nats-server"
PATH = "/interfaces/interface[name=eth1]/state/counters/in-octets"
EVENT = "/interfaces/interface/state/counters/in-octets"  # the event name; the key goes to tags
_TICK = os.sysconf("SC_CLK_TCK")
NATS_PIDS: dict[str, int] = {}  # url -> nats-server pid (the benchmark reads its CPU)

_MAIN = "import fabricscope.cli as c\nc.main()\n"  # the CLI, in this interpreter

# The twin target: records what it sends (device, ts, wall time) and its session overlaps.
_TWIN = textwrap.dedent("""
    import asyncio, json, signal, sys, time
    from fabricscope.fabric.builders import leaf_spine_fabric
    from fabricscope.service.gnmi_twin import twin_for
    from fabricscope.telemetry import target as T
    n, out = int(sys.argv[1]), sys.argv[2]
    fab = leaf_spine_fabric(leaves=n - 1, hosts_per_leaf=1, spines=1)
    sent, now_open, overlaps, opened, opens = {}, {}, [], [0], []
    enc, op, cl = T._Session._encode, T.GnmiTarget._open_session, T.GnmiTarget._close_session
    def _encode(self, ts, pairs):
        sent.setdefault(self.target, []).append((ts, len(pairs), time.time()))
        return enc(self, ts, pairs)
    def _open(self, host, device):
        key = op(self, host, device)
        now_open[device] = now_open.get(device, 0) + 1
        opened[0] += 1
        opens.append([device, time.time()])
        if now_open[device] > 1:
            overlaps.append([device, time.time()])
        return key
    def _close(self, key):
        now_open[key[1]] -= 1
        return cl(self, key)
    T._Session._encode, T.GnmiTarget._open_session, T.GnmiTarget._close_session = _encode, _open, _close
    async def main():
        tgt = T.GnmiTarget(twin_for(fab, seed=7), address="127.0.0.1:0")
        port = await tgt.start()
        print("PORT", port, flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for s in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(s, stop.set)
        await stop.wait()
        await tgt.stop(0.2)
        with open(out, "w") as fh:
            json.dump({"sent": sent, "overlaps": overlaps, "sessions": opened[0], "opens": opens}, fh)
    asyncio.run(main())
""")


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_s(pid: int) -> float:
    """utime + stime of a live process (all threads), from /proc/<pid>/stat."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


@contextlib.contextmanager
def nats_server() -> Iterator[str]:
    """A JetStream nats-server on a free loopback port and a temp store dir; removed after."""
    port = free_port()
    store = tempfile.mkdtemp(prefix="fs-nats-")
    proc = subprocess.Popen([NATS, "-js", "-sd", store, "-a", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                break
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("nats-server did not start")
            time.sleep(0.05)
        NATS_PIDS[f"nats://127.0.0.1:{port}"] = proc.pid
        yield f"nats://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(store, ignore_errors=True)


def _status(url: str) -> Any:
    import asyncio

    from fabricscope.cluster.membership import read_cluster_status

    return asyncio.run(read_cluster_status(url))


@dataclass
class Scenario:
    """Collectors and workers against one twin; see the module docstring.

    ``kill``: SIGKILL collector ``c1`` after ``steady_s``; ``rejoin``: start it again later.
    """

    url: str
    work: Path
    devices: int = 500
    collectors: int = 3
    workers: int = 2
    lease_s: float = 3.0
    steady_s: float = 3.0
    kill: bool = True
    rejoin: bool = True
    tap: bool = True  # workers write what they take (the analysis needs it; costs worker CPU)
    path: str = PATH  # another path (more leaves per device) only for throughput runs
    interval: str = "1s"
    disturb: Callable[[], None] | None = None  # run after the first steady period (e.g. a NATS restart)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)
    cpu_ready: dict[str, float] = field(default_factory=dict)  # at "ready": steady-state deltas
    marks: dict[str, float] = field(default_factory=dict)
    victim_devices: set[str] = field(default_factory=set)
    handed_back: set[str] = field(default_factory=set)

    def _spawn(self, name: str, args: list[str]) -> None:
        log = (self.work / f"{name}.log").open("ab")
        env = {**os.environ, "GRPC_VERBOSITY": "NONE"}
        self.procs[name] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()

    def _config(self, port: int, member: str) -> Path:
        leaves = [f"leaf-{i:03d}" for i in range(self.devices - 1)] + ["spine-00"]
        cfg = {
            "targets": {"twin": {"address": f"127.0.0.1:{port}", "names": leaves}},
            "subscriptions": {"c": {"paths": [self.path], "sample-interval": self.interval}},
            "buffer": {"flush-interval": "1s"},
            "stats-interval": "0s",
            "shutdown": {"deadline": "5s"},
            "cluster": {"nats": self.url, "member": member, "lease": f"{self.lease_s:g}s"},
        }
        p = self.work / f"{member}.yaml"
        p.write_text(json.dumps(cfg))  # JSON is YAML
        return p

    def _collector(self, i: int, port: int) -> None:
        name = f"c{i}"
        self._spawn(name, [sys.executable, "-c", _MAIN, "gnmi", "collect", "--cluster",
                           "--config", str(self._config(port, name))])

    def _wait(self, what: str, pred: Any, timeout: float) -> float:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if pred():
                return time.time()
            for n, p in self.procs.items():
                if p.poll() is not None and not (n == "c1" and "kill" in self.marks and "rejoin" not in self.marks):
                    raise AssertionError(f"{n} exited with {p.returncode} while waiting for {what}: "
                                         f"{(self.work / f'{n}.log').read_text()[-2000:]}")
            time.sleep(0.2)
        raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")

    def _owned(self, live: set[str]) -> dict[str, str]:
        from fabricscope.model.errors import TransportError

        try:
            st = _status(self.url)
        except TransportError:  # no member has created the buckets yet
            return {}
        return {c.target: c.owner for c in st.claims if c.live and c.owner in live}

    def run(self) -> dict[str, Any]:
        """Run the scenario and return the analysed counts (see :meth:`analyse`)."""
        twin_out = self.work / "twin.json"
        self._spawn("twin", [sys.executable, "-c", _TWIN, str(self.devices), str(twin_out)])
        port = 0
        end = time.monotonic() + 30
        while not port and time.monotonic() < end:
            with contextlib.suppress(ValueError, IndexError):
                port = int((self.work / "twin.log").read_text().split("PORT", 1)[1].split()[0])
            time.sleep(0.1)
        assert port, (self.work / "twin.log").read_text()
        for j in range(self.workers):
            tap = ["--tap", str(self.work / f"w{j}.tap")] if self.tap else []
            self._spawn(f"w{j}", [sys.executable, "-c", _MAIN, "worker", "--nats", self.url, "--durable", "fs-e2e",
                                  *tap, "--json-stats"])
        members = {f"c{i}" for i in range(self.collectors)}
        for i in range(self.collectors):
            self._collector(i, port)
        self.marks["ready"] = self._wait("every device owned by a live member",
                                         lambda: len(self._owned(members)) == self.devices, 60)
        self.cpu_ready = {n: cpu_s(p.pid) for n, p in self.procs.items()}
        if self.url in NATS_PIDS:
            self.cpu_ready["nats"] = cpu_s(NATS_PIDS[self.url])
        time.sleep(self.steady_s)
        if self.disturb is not None:
            self.marks["disturb"] = time.time()
            self.disturb()
            self.marks["disturbed"] = time.time()
            time.sleep(self.steady_s)
        if self.kill:
            owned = self._owned(members)
            self.victim_devices = {t for t, o in owned.items() if o == "c1"}
            self.cpu["c1"] = cpu_s(self.procs["c1"].pid)
            self.marks["kill"] = time.time()
            self.procs["c1"].send_signal(signal.SIGKILL)
            self.procs["c1"].wait()
            survivors = members - {"c1"}
            self.marks["owned_again"] = self._wait(
                "the killed member's devices owned again",
                lambda: self.victim_devices <= set(self._owned(survivors)), 30)
            time.sleep(self.steady_s)
            if self.rejoin:
                self.cpu["c1-first"] = self.cpu.pop("c1")
                self.marks["rejoin"] = time.time()
                self._collector(1, port)
                self.marks["rebalanced"] = self._wait(
                    "the restarted member's share back",
                    lambda: sum(o == "c1" for o in self._owned(members).values()) >= len(self.victim_devices) // 2,
                    30)
                time.sleep(self.steady_s)
                # the devices the restarted member holds now: handed over after the rejoin (some
                # of them after the "rebalanced" mark, which waits for half of its share only)
                self.handed_back = {t for t, o in self._owned(members).items() if o == "c1"}
        self.marks["end"] = time.time()
        for n in sorted(self.procs):
            if n.startswith("c") and self.procs[n].poll() is None:
                self.cpu[n] = self.cpu.get(n, 0.0) + cpu_s(self.procs[n].pid)
                self.procs[n].send_signal(signal.SIGTERM)
        for n in sorted(self.procs):
            if n.startswith("c") and n in self.procs:
                rc = self.procs[n].wait(30)
                assert rc in (143, -9), f"{n}: exit {rc}: {(self.work / f'{n}.log').read_text()[-2000:]}"
        time.sleep(1.5)  # the workers take what the collectors flushed at their stop
        for n in sorted(self.procs):
            if n.startswith("w"):
                self.cpu[n] = cpu_s(self.procs[n].pid)
                self.procs[n].send_signal(signal.SIGTERM)
        for n in sorted(self.procs):
            if n.startswith("w"):
                assert self.procs[n].wait(30) == 143, (self.work / f"{n}.log").read_text()[-2000:]
        self.cpu["twin"] = cpu_s(self.procs["twin"].pid)
        if self.url in NATS_PIDS:
            self.cpu["nats"] = cpu_s(NATS_PIDS[self.url])
        self.procs["twin"].send_signal(signal.SIGTERM)
        self.procs["twin"].wait(30)
        return self.analyse(json.loads(twin_out.read_text()))

    def analyse(self, twin: dict[str, Any]) -> dict[str, Any]:
        """Compare the twin's sends with the workers' taps over [ready, end - 1 s]."""
        lo, hi = self.marks["ready"], self.marks["end"] - 1.0
        sent = {(d, ts): t for d, rows in twin["sent"].items() for ts, _n, t in rows}
        got: dict[tuple[str, int], float] = {}
        dup = extra = 0
        for j in range(self.workers):
            tap = self.work / f"w{j}.tap"
            for line in tap.read_text().splitlines() if tap.exists() else []:
                rec = json.loads(line)
                for target, name, ts in rec["events"]:
                    if name != EVENT:
                        continue
                    k = (target, ts)
                    if k in got:
                        dup += 1
                    got.setdefault(k, rec["t"])
                    if k not in sent:
                        extra += 1
        window = {k: t for k, t in sent.items() if lo <= t <= hi}
        per_device: dict[str, int] = {}
        for (d, _ts) in window:
            per_device[d] = per_device.get(d, 0) + 1
        missing = [(k, t) for k, t in window.items() if k not in got]
        kill = self.marks.get("kill", float("inf"))
        # first event after the kill of each of the victim's devices (sent after the kill)
        first_after: dict[str, float] = {}
        for (d, ts), t in got.items():
            if d in self.victim_devices and ts / 1e9 > kill:
                first_after[d] = min(first_after.get(d, float("inf")), t)
        back = [first_after.get(d, float("inf")) - kill for d in self.victim_devices]
        # the new owner's Subscribe at the device: streaming again, whatever the twin's pace
        resub: dict[str, float] = {}
        for d, t in twin.get("opens", []):
            if d in self.victim_devices and t > kill:
                resub[d] = min(resub.get(d, float("inf")), t)
        again = sorted(resub.get(d, float("inf")) - kill for d in self.victim_devices)
        rej, reb = self.marks.get("rejoin", float("inf")), self.marks.get("rebalanced", float("inf"))
        in_takeover = [k for k, t in missing if k[0] in self.victim_devices and kill - 1.5 <= t <= kill + max(back, default=0)]
        in_rejoin = [k for k, t in missing if rej <= t <= reb + 1.5 or (k[0] in self.handed_back and t >= rej)]
        other = [k for k, _ in missing if k not in set(in_takeover) | set(in_rejoin)]
        return {
            "devices": self.devices, "collectors": self.collectors, "workers": self.workers, "lease_s": self.lease_s,
            "window_s": hi - lo, "sent_in_window": len(window),
            "sent_ready_to_end": sum(n for rows in twin["sent"].values() for _ts, n, t in rows
                                     if lo <= t <= self.marks["end"]), "received_in_window": len(window) - len(missing),
            "received_total": len(got), "missing": len(missing), "missing_takeover": len(in_takeover),
            "missing_rejoin_handover": len(in_rejoin), "missing_other": len(other), "missing_other_examples": other[:5],
            "duplicates": dup, "not_sent_by_twin": extra, "session_overlaps": len(twin["overlaps"]),
            "victim_devices": len(self.victim_devices), "handed_back": len(self.handed_back),
            "min_sent_per_survivor_device": min((per_device.get(d, 0) for d in twin["sent"]
                                                 if d not in self.victim_devices), default=0),
            "median_sent_per_survivor_device": sorted(per_device.get(d, 0) for d in twin["sent"]
                                                      if d not in self.victim_devices)[
                (len(twin["sent"]) - len(self.victim_devices)) // 2] if twin["sent"] else 0,
            "resubscribed_max_s": again[-1] if again else None,
            "resubscribed_median_s": again[len(again) // 2] if again else None,
            "failover_max_s": max(back) if back else None,
            "failover_median_s": sorted(back)[len(back) // 2] if back else None,
            "owned_again_s": self.marks["owned_again"] - kill if "owned_again" in self.marks else None,
            "cpu_s": dict(self.cpu), "cpu_ready_s": dict(self.cpu_ready), "marks": dict(self.marks),
        }

    def close(self) -> None:
        """Kill whatever is still running (a failed assertion mid-way)."""
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.mark.skipif(not os.path.exists(NATS), reason="nats-server not installed (CI installs it)")
def test_three_collectors_two_workers_failover_and_rejoin_500_devices(tmp_path: Path) -> None:
    t0 = time.monotonic()
    with nats_server() as url:
        sc = Scenario(url, tmp_path, devices=500, lease_s=3.0, steady_s=3.0)
        try:
            r = sc.run()
        finally:
            sc.close()
    print(json.dumps({k: v for k, v in r.items() if k != "marks"}, indent=1), f"\nscenario took {time.monotonic() - t0:.1f} s")
    assert r["victim_devices"] > 50  # c1 held its share (about a third)
    # the target: every device of the killed member is subscribed again by a survivor
    # within 10 s (lease 3 s + the takeover); and its samples reach a worker again (how soon
    # also depends on how fast the twin samples on two busy cores: reported, bounded loosely)
    assert r["resubscribed_max_s"] is not None and r["resubscribed_max_s"] <= 10.0, r
    assert r["failover_max_s"] is not None and r["failover_max_s"] <= r["resubscribed_max_s"] + 10.0, r
    assert r["duplicates"] == 0 and r["not_sent_by_twin"] == 0 and r["session_overlaps"] == 0, r
    assert r["missing_other"] == 0, r  # the survivors' devices lost nothing
    # no survivor's stream was stopped for long: each of its devices was sampled about as often
    # as the others (the twin itself sends below 1/s when the two cores are busy, so the bound
    # is relative to the median device, not to the window)
    assert r["min_sent_per_survivor_device"] >= 0.6 * r["median_sent_per_survivor_device"] > 0, r
    # what was lost is what the killed member held unpublished: <= flush-interval (1 s) + linger per device
    assert r["missing_takeover"] <= 2 * r["victim_devices"], r
    # a clean handover cancels the old owner's stream: what the twin sent into the cancelled
    # call is lost, at 1 sample/s per device for as long as the stop takes (< 2 s under load)
    assert r["missing_rejoin_handover"] <= 2 * r["handed_back"], r


@pytest.mark.skipif(not os.path.exists(NATS), reason="nats-server not installed (CI installs it)")
def test_nats_restart_under_load_collectors_buffer_and_resume(tmp_path: Path) -> None:
    """kill -9 of the nats-server (JetStream on disk) for 2 s while two collectors stream 200
    devices: the publishers buffer, everything reconnects, and every sample the twin sent
    reaches a worker exactly once; nobody loses a device (the outage is shorter than the lease)."""
    from test_cluster_bus import NatsServer

    srv = NatsServer(tmp_path / "nats")
    (tmp_path / "nats").mkdir()
    srv.start()

    def restart() -> None:
        srv.kill()
        time.sleep(2.0)
        srv.start()

    sc = Scenario(srv.url, tmp_path, devices=200, collectors=2, workers=1, lease_s=5.0, steady_s=4.0,
                  kill=False, rejoin=False, disturb=restart)
    try:
        r = sc.run()
    finally:
        sc.close()
        srv.kill()
    print(json.dumps({k: v for k, v in r.items() if k != "marks"}, indent=1))
    # the twin streamed all along (at 1 sample/s per device when it has the CPU)
    assert r["sent_in_window"] >= 0.5 * 200 * r["window_s"], r
    assert r["missing"] == 0 and r["duplicates"] == 0 and r["not_sent_by_twin"] == 0, r
    assert r["session_overlaps"] == 0, r
