"""gNMI path parse/format/match and the wire codec, checked against the official protobuf classes."""

from __future__ import annotations

import random

import pytest
from gnmi_pb import gnmi_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from fabricscope.model.errors import ConfigError
from fabricscope.telemetry.codec import (
    Flattener,
    WireFlattener,
    decode_value,
    encode_notification,
    from_proto_path,
    path_bytes,
    prefix_bytes,
    to_proto_path,
    typed_value,
)
from fabricscope.telemetry.paths import (
    Elem,
    GPath,
    PathSyntaxError,
    format_path,
    match,
    parse_path,
    schema_name,
    tags_of,
)
from fuzzing import fuzz_settings

names = st.from_regex(r"[a-z][a-z0-9\-]{0,12}", fullmatch=True)
key_values = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                     min_size=0, max_size=12)
elems = st.builds(lambda n, ks: Elem(n, tuple(sorted(ks.items()))), names,
                  st.dictionaries(names, key_values, max_size=2))
paths = st.builds(lambda es, o: GPath(tuple(es), o), st.lists(elems, min_size=1, max_size=6),
                  st.sampled_from(["", "openconfig"]))


@settings(max_examples=50)
@given(paths)
def test_format_parse_round_trip(p: GPath) -> None:
    assert parse_path(format_path(p)) == p


@settings(max_examples=50)
@given(paths)
def test_proto_round_trip(p: GPath) -> None:
    assert from_proto_path(to_proto_path(p)) == p


@settings(max_examples=50)
@given(paths)
def test_a_path_matches_itself_and_its_parents(p: GPath) -> None:
    assert match(p, p, prefix=False)
    parent = GPath(p.elems[:-1], p.origin)
    assert match(parent, p)
    assert not match(p, parent, prefix=False) or len(p.elems) == 0


def test_key_values_may_hold_slashes_and_escaped_brackets() -> None:
    p = parse_path(r"/interfaces/interface[name=Ethernet1/1]/x[k=a\]b]")
    assert p.elems[1].keys == (("name", "Ethernet1/1"),)
    assert p.elems[2].keys == (("k", "a]b"),)
    assert parse_path(format_path(p)) == p


def test_wildcards() -> None:
    leaf = parse_path("/interfaces/interface[name=eth3]/state/counters/in-octets")
    assert match(parse_path("/interfaces/interface[name=*]/state"), leaf)
    assert match(parse_path("/interfaces/*/state/counters"), leaf)
    assert match(parse_path("/interfaces/interface/state"), leaf)  # no keys = any key
    assert match(parse_path("/.../in-octets"), leaf, prefix=False)
    assert match(parse_path("/interfaces/.../counters"), leaf)
    assert not match(parse_path("/interfaces/interface[name=eth4]"), leaf)
    assert not match(parse_path("/qos"), leaf)
    assert not match(parse_path("/interfaces/interface[name=eth3]/state/counters/in-octets/x"), leaf)


def test_schema_name_and_tags() -> None:
    p = parse_path("/qos/interfaces/interface[interface-id=eth1]/output/queues/queue[name=3]/state/dropped-pkts")
    assert schema_name(p) == "/qos/interfaces/interface/output/queues/queue/state/dropped-pkts"
    assert tags_of(p) == {"interface_interface-id": "eth1", "queue_name": "3"}


@pytest.mark.parametrize("bad", ["/a/b[", "/a/b[k]", "/a/b[=v]", "/a//b", "/a/b]x", "/a/b[k=v]x", "/a[k=1][k=2]"])
def test_malformed_paths_name_the_problem(bad: str) -> None:
    with pytest.raises(PathSyntaxError) as ei:
        parse_path(bad, source="cfg.yaml: subscriptions.x.paths[0]")
    assert "cfg.yaml: subscriptions.x.paths[0]" in str(ei.value) and repr(bad) in str(ei.value)


