"""The optional LLM explanation: the prompt built from an answer, and the check of a reply.

The deterministic diagnosis (:func:`~fabricscope.service.advisor.advise`) is the answer; a
language model may only *word* it. This module is the pure half of that contract:
:func:`build_messages` turns an advisor answer (its JSON form) into OpenAI-style chat messages
that carry only the evidence, and :func:`validate_reply` decides whether what came back may be
shown. A reply is accepted only when

1. every inventory-looking id it names is one the inventory knows (``known``), so a model can
   never add a resource that does not exist; and, when ``allowed`` is given (as
   :func:`~fabricscope.service.llm.explain` does, with :func:`answer_resources`), one the
   answer itself names: a real port the answer never mentioned is as much an invention as a
   port that does not exist (the devices of the answer's ports and the parts of its cables
   and directions count as named);
2. every evidence id it cites is one the answer holds (no invented finding ids);
3. every *claim* carries a citation, where a claim is, simply, a sentence that names a resource
   id: such a sentence must contain at least one bracketed evidence reference ``[f-...]``.

This is citation checking in the spirit of attributed generation (Gao et al., "Enabling Large
Language Models to Generate Text with Citations", EMNLP 2023: every statement cites its
sources, and citations are verified mechanically), reduced to what can be checked without a
second model: ids, not meanings. It does not judge whether a cited finding really supports
the sentence; it guarantees that the ids are real and that nothing about a resource is said
without pointing at evidence the operator can open.

Inventory-looking ids (the tokenizer, :func:`resource_mentions`), the shapes of
``fabricscope.fabric`` and of hand-written inventories:

* a device: a switch or host prefix (``host``, ``leaf``, ``spine``, ``superspine``, ``core``,
  ``tor``, ``agg``, ``sw``, ``switch``, any case) followed by name characters that include a
  digit: ``host0042``, ``leaf-p1-r3-07``, ``spine-1`` (the words *leaf*, *spine* or
  *leaf-spine* have no digit and are prose);
* a sub-device: a device then ``/`` and a letters+digits part: ``host0042/nic3``,
  ``host0042/gpu3``;
* a port: any name then ``:`` and a letters+digits port (``eth12``, ``p0``, ``Ethernet1/4``,
  ``swp3``): ``leaf-p1-r3-07:eth12``, ``host0042/nic3:p0``;
* a direction or a cable: two of the above joined by ``->`` or ``|`` with no spaces
  (``a:eth1->b:eth4``, ``a:eth1|b:eth4``); with spaces (``x | y``, a credible set) each
  member is a mention of its own.

Markdown around an id (backticks, bold) does not hide it. Evidence ids are ``f-`` and at least
four hex digits (:func:`~fabricscope.diagnosis.model.finding_id`); a citation is one or more of
them inside square brackets, ``[f-1a2b3c4d5e6f]`` or ``[f-1a2b3c4d5e6f, f-0a0b0c0d0e0f]``; an
evidence id outside brackets is still checked against the answer but cites nothing.

Sentences are split at ``.``, ``!`` or ``?`` followed by white space, and at line breaks; a
piece that holds only citations (``... on leaf-1:eth3. [f-...]``) belongs to the sentence
before it. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Explanation",
    "answer_resources",
    "build_messages",
    "evidence_ids",
    "explain_context",
    "resource_mentions",
    "validate_reply",
]

_NAME_CH = r"[A-Za-z0-9_-]"
_DEVICE = rf"(?:host|leaf|spine|superspine|core|tor|agg|sw|switch)(?={_NAME_CH}*\d){_NAME_CH}*"
_GENERIC = rf"[A-Za-z]{_NAME_CH}*"
_SUB = r"(?:/[A-Za-z]+\d+)"
_PORT = r"(?::[A-Za-z]+\d+(?:/\d+)*)"
# an end: a device-shaped name (port optional) or any name that has a port
_END = rf"(?:{_DEVICE}{_SUB}?{_PORT}?|{_GENERIC}{_SUB}?{_PORT})"
_MENTION = re.compile(rf"(?<![\w/:.>|-])(?:{_END})(?:(?:->|\|)(?:{_END}))?(?![\w/-])",
                      re.IGNORECASE)
_EVIDENCE = re.compile(r"(?<![\w-])f-[0-9a-f]{4,}(?![\w-])")
_CITATION = re.compile(r"\[\s*f-[0-9a-f]{4,}(?:\s*[,;]\s*f-[0-9a-f]{4,})*\s*\]")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")
_ONLY_CITATIONS = re.compile(r"^(?:\s*" + _CITATION.pattern + r"\s*)+[.!?]*\s*$")

SYSTEM_PROMPT = (
    "You explain a network fabric diagnosis to an operator. Answer ONLY from the evidence "
    "in the user message; do not guess and do not use outside knowledge about this fabric. "
    "Rules: (1) every sentence that names a resource must cite the evidence ids it rests on "
    "in square brackets, for example [f-1a2b3c4d5e6f]; (2) cite only evidence ids listed in "
    "the message; (3) name only resources listed in the message, spelled exactly as given; "
    "(4) if the evidence does not answer the question, say so. Be brief: at most 6 sentences."
)
DEFAULT_QUESTION = ("Explain this diagnosis: the most likely root cause(s), the evidence for "
                    "each, and what to do next.")


@dataclass(frozen=True, slots=True)
class Explanation:
    """A model's reply and the verdict of :func:`validate_reply` on it.

    ``accepted`` is True only when ``problems`` is empty; ``resources`` are the ids the reply
    names (in order of first mention) and ``cited`` the evidence ids it cites.
    """

    text: str
    accepted: bool
    problems: tuple[str, ...] = ()
    resources: tuple[str, ...] = ()
    cited: tuple[str, ...] = ()


def resource_mentions(text: str) -> list[str]:
    """The inventory-looking ids in ``text``, in order, duplicates kept (see module doc).

    >>> resource_mentions("CRC on `spine-p0-00:eth4` and host0042/nic3; leaf-spine is fine")
    ['spine-p0-00:eth4', 'host0042/nic3']
    >>> resource_mentions("loss on leaf-1:eth3->spine-2:eth1, cable a:p0|b:eth1")
    ['leaf-1:eth3->spine-2:eth1', 'a:p0|b:eth1']
    """
    return [m.group(0) for m in _MENTION.finditer(_EVIDENCE.sub(" ", text))]


def _cited(text: str) -> list[str]:
    return [e for c in _CITATION.findall(text) for e in _EVIDENCE.findall(c)]


def _sentences(text: str) -> list[str]:
    out: list[str] = []
    for piece in _SENTENCE_END.split(text):
        if not piece.strip():
            continue
        if out and _ONLY_CITATIONS.match(piece):
            out[-1] = f"{out[-1]} {piece}"
        else:
            out.append(piece)
    return out


def _short(s: str, n: int = 80) -> str:
    s = " ".join(s.split())
    return s if len(s) <= n else s[: n - 3] + "..."


def _parts(r: str) -> list[str]:
    return [p for p in re.split(r"->|\|", r) if p]


def _widen(ids: Iterable[str]) -> set[str]:
    out: set[str] = set()
    for r in ids:
        out.add(r)
        for p in _parts(r):
            out.add(p)
            dev = p.rsplit(":", 1)[0]
            out.add(dev)
            out.add(dev.split("/", 1)[0])  # a NIC's or GPU's host
    return out


def validate_reply(text: str, *, known: Callable[[str], bool], evidence_ids: set[str],
                   allowed: Collection[str] | None = None) -> Explanation:
    """Check a model's reply against the inventory and the answer's evidence.

    ``known`` says whether an id is in the inventory (e.g.
    :meth:`~fabricscope.diagnosis.graph.ResourceMap.known`); ``evidence_ids`` are the ids the
    answer holds (:func:`evidence_ids`); ``allowed``, when given, the resources the answer
    names (:func:`answer_resources`), beyond which the reply may not go. Returns an :class:`Explanation` whose ``problems`` list
    every violation of the three rules of the module docstring (plus an empty reply); it is
    ``accepted`` only when there is none.
    """
    problems: list[str] = []
    if not text.strip():
        problems.append("the reply is empty")
    mentions = list(dict.fromkeys(resource_mentions(text)))
    wide = _widen(allowed) if allowed is not None else None
    for r in mentions:
        if not (known(r) or all(known(p) for p in _parts(r))):
            problems.append(f"names {r!r}, which is not in the inventory")
        elif wide is not None and not (r in wide or all(p in wide for p in _parts(r))):
            problems.append(f"names {r!r}, which the answer does not mention")
    refs = list(dict.fromkeys(_EVIDENCE.findall(text)))
    for e in refs:
        if e not in evidence_ids:
            problems.append(f"cites {e}, which is not evidence of this answer")
    for s in _sentences(text):
        named = resource_mentions(s)
        if named and not _cited(s):
            problems.append(f"claim without evidence: {_short(s)!r} names {named[0]!r} but "
                            f"cites no [f-...] evidence")
    cited = tuple(dict.fromkeys(_cited(text)))
    return Explanation(text=text.strip(), accepted=not problems, problems=tuple(problems),
                       resources=tuple(mentions), cited=cited)


def explain_context(answer_json: Mapping[str, Any], *, max_root_causes: int = 8,
                    max_plan: int = 6) -> dict[str, Any]:
    """The part of an answer the model sees: focus, top root causes, plan, notes, findings.

    Bounded (the ``max_*`` leading items) so that a large answer still fits a small model's
    context; :func:`build_messages` and :func:`evidence_ids` both read this same view, so the
    ids a reply may cite are exactly the ids the model was shown.
    """
    rcs = [dict(r) for r in list(answer_json.get("root_causes") or [])[:max_root_causes]
           if isinstance(r, Mapping)]
    root_causes = [{k: r.get(k) for k in ("incident", "resource", "fault", "probability",
                                          "specialist", "evidence", "explains", "action",
                                          "checks") if k in r} for r in rcs]
    wanted = {r.get("incident") for r in rcs}
    incidents = [{"id": i.get("id"), "title": i.get("title", ""),
                  "severity": i.get("severity", ""), "findings": list(i.get("findings") or [])}
                 for i in answer_json.get("incidents") or []
                 if isinstance(i, Mapping) and (i.get("id") in wanted or not rcs)]
    plan = [{k: p.get(k) for k in ("for", "check", "run", "if_true", "if_false") if k in p}
            for p in list(answer_json.get("plan") or [])[:max_plan] if isinstance(p, Mapping)]
    return {"focus": list(answer_json.get("focus") or []), "root_causes": root_causes,
            "incidents": incidents, "plan": plan, "notes": list(answer_json.get("notes") or [])}


def _strings(x: object) -> Iterable[str]:
    if isinstance(x, str):
        yield x
    elif isinstance(x, Mapping):
        for v in x.values():
            yield from _strings(v)
    elif isinstance(x, Sequence):
        for v in x:
            yield from _strings(v)


def evidence_ids(answer_json: Mapping[str, Any]) -> set[str]:
    """The evidence ids of an answer that a reply may cite (those in :func:`explain_context`)."""
    return {e for s in _strings(explain_context(answer_json)) for e in _EVIDENCE.findall(s)}


def _render(ctx: Mapping[str, Any]) -> list[str]:
    lines: list[str] = []
    if ctx["focus"]:
        lines.append(f"Operator's focus: {', '.join(map(str, ctx['focus']))}")
    for k, r in enumerate(ctx["root_causes"], 1):
        p = r.get("probability")
        prob = f"p={p:.2f}" if isinstance(p, int | float) else "p=?"
        lines.append(f"Root cause {k}: {r.get('fault')} on {r.get('resource')} ({prob}, "
                     f"{r.get('specialist') or '?'} specialist, incident {r.get('incident')})")
        lines.extend(f"  evidence: {e}" for e in r.get("evidence") or [])
        for c in r.get("checks") or []:
            if isinstance(c, Mapping) and c.get("result") != "not-run":
                lines.append(f"  checked {c.get('name')}: {c.get('result')} ({c.get('detail')})")
        if r.get("action"):
            lines.append(f"  action: {r['action']}")
    if not ctx["root_causes"]:
        lines.append("No root cause is supported by the evidence.")
        for i in ctx["incidents"]:
            lines.append(f"Incident {i['id']} ({i['severity']}): {i['title']}; findings "
                         f"{', '.join(map(str, i['findings'])) or '(none)'}")
    for k, p in enumerate(ctx["plan"], 1):
        lines.append(f"Next check {k} [{p.get('for')}]: {p.get('check')}: {p.get('run')}; if it "
                     f"shows the problem: {p.get('if_true')}; if not: {p.get('if_false')}")
    lines.extend(f"Note: {n}" for n in ctx["notes"])
    return lines


def answer_resources(answer_json: Mapping[str, Any]) -> list[str]:
    """The resource ids the model is shown (those in :func:`explain_context`), in order."""
    ctx = explain_context(answer_json)
    return list(dict.fromkeys(m for s in _strings(ctx) for m in resource_mentions(s)))


def build_messages(question: str | None, answer_json: Mapping[str, Any]
                   ) -> list[dict[str, str]]:
    """OpenAI-style chat messages asking a model to explain ``answer_json`` (or to answer
    ``question`` from it): a system prompt with the rules of the module docstring, and a user
    message with the evidence (:func:`explain_context`, as short plain lines that a small
    model reads better than JSON), the resources it names and the evidence ids it holds."""
    ctx = explain_context(answer_json)
    resources = answer_resources(answer_json)
    ids = sorted(evidence_ids(answer_json))
    user = "\n".join([
        f"Question: {(question or '').strip() or DEFAULT_QUESTION}",
        "",
        "Diagnosis:",
        *_render(ctx),
        "",
        f"Resources you may name: {', '.join(resources) or '(none)'}",
        f"Evidence ids you may cite: {', '.join(ids) or '(none)'}",
    ])
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]
