"""The MQTT mapping (adapters/mapping.py): messages → CloudEvents or dead letters, queries →
topic filters, and the topic-filter algebra, checked against paho's own topic matcher."""

from __future__ import annotations

import itertools
import json
from fnmatch import fnmatchcase

import pytest
from hypothesis import assume, given, reject, settings
from hypothesis import strategies as st
from paho.mqtt.client import topic_matches_sub

from adapters.backends.boolean import Filter, FilterLanguage
from adapters.mapping import (
    KEPT,
    Mapped,
    Mapping,
    MappingConfigError,
    Packet,
    SourceDeadLetter,
    derived_id,
    disjoint,
    generalize,
    overlaps,
    parse_mapping,
    parse_pattern,
    subsumes,
)
from eva.events import from_json_line, parse_time

PLANT = parse_mapping("plant", [
    {"topic": "plant/+line/+sensor/reading", "type": "plant.{sensor}.reading",
     "source": "mqtt://{broker}/{line}", "subject": "{sensor}",
     "time": {"field": "ts", "format": "epoch_ms"}, "id": {"field": "seq"}},
    {"topic": "alarms/#rest", "type": "plant.alarm", "subject": "{rest}", "non_json": "dead-letter"},
    {"topic": "raw/+", "type": "raw.{1}", "retained": "accept"},
])


def mapped(mapping: Mapping, packet: Packet) -> Mapped:
    result = mapping.map(packet)
    assert isinstance(result, Mapped), result
    return result


def dead(mapping: Mapping, packet: Packet) -> SourceDeadLetter:
    result = mapping.map(packet)
    assert isinstance(result, SourceDeadLetter), result
    return result


def query(text: str) -> object:
    node = FilterLanguage().parse(text).node
    assert isinstance(node, Filter)
    return node.predicate


# ------------------------------------------------------------------ messages → events


def test_captures_fill_type_source_subject_and_the_payload_gives_time_id_and_data() -> None:
    event = mapped(PLANT, Packet("plant/l1/temp/reading",
                                 b'{"ts": 1700000000123, "seq": 7, "v": 21.5}', 1, 3)).event
    assert (event.type, event.source, event.id) == ("plant.temp.reading", "mqtt://plant/l1", "7")
    assert event.attributes["subject"] == "temp"
    assert event.attributes["topic"] == "plant/l1/temp/reading"
    assert event.time == 1_700_000_000_123_000
    assert event.data == {"ts": 1700000000123, "seq": 7, "v": 21.5}
    assert event.attributes["datacontenttype"] == "application/json"


def test_a_hash_capture_holds_the_rest_of_the_topic_and_the_time_is_stamped_on_arrival() -> None:
    event = mapped(PLANT, Packet("alarms/hall/3", b'"fire"', 1, 9, arrival_us=5_000_000)).event
    assert (event.type, event.attributes["subject"], event.data) == ("plant.alarm", "hall/3", "fire")
    assert event.source == "mqtt://plant/alarms/hall/3"  # the default source: broker and topic
    assert event.time == 5_000_000


@pytest.mark.parametrize(("fmt", "value", "micros"), [
    ("rfc3339", '"2024-01-02T03:04:05.5+01:00"', parse_time("2024-01-02T02:04:05.5Z")),
    ("epoch_s", "1700000000.25", 1_700_000_000_250_000),
    ("epoch_ms", "1700000000123", 1_700_000_000_123_000),
    ("epoch_us", "1700000000123456", 1_700_000_000_123_456),
])
def test_event_time_from_a_payload_field_in_each_format(fmt: str, value: str, micros: int) -> None:
    mapping = parse_mapping("b", [{"topic": "t", "type": "x", "time": {"field": "m.at", "format": fmt}}])
    event = mapped(mapping, Packet("t", f'{{"m": {{"at": {value}}}}}'.encode(), 1, 1)).event
    assert event.time == micros


