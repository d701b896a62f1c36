"""Signal handling of the agent loops: SIGTERM/SIGINT must stop a loop whatever the main
thread is doing when the signal comes."""

from __future__ import annotations

import signal
import threading

from mpib_agent._policy import signal_setter


def test_signal_setter_does_not_block_while_the_event_lock_is_held() -> None:
    # Inside stop.wait() the main thread holds the event's internal lock (CPython's
    # Event._cond, a Condition over a plain Lock) for a moment; a handler that called
    # stop.set() there would wait for that lock forever. The handler must return at once, and
    # the event must be set once the lock is released.
    stop = threading.Event()
    handler = signal_setter(stop)
    returned = threading.Event()

    def signal_arrives_inside_wait() -> None:
        with stop._cond:  # type: ignore[attr-defined]  # what Event.wait holds
            handler(signal.SIGTERM, None)
            returned.set()

    t = threading.Thread(target=signal_arrives_inside_wait, daemon=True)
    t.start()
    t.join(5)
    assert returned.is_set(), "the handler blocked on the event's own lock"
    assert stop.wait(5), "the event was never set"


def test_signal_setter_sets_the_event() -> None:
    stop = threading.Event()
    signal_setter(stop)(signal.SIGINT, None)
    assert stop.wait(5)
