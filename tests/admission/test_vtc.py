"""inferd.admission.vtc: weighted virtual token counters, lifting, class shares and the pick among queue heads."""
import math

import pytest

from inferd.admission.ticket import Ticket
from inferd.admission.vtc import FairOrder
from inferd.config.tenants import AdmissionConfig, PriorityClass
from inferd.types import GenerationRequest, SamplingParams

I, S, B = PriorityClass.INTERACTIVE, PriorityClass.STANDARD, PriorityClass.BATCH


def ticket(tenant, seq, cls=S):
    r = GenerationRequest(request_id=f"r{seq}", prompt_token_ids=(1, 2), sampling=SamplingParams(max_tokens=4),
                          tenant=tenant)
    return Ticket(r, cls, 10.0, math.inf, math.inf, 0.0, seq, None)


def test_counter_grows_by_served_cost_divided_by_weight():
    order = FairOrder()
    order.charge("a", S, 30.0, 3.0)
    order.charge("b", S, 30.0, 1.0)
    assert order.counter("a") == 10.0 and order.counter("b") == 30.0 and order.counter("idle") == 0.0


def test_a_tenant_becoming_backlogged_is_lifted_to_the_smallest_backlogged_counter_never_lowered():
    order = FairOrder()
    order.charge("a", S, 10.0, 1.0)
    order.charge("b", S, 4.0, 1.0)
    order.lift("c", ["a", "b"])
    assert order.counter("c") == 4.0
    order.charge("d", S, 50.0, 1.0)
    order.lift("d", ["a", "b"])
    assert order.counter("d") == 50.0


def test_with_nobody_else_backlogged_the_last_minimum_seen_is_the_floor():
    order = FairOrder()
    order.charge("a", S, 10.0, 1.0)
    order.charge("b", S, 4.0, 1.0)
    order.note_floor(["a", "b"])
    order.lift("c", [])
    assert order.counter("c") == 4.0


def test_a_waiting_lower_class_gets_its_reserved_share_of_cost_served_since_it_began_waiting():
    order = FairOrder()
    share = AdmissionConfig(standard_reserved_share=0.1).reserved_share
    order.charge("s", S, 1000.0, 1.0)            # served before it waited: does not count
    order.joined(S)
    assert order.next_class({I, S}, share) is I   # nothing served since: nothing owed
    order.charge("i", I, 90.0, 1.0)
    assert order.next_class({I, S}, share) is S   # 0 of 90 < 10%
    order.charge("s", S, 10.0, 1.0)
    assert order.next_class({I, S}, share) is I   # 10 of 100: its share is met
    order.left(S)
    order.joined(S)                               # waiting anew: counted from now
    order.charge("i", I, 5.0, 1.0)
    assert order.next_class({I, S}, share) is S


def test_pick_light_tenants_first_then_the_smallest_counter_then_the_shorter_queue():
    order = FairOrder()
    policy = AdmissionConfig()
    order.charge("a", S, 5.0, 1.0)
    order.charge("b", S, 9.0, 1.0)
    heads = [ticket("a", 1), ticket("b", 2), ticket("c", 3, cls=B)]
    queued = {"a": 3, "b": 1, "c": 1}.__getitem__
    assert order.pick(heads, policy, lambda n: False, queued).tenant == "a"
    assert order.pick(heads, policy, lambda n: n == "b", queued).tenant == "b"
    order.charge("a", S, 4.0, 1.0)                # a tie at 9: the shorter queue goes first
    assert order.pick(heads, policy, lambda n: False, queued).tenant == "b"


def test_fcfs_picks_the_oldest_head_whatever_the_counters():
    order = FairOrder()
    order.charge("a", S, 100.0, 1.0)
    heads = [ticket("b", 7), ticket("a", 3, cls=B)]
    assert order.pick(heads, AdmissionConfig(scheduling="fcfs"), lambda n: False, lambda n: 1).tenant == "a"


@pytest.mark.parametrize("cls", [I, S, B])
def test_a_class_alone_is_served(cls):
    assert FairOrder().next_class({cls}, AdmissionConfig().reserved_share) is cls