@pytest.mark.parametrize(("payload", "reason", "says"), [
    (b'{"seq": 1}', "time", "payload field 'ts' is missing"),
    (b'{"ts": "soon", "seq": 1}', "time", "expected a number (epoch ms)"),
    (b'{"ts": true, "seq": 1}', "time", "expected a number"),
    (b'{"ts": 1e300, "seq": 1}', "time", "outside 0001-01-01T00:00:00Z"),
    (b'{"ts": 1}', "id", "payload field 'seq' is missing"),
    (b'{"ts": 1, "seq": [1]}', "id", "expected a non-empty string or an integer"),
    (b'[1, 2]', "time", "the payload is a JSON list; the rule reads fields of a JSON object"),
    (b'\xff\xfe', "time", "the payload is not JSON"),
])
def test_what_the_rule_cannot_read_is_a_dead_letter_with_the_topic_and_reason(
        payload: bytes, reason: str, says: str) -> None:
    letter = dead(PLANT, Packet("plant/l1/temp/reading", payload, 1, 1))
    assert (letter.broker, letter.topic, letter.reason) == ("plant", "plant/l1/temp/reading", reason)
    assert says in letter.detail
    assert letter.record()["topic"] == "plant/l1/temp/reading"


def test_non_json_payloads_become_data_base64_or_dead_letters_by_choice() -> None:
    event = mapped(PLANT, Packet("raw/x", b"\x00\x01binary", 1, 1)).event
    assert event.data is None
    assert event.attributes["data_base64"] == "AAFiaW5hcnk="
    assert event.attributes["datacontenttype"] == "application/octet-stream"
    letter = dead(PLANT, Packet("alarms/a", b"not json", 1, 1))
    assert letter.reason == "payload" and "is not JSON" in letter.detail


def test_a_topic_that_is_not_utf8_or_an_empty_attribute_is_dead_lettered() -> None:
    letter = dead(PLANT, Packet(b"raw/\xff", b"1", 1, 1))
    assert (letter.topic, letter.reason) == ("raw/\\xff", "topic")
    empty = parse_mapping("b", [{"topic": "x/+", "type": "{1}"}])
    assert "type template '{1}' renders empty" in dead(empty, Packet("x/", b"1", 1, 1)).detail


def test_a_message_no_rule_matches_or_an_ignored_retained_one_maps_to_nothing() -> None:
    assert PLANT.map(Packet("elsewhere/x", b"1", 1, 1)) is None
    assert PLANT.map(Packet("alarms/a", b'"x"', 1, 1, retain=True)) is None  # ignored
    assert isinstance(PLANT.map(Packet("raw/a", b"1", 1, 1, retain=True)), Mapped)  # accepted


def test_integers_beyond_64_bits_stay_exact_and_nan_is_not_json() -> None:
    event = mapped(PLANT, Packet("raw/a", b'{"n": 123456789012345678901234567890}', 1, 1)).event
    assert event.data == {"n": 123456789012345678901234567890}
    assert "data_base64" in mapped(PLANT, Packet("raw/a", b"NaN", 1, 1)).event.attributes


def test_derived_ids_are_the_same_for_a_redelivery_and_differ_otherwise() -> None:
    first = Packet("raw/a", b"21.5", 1, 17, arrival_us=1)
    again = Packet("raw/a", b"21.5", 1, 17, arrival_us=999)  # resent after a reconnect
    assert derived_id("b", first, "raw/a") == derived_id("b", again, "raw/a")
    assert derived_id("b", first, "raw/a") != derived_id("b", Packet("raw/a", b"21.5", 1, 18), "raw/a")
    assert derived_id("b", first, "raw/a") != derived_id("b", Packet("raw/a", b"21.6", 1, 17), "raw/a")
    assert derived_id("b", first, "raw/a") != derived_id("b", first, "raw/b")
    assert derived_id("b", first, "raw/a") != derived_id("c", first, "raw/a")
    retained = [Packet("raw/a", b"1", 1, mid, retain=True) for mid in (1, 2)]  # each subscribe
    assert derived_id("b", retained[0], "raw/a") == derived_id("b", retained[1], "raw/a")
    qos0 = [Packet("raw/a", b"1", 0, 0, arrival_us=5, seq=s) for s in (1, 2)]  # never resent
    assert derived_id("b", qos0[0], "raw/a") != derived_id("b", qos0[1], "raw/a")
    assert derived_id("b", Packet("s", b"1", ident="s/17-0"), "s") == "s/17-0"  # a stream entry


