"""inferd.admission.backlog: per-tenant FIFOs, their totals, and which queued work is shed for a newcomer."""
import math

from inferd.admission.backlog import Backlog
from inferd.admission.ticket import Ticket
from inferd.config.tenants import PriorityClass
from inferd.types import GenerationRequest, SamplingParams

I, S, B = PriorityClass.INTERACTIVE, PriorityClass.STANDARD, PriorityClass.BATCH
_seq = iter(range(1, 10**9))


def ticket(tenant, cls=S, prompt=10, max_tokens=6):
    seq = next(_seq)
    r = GenerationRequest(request_id=f"r{seq}", prompt_token_ids=tuple(range(prompt)),
                          sampling=SamplingParams(max_tokens=max_tokens), tenant=tenant)
    return Ticket(r, cls, float(prompt + 2 * max_tokens), math.inf, math.inf, 0.0, seq, None)


def test_totals_follow_appends_and_removals():
    backlog = Backlog()
    a1, a2, b1 = ticket("a"), ticket("a"), ticket("b")
    for t in (a1, a2, b1):
        backlog.append(t)
    assert (backlog.requests, backlog.total_tokens, backlog.tokens["a"], backlog.cost["a"]) == (3, 48, 32, 44.0)
    assert backlog.backlogged(besides="a") == ["b"]
    backlog.remove(a1)
    backlog.remove(b1)
    assert (backlog.requests, backlog.total_tokens, backlog.total_cost()) == (1, 16, 22.0)
    assert backlog.backlogged(besides="a") == []


def test_shedding_takes_batch_first_from_the_tenant_most_over_its_share_newest_first():
    backlog = Backlog()
    old_x, new_x, y, std = ticket("x", B), ticket("x", B), ticket("y", B), ticket("s", S)
    for t in (old_x, new_x, y, std):
        backlog.append(t)
    counters = {"x": 50.0, "y": 10.0}.get
    assert backlog.shed_for(ticket("i", I), 1, 0, lambda n: counters(n, 0.0)) == [new_x]
    assert backlog.shed_for(ticket("i", I), 3, 0, lambda n: counters(n, 0.0)) == [new_x, old_x, y]
    assert backlog.shed_for(ticket("i", I), 4, 0, lambda n: counters(n, 0.0)) == [new_x, old_x, y, std]
    assert backlog.shed_for(ticket("i", I), 5, 0, lambda n: counters(n, 0.0)) is None   # not enough to free
    assert backlog.shed_for(ticket("s", S), 4, 0, lambda n: 0.0) is None                 # never its own class
    assert backlog.shed_for(ticket("b", B), 1, 0, lambda n: 0.0) is None
