"""core/frozen_heap.py: the collector is off inside the block, the heap is frozen after it, and the collector's
state is restored, also when the block raises."""

from __future__ import annotations

import gc

import pytest

from r3_rllib.core.frozen_heap import collector_off_then_frozen


@pytest.fixture
def unfrozen():
    """Leave the test process as it was: unfreeze what the test froze (the import-time freezes of other modules
    are undone too, which costs later collections time but changes nothing they return)."""
    enabled = gc.isenabled()
    yield
    gc.unfreeze()
    (gc.enable if enabled else gc.disable)()


def test_the_block_runs_without_collections_and_what_it_made_is_frozen(unfrozen):
    gc.enable()
    gc.unfreeze()
    with collector_off_then_frozen():
        assert not gc.isenabled()
        made = [object() for _ in range(1000)]
    assert gc.isenabled()
    assert gc.get_freeze_count() >= len(made)


def test_a_block_that_raises_still_restores_the_collector(unfrozen):
    gc.enable()
    with pytest.raises(ImportError):
        with collector_off_then_frozen():
            raise ImportError("an optional package is missing")
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off(unfrozen):
    gc.disable()
    with collector_off_then_frozen():
        pass
    assert not gc.isenabled()
