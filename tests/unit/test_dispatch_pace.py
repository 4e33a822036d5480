"""The dispatch window's pace (timer_service/dispatch_pace.py): a depth per (kind, queue,
tenant), cut when a batch of its jobs waited past the age, grown while none did."""

from __future__ import annotations

from timer_service.dispatch_pace import CUT, GROWTH, Pace

A = ("k", "default", "A")
B = ("k", "default", "B")


def pace() -> Pace:
    return Pace(window=1000, age_seconds=0.25, batch_size=100)


def test_a_tenant_nobody_fell_behind_on_is_bounded_by_the_window_alone():
    p = pace()
    p.update({A: 900}, set(), clock=0.0)
    assert p.rooms({A: 900}) == {}


def test_falling_behind_cuts_the_depth_to_a_share_of_what_waited_once_per_age():
    p = pace()
    p.update({A: 800}, {A}, clock=0.0)
    assert p.depths() == {A: int(CUT * 800)}
    assert p.rooms({A: 800}) == {A: int(CUT * 800) - 800}, "nothing to send until it drains"
    p.update({A: 700}, {A}, clock=0.1)
    assert p.depths() == {A: int(CUT * 800)}, "the same slow batch is not cut for twice"
    p.update({A: 600}, {A}, clock=0.35)
    assert p.depths() == {A: int(CUT * 600)}, "still behind an age later: cut again"


def test_the_depth_never_falls_below_a_batch():
    p = pace()
    for n in range(10):
        p.update({A: 100}, {A}, clock=n * 1.0)
    assert p.depths() == {A: 100}
    assert p.rooms({A: 30}) == {A: 70}


def test_while_consumers_keep_up_the_depth_grows_back_to_the_window_and_is_forgotten():
    p = pace()
    p.update({A: 400}, {A}, clock=0.0)
    p.update({A: 200}, set(), clock=0.25)
    assert p.depths() == {A: int(CUT * 400 + GROWTH * 100)}, "a quarter batch per age"
    p.update({A: 200}, set(), clock=100.0)
    assert p.depths() == {}, "back at the window: the count alone applies again"


def test_what_was_sent_since_the_count_uses_up_the_room():
    p = pace()
    p.update({A: 400}, {A}, clock=0.0)
    assert p.rooms({A: 250}) == {A: 50}
    assert p.rooms({A: 250, B: 50}) == {A: 50}, "a tenant not paced has no room entry"


def test_a_tenant_gone_from_sqs_keeps_its_depth_while_it_grows_back():
    p = pace()
    p.update({A: 400}, {A}, clock=0.0)
    p.update({}, set(), clock=0.25)
    assert A in p.depths(), "drained to nothing, it does not restart at the whole window"


def test_without_an_age_nothing_is_paced():
    p = Pace(window=1000, age_seconds=0.0, batch_size=100)
    p.update({A: 800}, {A}, clock=0.0)
    assert p.rooms({A: 800}) == {}
