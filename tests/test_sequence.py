"""What a worker sent that never came, from the numbers jupyter_client puts in its message ids
(`klbr_supervisor.generation.sequence`), with no kernel: messages that arrive out of order are no drop, a reply
still on its way or answered elsewhere is excused, a run of missing numbers is counted once, what it published
before its iopub had klbr's subscription is not counted, nor the idle the proxy sent in the worker's place."""

from __future__ import annotations

from klbr_supervisor.generation.sequence import Sequence


def _id(n: int, session: str = "6f1c9a2e-41d3c0b7e5a94d2f8e61b0aa") -> str:
    return f"{session}_4242_{n}"


def _came(sequence: Sequence, *numbers: int, iopub: bool = True) -> None:
    for n in numbers:
        sequence.note(_id(n), iopub)


def test_out_of_order_is_no_drop_and_a_gap_is_counted_once():
    sequence = Sequence()
    _came(sequence, 3, 4, 6, 5, 8, 7)  # what it made before klbr listened (0-2) is not counted
    assert sequence.dropped_before(_id(9), awaited=0) == 0
    _came(sequence, 10, 11, 20, 21)
    assert sequence.dropped_before(_id(22), awaited=0) == 8  # 12 to 19
    assert sequence.dropped_before(_id(23), awaited=0) == 0


def test_a_reply_on_its_way_or_answered_elsewhere_is_excused():
    sequence = Sequence()
    _came(sequence, 0, 1, 3)
    assert sequence.dropped_before(_id(4), awaited=1) == 0  # 2: a reply that has not come yet
    _came(sequence, 2)  # and then it does: nothing more to count
    sequence.elsewhere()  # an interrupt's answer goes to jupyter_client's manager
    _came(sequence, 5, 7)
    assert sequence.dropped_before(_id(8), awaited=0) == 0  # 6 was that answer
    _came(sequence, 9)
    assert sequence.dropped_before(_id(11), awaited=0) == 1  # 10: nothing excuses it


def test_what_it_published_before_iopub_was_subscribed_is_no_drop():
    """Under load the worker answers kernel_info on shell before the proxy's subscription reaches its
    iopub: that request's busy and idle go to no one. Counting starts at the first message on iopub."""
    sequence = Sequence()
    _came(sequence, 4, 7, 10, iopub=False)  # three kernel_info replies; 3, 5, 6, 8, 9 went to no one
    _came(sequence, 9)  # the subscription is there: what is made from here on comes, or is dropped
    _came(sequence, 11)  # the idle of the reply 10 (its busy, 9, came before it)
    assert sequence.dropped_before(_id(13), awaited=0) == 1  # 12: after the subscription, a drop
    assert sequence.dropped_before(_id(14), awaited=0) == 0


def test_an_idle_that_never_came_is_no_drop_of_the_next_cell():
    """A cell floods while the kernel is stopped: its worker drops outputs and, the queue still full, its
    idle too. The proxy gives up on that idle after its reply and counts up to the newest that came; the
    idle's number, above it, is the proxy's to replace, and is no drop of the next cell."""
    sequence = Sequence()
    _came(sequence, 0, 1)  # the cell's busy and execute_input
    sequence.note(_id(10), False, "cell-1")  # its reply: 2 to 9 dropped, and its idle, 11
    assert sequence.dropped_before(None, awaited=0, request="cell-1") == 8
    sequence.elsewhere()  # the next cell is interrupted by a message: its reply, 15, goes elsewhere
    _came(sequence, 12, 13, 14, 16)
    sequence.note(_id(17), False, "cell-2")
    assert sequence.dropped_before(_id(18), awaited=0, request="cell-2") == 0
    # When something after the lost idle came before the proxy gave up, the idle is in that count.
    _came(sequence, 19)
    sequence.note(_id(20), False, "cell-3")
    _came(sequence, 22, 23)  # 21, its idle, dropped
    assert sequence.dropped_before(None, awaited=0, request="cell-3") == 0
    _came(sequence, 24)
    assert sequence.dropped_before(_id(26), awaited=0, request="cell-4") == 1  # 25: a drop of this one


def test_another_session_of_the_worker_and_ids_of_no_session_are_not_counted():
    sequence = Sequence()
    _came(sequence, 0, 1)
    sequence.note(_id(7, session="another"), True)
    sequence.note("a-uuid-with-no-count", True)
    assert sequence.dropped_before(_id(2), awaited=0) == 0


def test_a_gap_far_behind_is_counted_and_what_follows_is_not_held():
    sequence = Sequence()
    _came(sequence, 0, *range(100, 10_000))
    assert sequence.dropped_before(None, awaited=0) == 99  # the idle never came: up to the newest
    assert sequence.dropped_before(_id(10_000), awaited=0) == 0
