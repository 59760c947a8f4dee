"""The optional LLM client: one OpenAI-compatible chat call that words a deterministic answer.

``POST {base}/v1/chat/completions`` (the OpenAI Chat Completions API, served as such by the
llama.cpp server, vLLM and Ollama) with :mod:`urllib` only: no SDK, no retries, a timeout,
TLS verification on unless turned off. An API key, when one is needed, is read from an
environment variable whose *name* is given (``--llm-key-env VAR``), sent as
``Authorization: Bearer ...`` and never written to a message, a log line or a ``repr``.

:func:`explain` is the whole contract with the caller: it returns the model's reply checked by
:func:`~fabricscope.diagnosis.explain.validate_reply` (accepted only when every id is in the
inventory and every claim cites the answer's evidence), or ``None`` when the endpoint failed,
with the reason passed to ``note``. Either way the deterministic answer stands; the
explanation is shown beside it, never instead of it.
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from fabricscope.diagnosis.explain import (
    Explanation,
    answer_resources,
    build_messages,
    evidence_ids,
    validate_reply,
)
from fabricscope.model.errors import ConfigError, TransportError

__all__ = ["LlmClient", "explain", "explanation_to_json", "print_explanation"]

MAX_REPLY_BYTES = 1 << 20


class _HasJson(Protocol):
    def to_json(self) -> dict[str, Any]: ...


class LlmClient:
    """A chat client for one model behind one OpenAI-compatible endpoint.

    ``base_url`` is the server's root (``http://127.0.0.1:8080``) or its ``/v1`` root
    (``http://127.0.0.1:11434/v1``, as Ollama documents it); ``model`` the name the server
    knows the model by; ``api_key_env`` the name of an environment variable holding a key;
    ``ca_file`` a PEM bundle to trust for https; ``verify_tls=False`` turns verification off
    (a lab server with a self-signed certificate; say so on purpose).
    """

    def __init__(self, base_url: str, model: str, *, api_key_env: str | None = None,
                 timeout_s: float = 20.0, verify_tls: bool = True,
                 ca_file: Path | None = None) -> None:
        url = base_url.strip().rstrip("/")
        scheme, _, rest = url.partition("://")
        if scheme not in ("http", "https") or not rest or rest.startswith("/"):
            raise ConfigError(f"--llm {base_url!r}: expected an http:// or https:// URL "
                              "such as http://127.0.0.1:8080")
        if not model.strip():
            raise ConfigError("--llm-model: empty model name")
        if not timeout_s > 0:
            raise ConfigError(f"llm timeout {timeout_s!r}: must be > 0 seconds")
        if url.endswith("/v1"):
            url = url[: -len("/v1")]
        self.url = f"{url}/v1/chat/completions"
        self.model = model.strip()
        self.timeout_s = float(timeout_s)
        self._key: str | None = None
        if api_key_env is not None:
            key = os.environ.get(api_key_env, "")
            if not key:
                raise ConfigError(f"--llm-key-env {api_key_env}: that environment variable "
                                  "is not set or empty")
            self._key = key
        self._ssl: ssl.SSLContext | None = None
        if scheme == "https":
            ctx = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
            if not verify_tls:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            self._ssl = ctx

    def __repr__(self) -> str:
        key = ", api key set" if self._key else ""
        return f"LlmClient({self.url!r}, model={self.model!r}{key})"

    def _clean(self, text: str) -> str:
        text = " ".join(text.split())
        if self._key:
            text = text.replace(self._key, "***")
        return text if len(text) <= 200 else text[:197] + "..."

    def _fail(self, what: str) -> TransportError:
        return TransportError(self._clean(f"llm {self.url}: {what}"))

    def chat(self, messages: Sequence[Mapping[str, str]], *, temperature: float = 0.0,
             max_tokens: int = 400) -> str:
        """The assistant's reply to ``messages``; :class:`TransportError` (one line, no key)
        on a connection error, a timeout, a non-200 status or a reply that is not the Chat
        Completions JSON (``choices[0].message.content`` a string)."""
        body = json.dumps({"model": self.model, "messages": [dict(m) for m in messages],
                           "temperature": temperature, "max_tokens": max_tokens,
                           "stream": False}).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        req = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s,
                                        context=self._ssl) as resp:
                status = resp.status
                raw = resp.read(MAX_REPLY_BYTES + 1)
        except urllib.error.HTTPError as exc:
            detail = exc.read(400).decode("utf-8", "replace") if exc.fp else ""
            raise self._fail(f"HTTP {exc.code} {exc.reason}: {detail or '(no body)'}") from None
        except urllib.error.URLError as exc:
            reason = exc.reason
            if isinstance(reason, TimeoutError):
                raise self._fail(f"no reply within {self.timeout_s:g} s") from None
            if isinstance(reason, ssl.SSLError):
                raise self._fail(f"TLS: {reason}") from None
            raise self._fail(f"cannot connect ({reason})") from None
        except TimeoutError:
            raise self._fail(f"no reply within {self.timeout_s:g} s") from None
        except (OSError, ValueError) as exc:  # reset mid-reply, bad status line, ...
            raise self._fail(f"connection failed ({exc.__class__.__name__}: {exc})") from None
        if status != 200:
            raise self._fail(f"HTTP {status} (expected 200)")
        if len(raw) > MAX_REPLY_BYTES:
            raise self._fail(f"reply larger than {MAX_REPLY_BYTES} bytes")
        try:
            doc = json.loads(raw)
        except ValueError:
            raise self._fail(f"reply is not JSON: {raw[:80].decode('utf-8', 'replace')!r}"
                             ) from None
        try:
            content = doc["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            content = None
        if not isinstance(content, str):
            raise self._fail("reply has no choices[0].message.content string (not an "
                             "OpenAI-compatible chat completion)")
        return content


def explain(answer: _HasJson | Mapping[str, Any], question: str | None, client: LlmClient,
            known: Callable[[str], bool], *, note: Callable[[str], None] | None = None
            ) -> Explanation | None:
    """Ask ``client`` to explain ``answer`` (an advisor :class:`Answer` or its JSON) or to
    answer ``question`` from it, and check the reply.

    ``known`` says whether an id is in the inventory (``ResourceMap(fabric).known``). Returns
    the checked :class:`Explanation` (``accepted`` False when it broke a rule, including
    naming a resource the answer does not), or None when
    the endpoint failed; in both failure cases ``note`` gets one line saying why, and the
    caller keeps the deterministic answer.
    """
    doc = answer if isinstance(answer, Mapping) else answer.to_json()
    try:
        text = client.chat(build_messages(question, doc))
    except TransportError as exc:
        if note is not None:
            note(f"no LLM explanation: {exc}")
        return None
    exp = validate_reply(text, known=known, evidence_ids=evidence_ids(doc),
                         allowed=answer_resources(doc))
    if not exp.accepted and note is not None:
        note(f"LLM explanation rejected ({len(exp.problems)} problem(s): "
             f"{'; '.join(exp.problems[:3])}); the deterministic answer stands")
    return exp


def explanation_to_json(exp: Explanation, model: str) -> dict[str, Any]:
    """The ``explanation`` object of ``diagnose --json``: the text only when accepted."""
    out: dict[str, Any] = {"model": model, "accepted": exp.accepted,
                           "problems": list(exp.problems), "cited": list(exp.cited),
                           "resources": list(exp.resources)}
    out["text" if exp.accepted else "rejected_text"] = exp.text
    return out


def print_explanation(exp: Explanation, model: str, *,
                      echo: Callable[[str], None] = print) -> None:
    """The human form, printed after the deterministic answer (nothing when rejected: the
    reason is already one of the answer's notes)."""
    if not exp.accepted:
        return
    echo("")
    echo(f"explanation ({model}; every id checked against the inventory, every claim cites "
         "the evidence above):")
    for line in exp.text.splitlines():
        echo(f"  {line}" if line.strip() else "")
