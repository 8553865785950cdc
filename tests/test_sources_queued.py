"""A queued resource's own state, in words (pure: no gcloud)."""

from __future__ import annotations

import pytest

from multihost.sources.queued import NotReady, QueuedState, state_of, wait_until_ready
from tests.gcloud_fixtures import make_node


def qr(state: dict[str, object], count: int = 2) -> dict[str, object]:
    spec = {"multisliceParams": {"nodeCount": count}} if count > 1 else {"nodeId": "q"}
    return {
        "name": "projects/p/locations/z/queuedResources/q",
        "state": state,
        "tpu": {"nodeSpec": [spec]},
    }


def test_state_reason_and_ready_slices() -> None:
    nodes = [
        make_node("q-0", "v4-16", ["10.0.0.2"], queued_resource="q"),
        make_node("q-1", "v4-16", [], state="CREATING", queued_resource="q"),
    ]
    found = state_of(qr({"state": "PROVISIONING"}), nodes)
    assert (
        found.describe() == "queued resource q is PROVISIONING: 1/2 slices ready "
        "(q-0 READY, q-1 CREATING)"
    )
    failed = state_of(qr({"state": "FAILED", "failedData": {"error": {"message": "no room"}}}), [])
    assert failed.describe() == "queued resource q is FAILED (no room): 0/2 slices ready"
    assert not failed.waitable
    suspended = state_of(qr({"state": "SUSPENDED", "stateInitiator": "SERVICE"}, 1), [])
    assert (
        suspended.describe() == "queued resource q is SUSPENDED (by the service): 0/1 slices ready"
    )


def test_wait_stops_at_a_final_state_and_says_each_new_one() -> None:
    said: list[str] = []
    states = iter(["ACCEPTED", "ACCEPTED", "PROVISIONING", "FAILED"])

    def find() -> None:
        raise NotReady(QueuedState("q", next(states), None, 0, 1))

    with pytest.raises(NotReady, match="is FAILED"):
        wait_until_ready(find, 60, said.append, poll=0.01)
    assert [s.split(": ", 1)[1] for s in said] == [
        "queued resource q is ACCEPTED: 0/1 slices ready",
        "queued resource q is PROVISIONING: 0/1 slices ready",
    ]
    assert said[0].startswith("waiting (0 s): ")


def test_wait_gives_up_after_its_seconds() -> None:
    def find() -> None:
        raise NotReady(QueuedState("q", "WAITING_FOR_RESOURCES", None, 0, 1))

    with pytest.raises(NotReady, match="gave up waiting after"):
        wait_until_ready(find, 0.05, lambda _: None, poll=0.02)
