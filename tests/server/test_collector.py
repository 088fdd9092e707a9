"""A serving process freezes the garbage collector's view of what existed at start, and gives it back."""

import gc

from tests.helpers.scale_models import write_scale_model
from triton_nb.serving import serve


def test_the_first_server_freezes_and_the_last_one_unfreezes(tmp_path):
    write_scale_model(tmp_path)
    assert gc.get_freeze_count() == 0
    with serve(tmp_path) as first:
        assert gc.get_freeze_count() > 0  # the models, the data, the libraries: out of the full passes' walk
        with serve(tmp_path) as second:
            assert gc.get_freeze_count() > 0
        assert gc.get_freeze_count() > 0  # the first one still serves
        assert first.is_server_live() and not second.is_server_live()
    assert gc.get_freeze_count() == 0


def test_freeze_gc_false_leaves_the_collector_alone(tmp_path):
    write_scale_model(tmp_path)
    with serve(tmp_path, freeze_gc=False):
        assert gc.get_freeze_count() == 0


def test_a_freeze_the_process_made_itself_is_left_in_place(tmp_path):
    write_scale_model(tmp_path)
    gc.freeze()
    try:
        with serve(tmp_path):
            pass
        assert gc.get_freeze_count() > 0  # not unfrozen by the server
    finally:
        gc.unfreeze()