def test_coverage_globs_every_type_and_source_the_rules_produce() -> None:
    coverage = PLANT.coverage()
    assert coverage.types == ("plant.*.reading", "plant.alarm", "raw.*")
    assert coverage.sources == ("*",)  # the link is given every logged event of its types
    assert PLANT.sources() == ("mqtt://plant/*",)
    special = parse_mapping("b*", [{"topic": "+", "type": "a[1]?.{1}", "source": "{broker}"}])
    assert special.coverage().types == ("a[[]1][?].*",)
    assert special.sources() == ("b[*]",)


# ------------------------------------------------------------------ the configuration


@pytest.mark.parametrize(("rules", "says"), [
    ([], "expected a non-empty list of rules"),
    ([{"topic": "a/+"}], "rule 1: 'type' is required"),
    ([{"topic": "a/+x+", "type": "t"}], "level 2 '+x+'"),
    ([{"topic": "a/#/b", "type": "t"}], "'#' must be the last level"),
    ([{"topic": "a/b+", "type": "t"}], "must stand at the start of a level"),
    ([{"topic": "+x/+x", "type": "t"}], "the capture name 'x' is used twice"),
    ([{"topic": "a/+x", "type": "t.{y}"}], "unknown reference {y}; topic 'a/+x' offers {x}, {1}"),
    ([{"topic": "a/+", "type": "t.{2}"}], "unknown reference {2}"),
    ([{"topic": "a", "type": "t.{"}], "'{' is not closed"),
    ([{"topic": "a", "type": "t}"}], "a lone '}'"),
    ([{"topic": "a", "type": "t", "colour": 1}], "unknown key(s) colour"),
    ([{"topic": "a", "type": "t", "time": {"field": "ts", "format": "epoch_ns"}}],
     "time.format is 'epoch_ns', expected one of 'rfc3339', 'epoch_s'"),
    ([{"topic": "a", "type": "t", "time": "ts"}], "expected a table {field = \"a.dotted.path\"}"),
    ([{"topic": "a", "type": "t"}, {"topic": "b", "type": "t", "non_json": "drop"}],
     "rule 2: non_json is 'drop', expected one of 'base64', 'dead-letter'"),
])
def test_a_bad_mapping_names_the_rule_the_key_and_what_is_expected(rules: list, says: str) -> None:
    with pytest.raises(MappingConfigError) as caught:
        parse_mapping("plant", rules)
    assert says in str(caught.value)


def test_templates_take_braces_positions_the_topic_and_the_broker() -> None:
    mapping = parse_mapping("b1", [{"topic": "a/+x/#", "type": "{{{x}}}.{2}", "source": "{broker}:{topic}"}])
    event = mapped(mapping, Packet("a/k/l/m", b"1", 1, 1)).event
    assert (event.type, event.source) == ("{k}.l/m", "b1:a/k/l/m")


# ------------------------------------------------------------------ queries → topic filters


@pytest.mark.parametrize(("text", "filters"), [
    ('[type = "plant.temp.reading"]', ("plant/+/temp/reading",)),
    ('[type = "plant.temp.reading" & source = "mqtt://plant/l2"]', ("plant/l2/temp/reading",)),
    ('[type in ["plant.a.reading", "plant.b.reading"]]', ("plant/+/a/reading", "plant/+/b/reading")),
    ('[type = "plant.alarm" & subject = "hall/3"]', ("alarms/hall/3",)),
    ('[topic = "raw/q"]', ("raw/q",)),
    ('[type = "raw.q" | type = "plant.alarm"]', ("alarms/#", "raw/q")),
    ('[data.v > 3]', ("alarms/#", "plant/+/+/reading", "raw/+")),
    ('[type != "raw.q"]', ("alarms/#", "plant/+/+/reading", "raw/+")),
    ('[type = "nothing.here"]', ()),
    ('[type = "eva.tick.T"]', ()),
])
def test_a_query_becomes_the_topic_filters_its_pinned_attributes_read_back_to(
        text: str, filters: tuple[str, ...]) -> None:
    assert PLANT.select(query(text)).filters == filters  # type: ignore[arg-type]


