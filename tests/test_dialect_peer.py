"""The CG-5 (peer mediator) dialect: EVA → an EVA document, the round trip through the peer's
parser, and a peer's notification taken over exactly (parse_notification)."""

from __future__ import annotations

from adapters.backends.native import run
from adapters.backends.peer import PeerLanguage
from eva import ast
from eva import reference as ref
from eva.events import Event
from eva.parser import parse
from eva.reference import evaluate
from transforms.dialects import dialect
from transforms.dialects.base import Scope
from transforms.plans import Kind, Remote

DOC = parse('class A = type == "a"\n'
            'class B = type == "b" and data.k > 0\n'
            'class AB = A or B\n'
            'class U = type == "u"\n'
            'profile P per data.k = ((all_dup(A); last_dup(AB))_5us)_unique_pairs\n')
PEER = dialect("cg5")
WANT = ('class A = type == "a"\n'
        'class B = type == "b" and data.k > 0\n'
        'class AB = A or B\n'
        'profile R per data.k = ((all_dup(A); last_dup(AB))_5us)_unique_pairs\n')


def test_a_profile_renders_as_a_document_with_the_classes_it_uses() -> None:
    profile = DOC.profiles[0]
    text = PEER.render(profile.expr, DOC, profile)
    assert text == WANT
    assert PeerLanguage().parse(text).doc == parse(WANT)
    eoi = PEER.render(profile.expr, DOC, profile, root_eoi=True)
    assert PeerLanguage().parse(eoi).doc.profiles[0].evaluation is ast.Evaluation.END_OF_INTERVAL
    assert PEER.render(ast.Prim("A"), DOC) == 'class A = type == "a"\nprofile R = A\n'


def test_a_peer_notification_is_taken_over_in_its_partition() -> None:
    profile = DOC.profiles[0]
    trace = [Event("a1", "s", "a", 1, 0, {"k": 1}), Event("a2", "s", "a", 2, 1, {"k": 2}),
             Event("b1", "s", "b", 3, 2, {"k": 1}), Event("b2", "s", "b", 4, 3, {"k": 2})]
    detections = run(PeerLanguage().parse(PEER.render(profile.expr, DOC, profile)), trace, 10)
    remote = Remote(profile.expr, profile.expr, Kind.EQUIVALENT, ("native_operator",), "")
    assert PEER.takes_over(remote)
    want = {n.partition: n.occ for n in evaluate(DOC, trace, end=10)}
    for k in (1, 2):
        ctx = ref.Context([e for e in trace if e.data["k"] == k], DOC, lambda key: True, 0, 10, 1,
                          {}, k)
        got = [occ for d in detections
               for _, occ in PEER.parse_notification(d, remote, Scope.of(ctx)).occurrences]
        assert [(o.key, o.ident, o.events) for o in got] == [
            (want[k].key, want[k].ident, want[k].events)]