def test_proto_paths_with_bad_element_names_are_rejected() -> None:
    with pytest.raises(PathSyntaxError):
        from_proto_path(gnmi_pb2.Path(elem=[gnmi_pb2.PathElem(name="a/b")]))
    with pytest.raises(PathSyntaxError):
        from_proto_path(gnmi_pb2.Path(element=["legacy"]))


values = st.one_of(st.integers(0, 2**64 - 1), st.integers(-(2**63), -1), st.floats(allow_nan=False),
                   st.booleans(), st.text(max_size=20))


@settings(max_examples=60)
@given(st.integers(0, 2**63 - 1), st.lists(st.tuples(paths, values), max_size=5), names,
       st.sampled_from(["typed", "json_ietf"]))
def test_hand_encoder_matches_protobuf(ts: int, ups: list[tuple[GPath, object]], target: str, enc: str) -> None:
    wire = encode_notification(ts, prefix_bytes(target), [(path_bytes(p), v) for p, v in ups], enc)  # type: ignore[misc]
    resp = gnmi_pb2.SubscribeResponse.FromString(wire)
    n = resp.update
    assert n.timestamp == ts and n.prefix.target == target
    assert len(n.update) == len(ups)
    for u, (p, v) in zip(n.update, ups, strict=True):
        assert from_proto_path(u.path) == p
        assert u.val == typed_value(v, enc)  # type: ignore[arg-type]
        got = decode_value(u.val)
        assert got == v and type(got) is type(v)
    # the bytes-level flattener the collector uses agrees with the protobuf-object one,
    # on our hand-encoded bytes and on protobuf's own serialization
    slow = Flattener().flatten(n)
    assert WireFlattener().flatten(wire) == (slow, False)
    assert WireFlattener().flatten(resp.SerializeToString()) == (slow, False)


def test_wire_flattener_falls_back_for_deletes_errors_and_sync() -> None:
    p = to_proto_path(parse_path("/interfaces/interface[name=eth1]/state/oper-status"))
    n = gnmi_pb2.Notification(timestamp=3, prefix=gnmi_pb2.Path(target="t"), delete=[p],
                              update=[gnmi_pb2.Update(path=p, val=gnmi_pb2.TypedValue(string_val="UP"))])
    wire = gnmi_pb2.SubscribeResponse(update=n).SerializeToString()
    assert WireFlattener().flatten(wire) == (Flattener().flatten(n), False)
    sync = gnmi_pb2.SubscribeResponse(sync_response=True).SerializeToString()
    assert WireFlattener().flatten(sync) == ([], True)
    with pytest.raises(ValueError):
        WireFlattener().flatten(gnmi_pb2.SubscribeResponse(error=gnmi_pb2.Error(message="boom")).SerializeToString())


def test_flattener_emits_one_event_per_update_with_target_and_tags() -> None:
    p = parse_path("/interfaces/interface[name=eth1]/state/counters/in-octets")
    wire = encode_notification(5, prefix_bytes("leaf-1"), [(path_bytes(p), 42), (path_bytes(p), 43)])
    ev = Flattener().flatten(gnmi_pb2.SubscribeResponse.FromString(wire).update)
    assert [(e.name, e.target, dict(e.tags), e.value, e.ts_ns) for e in ev] == [
        ("/interfaces/interface/state/counters/in-octets", "leaf-1", {"interface_name": "eth1"}, 42, 5),
        ("/interfaces/interface/state/counters/in-octets", "leaf-1", {"interface_name": "eth1"}, 43, 5),
    ]


# ---------------------------------------------------------------- fuzz (tests/fuzzing.py settings)
_SPECIAL = "]=/\\:[*. \t"
# Small fixed alphabets (no filters): ASCII letters, the grammar's special characters and a
# few non-ASCII ones, so 10,000 examples stay quick on a shared CI core.
_WORD = "abcxyz019-_.é中"
fz_names = st.text(alphabet=_WORD + "=:*\\", min_size=1, max_size=8)
fz_key_names = st.text(alphabet=_WORD + ":*\\", min_size=1, max_size=6)
# key values may hold anything; bias towards the characters the grammar gives meaning to
fz_values = st.text(alphabet=_WORD + _SPECIAL + "\n\x7f", max_size=8)
fz_origins = st.one_of(st.just(""), st.text(alphabet=_WORD + "=*", min_size=1, max_size=6))
fz_elems = st.builds(lambda n, ks: Elem(n, tuple(sorted(ks.items()))), fz_names,
                     st.dictionaries(fz_key_names, fz_values, max_size=2))