def test_a_query_pinning_an_alarm_subject_of_one_empty_level_selects_parent_and_child() -> None:
    assert PLANT.select(query('[subject = "" & type = "plant.alarm"]')).filters == (  # type: ignore[arg-type]
        "alarms", "alarms/")


def test_an_ambiguous_template_is_read_back_every_way_or_not_at_all() -> None:
    mapping = parse_mapping("b", [{"topic": "+a/+b", "type": "{a}.{b}"}])
    assert mapping.select(query('[type = "x.y.z"]')).filters == ("x.y/z", "x/y.z")  # type: ignore[arg-type]
    long = "." * 200
    assert mapping.select(query(f'[type = "{long}"]')).filters == ("+/+",)  # type: ignore[arg-type]


# ------------------------------------------------------------------ properties

LEVELS = st.sampled_from(["a", "b", "", "$s"])
TOPICS = st.lists(LEVELS, min_size=1, max_size=4).map("/".join)
FILTER_LEVELS = st.sampled_from(["a", "b", "", "+"])


@st.composite
def topic_filters(draw: st.DrawFn) -> str:
    levels = draw(st.lists(FILTER_LEVELS, min_size=1, max_size=3))
    if draw(st.booleans()):
        levels.append("#")
    if draw(st.booleans()) and levels[0] not in ("+", "#"):
        levels[0] = "$s"
    return "/".join(levels) or "a"  # an empty filter is no filter


UNIVERSE = ["/".join(p) for n in range(1, 5) for p in itertools.product(["a", "b", "", "$s"], repeat=n)]


@settings(max_examples=300, deadline=None)
@given(topic_filters(), TOPICS)
def test_patterns_match_topics_as_paho_does(f: str, topic: str) -> None:
    assert (parse_pattern(f).match(topic) is not None) == topic_matches_sub(f, topic)


@settings(max_examples=300, deadline=None)
@given(topic_filters(), topic_filters())
def test_subsumes_overlaps_and_generalize_agree_with_brute_force(f: str, g: str) -> None:
    in_f = {t for t in UNIVERSE if topic_matches_sub(f, t)}
    in_g = {t for t in UNIVERSE if topic_matches_sub(g, t)}
    if subsumes(f, g):
        assert in_g <= in_f
    if in_g and not in_g <= in_f:
        assert not subsumes(f, g)
    assert overlaps(f, g) == bool(in_f & in_g)
    if overlaps(f, g):
        joined = {t for t in UNIVERSE if topic_matches_sub(generalize(f, g), t)}
        assert in_f | in_g <= joined


@settings(max_examples=200, deadline=None)
@given(st.lists(topic_filters(), max_size=6))
def test_disjoint_filters_select_at_least_as_much_and_no_topic_twice(filters: list[str]) -> None:
    out = disjoint(filters)
    for t in UNIVERSE:
        hits = sum(topic_matches_sub(f, t) for f in out)
        assert hits <= 1, (out, t)
        if any(topic_matches_sub(f, t) for f in filters):
            assert hits == 1, (out, t)


RULE_TOPICS = st.sampled_from(["+a/+b", "x/+a", "+a/#b", "x/y", "#a", "+a/+a2/z"])
RULE_TYPES = st.sampled_from(["t.{1}", "{a}", "t", "{topic}", "{a}.{1}", "k"])
SOURCES = st.sampled_from(["{broker}", "s/{a}", "mqtt://{broker}/{topic}"])
SUBJECTS = st.sampled_from([None, "{a}", "sub"])


