"""The sharding layer's private torch names still exist (project/extras/sharding/lightning_private.py)."""

from project.extras.sharding import lightning_private


def test_the_private_checkpoint_names_still_exist():
    assert lightning_private.EMPTY_LOAD_PLANNER.__name__ == "_EmptyStateDictLoadPlanner"
    assert callable(lightning_private.load_without_process_group)