fz_paths = st.builds(lambda es, o: GPath(tuple(es), o), st.lists(fz_elems, max_size=4), fz_origins)


@pytest.mark.slow
@fuzz_settings()
@given(fz_paths)
def test_fuzz_parse_inverts_format_incl_special_key_values(p: GPath) -> None:
    assert parse_path(format_path(p)) == p


@pytest.mark.slow
@fuzz_settings()
@given(fz_paths, st.integers(0, 2**32 - 1))
def test_fuzz_non_canonical_spellings_parse_to_the_same_path_and_format_canonically(
        p: GPath, seed: int) -> None:
    rnd = random.Random(seed)  # cheaper than st.randoms() for many small choices
    # the spellings a user may type: surrounding blanks, a trailing '/', keys in any order,
    # needless escapes, no leading '/' -- all mean the same path
    parts = []
    for e in p.elems:
        keys = list(e.keys)
        rnd.shuffle(keys)
        ks = ""
        for k, v in keys:
            esc = "".join(("\\" + c) if c in "]\\" or rnd.random() < 0.2 else c for c in v)
            ks += f"[{k}={esc}]"
        parts.append(e.name + ks)
    body = "/".join(parts)
    lead = "/" if p.origin or not p.elems or ":" in p.elems[0].name or rnd.random() < 0.5 else ""
    text = (f"{p.origin}:" if p.origin else "") + lead + body
    if p.elems and rnd.random() < 0.5:
        text += "/"
    text = rnd.choice(["", " ", "\t"]) + text + rnd.choice(["", " ", "\n"])
    got = parse_path(text)
    assert got == p
    assert format_path(got) == format_path(p)
    assert format_path(parse_path(format_path(p))) == format_path(p)


@pytest.mark.slow
@fuzz_settings()
@given(st.text(alphabet=_WORD + _SPECIAL + "\n\x00\u2028", max_size=40))
def test_fuzz_arbitrary_text_is_a_path_or_one_config_error(text: str) -> None:
    try:
        p = parse_path(text, source="fuzz")
    except ConfigError as exc:
        assert str(exc).startswith("fuzz: ")
        return
    assert isinstance(p, GPath)
    assert parse_path(format_path(p)) == p  # whatever parses, formats to something that parses back


def test_regression_colon_space_slash_is_an_error_not_a_silent_rewrite() -> None:
    # was parsed as element ': ' and formatted '/: ' which parsed back as ':'
    with pytest.raises(PathSyntaxError, match="bad character ' '"):
        parse_path(": /")
    assert parse_path("/a:b") == GPath((Elem("a:b"),))
    assert format_path(parse_path("oc:/a:b")) == "oc:/a:b"


def test_errors_never_echo_a_huge_path_whole() -> None:
    with pytest.raises(PathSyntaxError) as ei:
        parse_path("/a" * 20_000 + "[")
    assert len(str(ei.value)) < 400


def test_match_is_polynomial_in_ellipses() -> None:
    # backtracking took exponential time in the number of '...' (a hostile Subscribe)
    leaf = parse_path("/a/b/c/d/e/f/g/h/i/j/k/l")
    pat = GPath((*(Elem("...") if k % 2 == 0 else Elem("*") for k in range(40)), Elem("zz")))
    assert not match(pat, leaf)
    pat2 = GPath((*(Elem("...") for _ in range(200)), Elem("l")))
    assert match(pat2, leaf, prefix=False)
    assert match(parse_path("/.../c/.../f/..."), leaf, prefix=False)
    assert not match(parse_path("/.../f/.../c"), leaf, prefix=False)