@st.composite
def mappings(draw: st.DrawFn) -> Mapping:
    rules = []
    for _ in range(draw(st.integers(1, 3))):
        rule = {"topic": draw(RULE_TOPICS), "type": draw(RULE_TYPES), "source": draw(SOURCES)}
        subject = draw(SUBJECTS)
        if subject:
            rule["subject"] = subject
        rules.append(rule)
    try:
        return parse_mapping("b", rules)
    except MappingConfigError:  # a template naming a capture its topic has not
        reject()


@settings(max_examples=300, deadline=None)
@given(mappings(), st.lists(st.sampled_from(["x", "y", "z", "q.r", ""]), min_size=1, max_size=4),
       st.sets(st.sampled_from(["type", "source", "subject", "topic"]), min_size=1))
def test_the_filters_of_a_query_select_every_message_whose_event_it_matches(
        mapping: Mapping, levels: list[str], pinned: set[str]) -> None:
    topic = "/".join(levels)
    assume(topic)  # MQTT has no empty topic
    result = mapping.map(Packet(topic, b"{}", 1, 1))
    if not isinstance(result, Mapped):
        return
    event = result.event
    values = {"type": event.type, "source": event.source, "topic": topic,
              "subject": event.attributes.get("subject")}
    terms = [f"{name} = {json.dumps(values[name])}" for name in sorted(pinned)
             if values[name] is not None]
    if not terms:
        return
    selection = mapping.select(query(f"[{' & '.join(terms)}]"))  # type: ignore[arg-type]
    assert any(topic_matches_sub(f, topic) for f in selection.filters), (topic, selection)
    assert mapping.coverage().observes(event)
    assert any(fnmatchcase(event.source, p) for p in mapping.sources())


PAYLOADS = st.one_of(
    st.binary(max_size=64),
    st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8)),
                 lambda kids: st.one_of(st.lists(kids, max_size=3),
                                        st.dictionaries(st.sampled_from(["ts", "seq", "v", "m"]),
                                                        kids, max_size=3)),
                 max_leaves=8).map(lambda v: json.dumps(v).encode()),
    st.sampled_from([b"[" * 200 + b"]" * 200, b'{"ts": "2024-13-01T00:00:00Z"}', b'"\\ud800"',
                     b'{"seq": 1e400}', b"12345678901234567890123"]),
)
ANY_RULES = parse_mapping("b", [
    {"topic": "+a/#b", "type": "t.{a}", "subject": "{b}", "time": {"field": "ts", "format": "rfc3339"},
     "id": {"field": "seq"}, "retained": "accept"},
    {"topic": "#", "type": "{topic}", "time": {"field": "ts", "format": "epoch_s"}},
    {"topic": "+", "type": "r", "non_json": "dead-letter"},
])


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.text(max_size=12), st.binary(max_size=12)), PAYLOADS,
       st.sampled_from([0, 1]), st.integers(0, 65535), st.booleans(),
       st.integers(-2**70, 2**70))
def test_any_topic_and_payload_map_to_an_event_or_a_dead_letter_never_an_exception(
        topic: str | bytes, payload: bytes, qos: int, mid: int, retain: bool, arrival: int) -> None:
    result = ANY_RULES.map(Packet(topic, payload, qos, mid, retain, arrival % 2**62))
    if isinstance(result, Mapped):
        assert from_json_line(result.line) == result.event
        assert result.event.id and result.event.type and result.event.source
    elif isinstance(result, SourceDeadLetter):
        assert result.reason in ("topic", "payload", "time", "id", "attribute", "malformed")
        assert result.detail and result.broker == "b"
        # The payload whole (up to KEPT): a dead letter is mapped again from it once fixed.
        assert result.payload == payload[:KEPT] and result.size == len(payload)
        assert len(result.record()["payload"]) <= 200  # what a log line shows
    else:
        assert result is None
