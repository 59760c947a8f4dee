"""gNMI target auth and TLS without traps: empty passwords, throttled failed logins, mTLS,
bad PEMs named, non-loopback warnings, and the CLI's front door (issue 8, defect 7)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from gnmi_pb import gnmi_pb2, gnmi_pb2_grpc

from fabricscope.fabric.builders import leaf_spine_fabric
from fabricscope.model.errors import ConfigError
from fabricscope.sim.clock import WallClock
from fabricscope.telemetry.auth import LoginThrottle
from fabricscope.telemetry.target import Credentials, GnmiTarget, TLSFiles, is_loopback, peer_host
from fabricscope.twin.state import Twin, background_load

FAB = leaf_spine_fabric(leaves=2, hosts_per_leaf=2, spines=2)
GET = gnmi_pb2.GetRequest(prefix=gnmi_pb2.Path(target="leaf-000"),
                          path=[gnmi_pb2.Path(elem=[gnmi_pb2.PathElem(name="interfaces")])], encoding=gnmi_pb2.PROTO)


def _twin() -> Twin:
    return Twin(FAB, clock=WallClock(), load_bps=background_load(FAB, utilization=0.3, seed=1), rng=1)


def _cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "from fabricscope.cli import main; main()", *args],
                          capture_output=True, text=True, timeout=timeout, env=env)


# ---------------------------------------------------------------- credentials and throttling
def test_empty_password_or_user_is_an_error_not_auth_on() -> None:
    with pytest.raises(ConfigError, match="password for user 'admin': must not be empty"):
        Credentials("admin", "")
    with pytest.raises(ConfigError, match="username"):
        Credentials("", "pw")


def test_login_throttle_locks_out_exponentially_and_resets_on_success() -> None:
    th = LoginThrottle(free_failures=3, base_lockout_s=1.0, max_lockout_s=8.0, max_hosts=2)
    assert [th.failure("h", 0.0) for _ in range(3)] == [(1, 0.0), (2, 0.0), (3, 1.0)]
    assert th.locked("h", 0.5) == 0.5 and th.locked("h", 1.0) == 0.0
    assert [th.failure("h", 10.0)[1] for _ in range(4)] == [2.0, 4.0, 8.0, 8.0]  # doubling, capped
    assert th.locked("other", 10.0) == 0.0  # per host
    th.success("h")
    assert th.locked("h", 10.0) == 0.0 and th.failure("h", 10.0) == (1, 0.0)
    for h in ("a", "b", "c"):
        th.failure(h, 0.0)
    assert len(th) == 2  # the table is bounded


def test_wrong_passwords_are_logged_throttled_and_never_logged_themselves(caplog: pytest.LogCaptureFixture) -> None:
    async def go() -> tuple[list[grpc.StatusCode], str, GnmiTarget]:
        tgt = GnmiTarget(_twin(), credentials=Credentials("admin", "s3cret-pw"),
                         throttle=LoginThrottle(free_failures=3, base_lockout_s=0.5))
        port = await tgt.start()
        codes = []
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                stub = gnmi_pb2_grpc.gNMIStub(ch)
                for k in range(200):  # a guesser hammering the target
                    try:
                        await stub.Get(GET, metadata=(("username", "admin"), ("password", f"guess-{k}")))
                        codes.append(grpc.StatusCode.OK)
                    except grpc.aio.AioRpcError as exc:
                        codes.append(exc.code())
                        last = exc.details() or ""
                # locked out now: even the right password is refused unchecked
                with pytest.raises(grpc.aio.AioRpcError) as ei:
                    await stub.Get(GET, metadata=(("username", "admin"), ("password", "s3cret-pw")))
                assert "too many failed logins" in (ei.value.details() or "")
                await asyncio.sleep(tgt.throttle.locked("127.0.0.1", time.monotonic()) + 0.05)
                ok = await stub.Get(GET, metadata=(("username", "admin"), ("password", "s3cret-pw")))
                assert ok.notification[0].update
        finally:
            await tgt.stop()
        return codes, last, tgt

    with caplog.at_level(logging.WARNING, logger="fabricscope.telemetry.target"):
        codes, last, tgt = asyncio.run(go())
    assert set(codes) == {grpc.StatusCode.UNAUTHENTICATED}
    # the 200 attempts ran in well under the first lockouts, so only the free tries and one
    # per expired lockout were checked; the rest were refused unchecked
    assert tgt.stats.auth_failures <= 10 and tgt.stats.auth_throttled >= 190, tgt.stats
    assert "too many failed logins from 127.0.0.1" in last
    fails = [r.getMessage() for r in caplog.records if "login failed" in r.getMessage()]
    assert fails and all("'admin'" in m and "127.0.0.1" in m for m in fails)
    assert len(fails) == tgt.stats.auth_failures  # one line per checked failure, none per throttled try
    assert not any("guess-" in r.getMessage() or "s3cret" in r.getMessage() for r in caplog.records)


def test_peer_host_and_loopback() -> None:
    assert peer_host("ipv4:127.0.0.1:5555") == "127.0.0.1"
    assert peer_host("ipv6:[::1]:5555") == "::1"
    assert peer_host("unix:/tmp/s") == "unix:/tmp/s"
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.3.2.1", "[::1]", "::1", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "[::]", "10.0.0.1", "example.org", ""))


def test_non_loopback_without_auth_or_tls_warns(caplog: pytest.LogCaptureFixture) -> None:
    # the check runs before binding; no test binds anything but loopback
    tgt = GnmiTarget(_twin(), address="0.0.0.0:0")
    with caplog.at_level(logging.WARNING):
        tgt._security_warnings("0.0.0.0")
    assert any("without authentication" in w for w in tgt.warnings)
    assert any("without TLS" in w for w in tgt.warnings)
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 2
    tgt2 = GnmiTarget(_twin(), address="0.0.0.0:0", credentials=Credentials("u", "p"))
    tgt2._security_warnings("0.0.0.0")
    assert tgt2.warnings == ["serving 0.0.0.0 without TLS: telemetry and passwords cross the network in clear text"]
    tgt3 = GnmiTarget(_twin())
    tgt3._security_warnings("127.0.0.1")
    assert tgt3.warnings == []


# ---------------------------------------------------------------- TLS / mTLS
def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-subj", "/CN=test-ca", "-days", "1", cwd=d)
    (d / "srv.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for name, ext in (("srv", ["-extfile", "srv.ext"]), ("cli", [])):
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", "1", *ext, cwd=d)
    # a second CA, which signed nothing the target trusts
    _openssl("req", "-x509", *ec, "-keyout", "rogue.key", "-out", "rogue.pem", "-subj", "/CN=rogue", "-days", "1", cwd=d)
    return d


async def _tls_get(port: int, pki: Path, cert: str | None) -> gnmi_pb2.GetResponse:
    creds = grpc.ssl_channel_credentials(
        root_certificates=(pki / "ca.pem").read_bytes(),
        private_key=(pki / f"{cert}.key").read_bytes() if cert else None,
        certificate_chain=(pki / f"{cert}.pem").read_bytes() if cert else None)
    async with grpc.aio.secure_channel(f"127.0.0.1:{port}", creds,
                                       options=[("grpc.ssl_target_name_override", "localhost")]) as ch:
        return await gnmi_pb2_grpc.gNMIStub(ch).Get(GET, timeout=10)


def test_mtls_requires_a_client_certificate_signed_by_the_client_ca(pki: Path) -> None:
    async def go() -> None:
        tls = TLSFiles((pki / "srv.pem").read_bytes(), (pki / "srv.key").read_bytes(), (pki / "ca.pem").read_bytes())
        tgt = GnmiTarget(_twin(), tls=tls)
        port = await tgt.start()
        try:
            assert (await _tls_get(port, pki, "cli")).notification[0].update
            with pytest.raises(grpc.aio.AioRpcError) as ei:
                await _tls_get(port, pki, None)  # no client certificate
            assert ei.value.code() == grpc.StatusCode.UNAVAILABLE
            with pytest.raises(grpc.aio.AioRpcError):
                await _tls_get(port, pki, "rogue")  # certificate from a CA the target does not trust
        finally:
            await tgt.stop()

    asyncio.run(go())


def test_bad_certificate_or_key_is_named_not_reported_as_cannot_bind(pki: Path) -> None:
    cert, key = (pki / "srv.pem").read_bytes(), (pki / "srv.key").read_bytes()
    cases = [
        (TLSFiles(b"not a cert", key), "certificate: not a PEM certificate"),
        (TLSFiles(cert, b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"), "key: not a usable"),
        (TLSFiles(cert, (pki / "cli.key").read_bytes()), "key: not a usable"),  # key of another cert
        (TLSFiles(cert, key, b"garbage"), "client CA: not a PEM certificate"),
    ]
    for tls, want in cases:
        tgt = GnmiTarget(_twin(), tls=tls)
        with pytest.raises(ConfigError, match=want) as ei:
            asyncio.run(tgt.start())
        assert "bind" not in str(ei.value)


# ---------------------------------------------------------------- CLI front door
@pytest.mark.parametrize(("args", "env", "want"), [
    (["serve-twin", "--address", "127.0.0.1:99999"], {}, "port must be a number 0-65535, got '99999'"),
    (["serve-twin", "--address", "no-port"], {}, "--address: expected HOST:PORT"),
    (["serve-twin", "--username", "admin", "--password-env", "FS_T_PW"], {"FS_T_PW": ""}, "'FS_T_PW' is empty"),
    (["serve-twin", "--password-env", "FS_T_PW"], {"FS_T_PW": "x"}, "also give --username"),
    (["serve-twin", "--username", "admin"], {}, "also give --password-env"),
    (["serve-twin", "--address", "192.0.2.1:9339"], {}, "not loopback and no authentication"),
    (["serve-twin", "--tls-client-ca", "ca.pem"], {}, "--tls-client-ca: also give --tls-cert"),
    (["serve-twin", "--max-paths", "0"], {}, "--max-paths: expected an integer >= 1"),
    (["get", "127.0.0.1:9339", "-t", "leaf-000", "/interfaces", "--encoding", "xml"], {}, "--encoding: expected proto"),
    (["get", "127.0.0.1:9339", "-t", "leaf-000", "/interfaces", "--username", "admin"], {}, "also give --password-env"),
    (["subscribe", "127.0.0.1:0", "-t", "leaf-000", "/interfaces"], {}, "port must be a number 1-65535"),
    (["subscribe", "127.0.0.1:9339", "-t", "leaf-000", "/interfaces", "--mode", "forever"], {}, "--mode: expected"),
])
def test_cli_rejects_bad_flags_with_one_line(args: list[str], env: dict[str, str], want: str) -> None:
    r = _cli("gnmi", *args, env={**os.environ, **env}, timeout=30)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and want in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_cli_bad_tls_key_is_one_line_naming_the_file(pki: Path) -> None:
    r = _cli("gnmi", "serve-twin", "--tls-cert", str(pki / "srv.pem"), "--tls-key", str(pki / "cli.key"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"--tls-key {pki / 'cli.key'}" in r.stderr and "key: not a usable private key" in r.stderr


def test_fault_help_shows_brackets() -> None:
    r = _cli("gnmi", "serve-twin", "--help", env={**os.environ, "COLUMNS": "200", "TERM": "dumb"})
    assert r.returncode == 0
    assert '"KIND SUBJECT [start=..] [end=..] [k=v ...]"' in r.stdout


def _serve(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", "from fabricscope.cli import main; main()", "gnmi", "serve-twin",
                             "--address", "127.0.0.1:0", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_serve_twin_stops_within_its_deadline_with_a_summary(sig: signal.Signals, code: int, pki: Path) -> None:
    env = {**os.environ, "FS_T_PW": "pw"}
    p = _serve("--username", "u", "--password-env", "FS_T_PW", "--tls-cert", str(pki / "srv.pem"),
               "--tls-key", str(pki / "srv.key"), "--tls-client-ca", str(pki / "ca.pem"), "--shutdown-grace", "1",
               env=env)
    try:
        assert p.stdout is not None
        line = p.stdout.readline()
        assert "mtls=on" in line and "auth=on" in line, (line, p.stderr.read() if p.poll() is not None else "")
        t0 = time.monotonic()
        p.send_signal(sig)
        out, err = p.communicate(timeout=20)
        took = time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == code, err
    assert f"({sig.name}):" in out and "RPCs" in out and "failed logins" in out
    assert took < 1 + 1 + 5  # grace + cancellation bound + interpreter teardown on a loaded CI core
    assert "Traceback" not in err


@pytest.mark.slow
def test_faults_injected_while_serving_via_fault_file_and_sighup(tmp_path: Path) -> None:
    ff = tmp_path / "faults.txt"
    ff.write_text("# none yet\n")
    p = _serve("--fault-file", str(ff), "--duration", "40")
    try:
        assert p.stdout is not None and p.stderr is not None
        line = p.stdout.readline()
        assert "serving" in line, line
        port = int(line.split(" on 127.0.0.1:")[1].split()[0])

        def oper(port_name: str) -> str:
            r = _cli("gnmi", "get", f"127.0.0.1:{port}", "-t", "leaf-000",
                     f"/interfaces/interface[name={port_name}]/state/oper-status", "--json")
            assert r.returncode == 0, r.stderr
            import json
            return str(json.loads(r.stdout.splitlines()[0])["value"])

        assert oper("eth3") == "UP"
        ff.write_text("link-down leaf-000:eth3\n")
        p.send_signal(signal.SIGHUP)
        assert "fault file reloaded: 1 fault(s)" in p.stdout.readline()
        assert oper("eth3") == "DOWN"
        ff.write_text("link-down leaf-000:eth3 bad=\n")  # a typo: reported, the previous faults stay
        p.send_signal(signal.SIGHUP)
        err = p.stderr.readline()
        assert "fault reload failed, previous faults kept" in err and "faults.txt:1" in err, err
        assert oper("eth3") == "DOWN"
        ff.write_text("link-down leaf-000:eth3\nlink-down leaf-000:eth99\n")  # no such port: all refused
        p.send_signal(signal.SIGHUP)
        assert "no such port or link 'leaf-000:eth99'" in p.stderr.readline()
        ff.write_text("")  # removing the line ends the fault
        p.send_signal(signal.SIGHUP)
        assert "fault file reloaded: 1 fault(s)" in p.stdout.readline()  # the ended one stays in history
        assert oper("eth3") == "UP"
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=20)
        assert p.returncode == 143
    finally:
        if p.poll() is None:
            p.kill()


def test_non_ascii_credentials_are_compared_not_refused() -> None:
    # hmac.compare_digest raises TypeError on non-ASCII str: every RPC would have failed.
    c = Credentials("opérateur", "pässwörd-✓")
    assert c.check({"username": "opérateur", "password": "pässwörd-✓"})
    assert not c.check({"username": "opérateur", "password": "passwörd-✓"})
    assert not c.check({"username": "operateur", "password": "pässwörd-✓"})
    assert not c.check({})
