"""A third-party client (pygnmi 0.8.15) against our target: Capabilities, Get, STREAM SAMPLE.

pygnmi ships its own copy of the gNMI stubs, which collides with ``gnmi_pb`` in one process
(both register ``gnmi.proto`` in the default descriptor pool), so it runs in its own virtual
environment, created once under the user cache dir, as a subprocess.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import venv
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from fabricscope.fabric.builders import leaf_spine_fabric
from fabricscope.sim.clock import WallClock
from fabricscope.telemetry.target import Credentials, GnmiTarget
from fabricscope.twin.state import Twin, background_load

PYGNMI = "pygnmi==0.8.15"

CLIENT = r"""
import json, sys
from pygnmi.client import gNMIclient
port, enc = int(sys.argv[1]), sys.argv[2]
out = {}
with gNMIclient(target=("127.0.0.1", port), username="admin", password="pw", insecure=True) as gc:
    caps = gc.capabilities()
    out["encodings"] = caps.get("supported_encodings")
    out["models"] = [m["name"] for m in caps.get("supported_models", [])]
    r = gc.get(target="leaf-000", path=["/interfaces/interface[name=eth1]/state/counters/out-octets",
                                         "/components/component[name=eth1]/transceiver/state/supply-voltage/instant"],
               encoding=enc)
    out["get"] = [u.get("val") for n in r["notification"] for u in n.get("update", [])]
    sub = {"subscription": [{"path": "/components/component[name=eth1]/transceiver/physical-channels/channel[index=0]/state/input-power/instant",
                             "mode": "sample", "sample_interval": 100_000_000},
                            {"path": "/interfaces/interface[name=eth1]/state/counters/out-octets",
                             "mode": "sample", "sample_interval": 100_000_000}],
           "mode": "stream", "encoding": enc}
    vals, syncs = [], 0
    stream = gc.subscribe_stream(subscribe=sub, target="leaf-000")
    while len(vals) < 10:
        msg = stream.get_update(timeout=5)
        if "update" in msg:
            vals += [u.get("val") for u in msg["update"]["update"]]
    stream.close()
    out["stream"] = vals
    try:
        gc.get(target="nope", path=["/interfaces"], encoding=enc)
        out["unknown_target"] = "no error"
    except Exception as exc:
        out["unknown_target"] = str(exc)
print(json.dumps(out))
"""


def _pygnmi_python() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "fabricscope" / "pygnmi-0.8.15"
    py = cache / "bin" / "python"
    marker = cache / ".installed"
    if marker.exists() and py.exists():
        return py
    try:
        venv.EnvBuilder(with_pip=True, clear=True).create(cache)
        r = subprocess.run([str(py), "-m", "pip", "install", "-q", PYGNMI], capture_output=True, text=True,
                           timeout=600)
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"cannot create a virtualenv for {PYGNMI}: {exc}")
    if r.returncode != 0:
        pytest.skip(f"pip cannot install {PYGNMI}: {r.stderr.strip()[-300:]}")
    marker.write_text(PYGNMI)
    return py


@contextmanager
def _serving(target: GnmiTarget) -> Iterator[int]:
    """Run the target on its own event loop in a thread (the client is a blocking subprocess)."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    port: list[int] = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        port.append(loop.run_until_complete(target.start()))
        ready.set()
        loop.run_forever()

    th = threading.Thread(target=run, daemon=True)
    th.start()
    ready.wait(30)
    try:
        yield port[0]
    finally:
        asyncio.run_coroutine_threadsafe(target.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        th.join(10)


def _run_client(encoding_option: str, request_encoding: str) -> dict[str, object]:
    py = _pygnmi_python()
    fab = leaf_spine_fabric(leaves=2, hosts_per_leaf=2, spines=2)
    twin = Twin(fab, clock=WallClock(), load_bps=background_load(fab, utilization=0.3), rng=3)
    target = GnmiTarget(twin, credentials=Credentials("admin", "pw"), encoding=encoding_option)
    with _serving(target) as port:
        r = subprocess.run([str(py), "-c", CLIENT, str(port), request_encoding], capture_output=True,
                           text=True, timeout=120, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert r.returncode == 0, r.stderr[-2000:]
    out: dict[str, object] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


@pytest.mark.slow
def test_pygnmi_capabilities_get_and_stream_decode_values() -> None:
    out = _run_client("request", "json_ietf")
    assert "json_ietf" in out["encodings"] and "proto" in out["encodings"]  # type: ignore[operator]
    assert "openconfig-interfaces" in out["models"]  # type: ignore[operator]
    get = out["get"]
    assert isinstance(get, list) and isinstance(get[0], int) and isinstance(get[1], float)
    assert 3.0 < get[1] < 3.6  # supply voltage decoded, not dropped
    stream = out["stream"]
    assert isinstance(stream, list) and len(stream) >= 10
    powers = [v for v in stream if isinstance(v, float)]
    counters = [v for v in stream if isinstance(v, int)]
    assert powers and counters and all(-10 < p < 5 for p in powers)  # dBm decoded
    assert counters == sorted(counters)
    assert "NOT_FOUND" in str(out["unknown_target"]) or "unknown target" in str(out["unknown_target"])


@pytest.mark.slow
def test_pygnmi_drops_double_val_with_typed_encoding_which_is_why_json_ietf_exists() -> None:
    # Forcing typed values: pygnmi 0.8.15's parser has no double_val branch, so float leaves
    # come back without a value. The JSON_IETF fallback above is the fix.
    out = _run_client("typed", "proto")
    get = out["get"]
    assert isinstance(get, list)
    assert isinstance(get[0], int) and get[1] is None  # the double (supply voltage) was dropped


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-v"]))
