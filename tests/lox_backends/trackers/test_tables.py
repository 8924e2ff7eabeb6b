"""`lox_backends/trackers/tables.py`: a batch table split as trackers take it, the
scalar events as numbers (`scalars`), plain arrays as rows (`arrays`) and the kinds
trackers render as events (`media`: images, histograms, text), against values written
out by hand."""

import numpy as np
import pytest

import lox
from lox_backends.trackers.tables import MediaEvent, Scalars, arrays, file_stems, media, scalars
from lox_core import schema
from lox_core.logdict import NO_STEP


def batch_table():
    """Two steps of a float, a large int64, a complex scalar and a 2-vector; `loss`
    also carries `epoch`, and `acc` has `epoch` only."""
    logs = lox.logdict(
        {
            "loss": np.array([0.5, 0.25], np.float32),
            "big": np.array([2**62 + 1, 3], np.int64),  # beyond float64's integers: kept as bytes
            "z": np.array([1j, 2], np.complex64),
            "w": np.arange(4.0).reshape(2, 2),
            "acc": np.array([0.75]),
        },
        steps={
            "step": {k: np.array([0, 1]) for k in ("loss", "big", "z", "w")},
            "epoch": {"loss": np.array([0, 0]), "acc": np.array([3])},
        },
    )
    return schema.order_by_step(logs.to_arrow(run="r"))


def test_scalars_are_every_real_scalar_event_in_order():
    events = scalars(batch_table())
    # Rows in step order, `acc` (no `step`) last; the complex scalar and the vector are left out.
    assert list(events.keys) == ["loss", "big", "loss", "big", "acc"]
    np.testing.assert_array_equal(events.values, [0.5, float(2**62 + 1), 0.25, 3.0, 0.75])
    np.testing.assert_array_equal(events.steps["step"], [0, 0, 1, 1, NO_STEP])
    np.testing.assert_array_equal(events.steps["epoch"], [0, NO_STEP, 0, NO_STEP, 3])
    assert events.primary == "step"
    assert len(events) == 5


def test_tracker_steps_take_the_primary_step_else_another():
    chosen, besides = scalars(batch_table()).tracker_steps()
    np.testing.assert_array_equal(chosen, [0, 0, 1, 1, 3])  # `acc` at its epoch
    np.testing.assert_array_equal(besides["epoch"], [True, False, True, False, False])  # not where chosen
    np.testing.assert_array_equal(besides["step"], [False] * 5)


def test_by_key_gives_each_keys_events_in_order_of_first_appearance():
    found = scalars(batch_table()).by_key()
    assert list(found) == ["loss", "big", "acc"]
    assert [list(positions) for positions in found.values()] == [[0, 2], [1, 3], [4]]
    # Without a dictionary column, the keys are numbered where they are read.
    plain = Scalars(np.array(["b", "a", "b"], object), np.zeros(3), {}, None)
    assert {k: list(v) for k, v in plain.by_key().items()} == {"b": [0, 2], "a": [1]}


def test_codes_without_names_are_refused():
    events = Scalars(np.array(["a"], object), np.zeros(1), {}, None, codes=np.zeros(1, np.int64))
    with pytest.raises(TypeError, match=r"Scalars.codes are positions in Scalars.names, which is None"):
        events.by_key()


def test_arrays_are_the_rows_scalars_leaves_out():
    rows = arrays(batch_table())
    assert rows.column("key").to_pylist() == ["z", "w", "z", "w"]
    assert rows.column("step").to_pylist() == [0, 0, 1, 1]
    assert [list(shape) for shape in rows.column("shape").to_pylist()] == [[], [2], [], [2]]


def kinds_table():
    """Two steps of a loss, a 2-vector, an image, a histogram and a text; a table of text at step 1 only."""
    pixels = np.arange(2 * 2 * 3, dtype=np.uint8).reshape(2, 2, 3, 1)
    counts, edges = np.array([[1, 2], [3, 0]], np.int32), np.array([[0.0, 0.5, 1.0], [0.0, 1.0, 2.0]], np.float32)
    text = np.array(["first", "second"], np.dtypes.StringDType())
    table = np.array([[["a", "b"], ["c", "d"]]], np.dtypes.StringDType())
    logs = lox.logdict(
        {"loss": np.array([0.5, 0.25]), "w": np.ones((2, 2)), "img": lox.image(pixels),
         "h": lox.histogram(np.zeros(1), bins=2).replace_arrays([counts, edges]), "note": text, "tab": table},
        steps={"step": {"loss": np.array([0, 1]), "w": np.array([0, 1]), "img": np.array([0, 1]),
                        "h": np.array([0, 1]), "note": np.array([0, 1]), "tab": np.array([1])}},
    )
    return schema.order_by_step(logs.to_arrow(run="r")), pixels, counts, edges


def test_scalars_and_arrays_leave_out_every_rendered_kind():
    table, *_ = kinds_table()
    events = scalars(table)  # text rows have shape [] and no value: never a scalar
    assert list(events.keys) == ["loss", "loss"] and events.values.tolist() == [0.5, 0.25]
    rows = arrays(table)  # the histogram's rows are arrays, of kind histogram: left out
    assert rows.column("key").to_pylist() == ["w", "w"]
    # A table of schema version 1 (no kind column): by shape, as before.
    old = batch_table().drop_columns(["kind"])
    assert list(scalars(old).keys) == ["loss", "big", "loss", "big", "acc"]
    assert arrays(old).column("key").to_pylist() == ["z", "w", "z", "w"]


def test_media_gives_each_rendered_event_as_logged():
    table, pixels, counts, edges = kinds_table()
    events = media(table)
    assert [(e.key, e.kind, e.step) for e in events] == [
        ("img", "image", 0), ("img", "image", 1), ("h", "histogram", 0), ("h", "histogram", 1),
        ("note", "text", 0), ("note", "text", 1), ("tab", "text", 1)]
    for i in range(2):
        np.testing.assert_array_equal(events[i].value.pixels, pixels[i])
        np.testing.assert_array_equal(events[2 + i].value.counts, counts[i])
        np.testing.assert_array_equal(events[2 + i].value.edges, edges[i])
    assert events[4].value == "first" and events[5].steps == {"step": 1}
    assert events[6].value.tolist() == [["a", "b"], ["c", "d"]]
    assert media(batch_table()) == [] and media(batch_table().drop_columns(["kind"])) == []


def test_a_batch_of_text_only_has_no_scalar_events_by_key():
    logs = lox.logdict({"note": np.array(["a", "b"], dtype=np.dtypes.StringDType())},
                       steps={"step": {"note": np.array([0, 1])}})
    events = scalars(logs.to_arrow(run="r"))
    assert len(events) == 0 and events.by_key() == {}


def test_file_stems_name_each_event_the_same_at_every_send():
    def event(key, step):
        return MediaEvent(key, "text", "x", {} if step is None else {"step": step}, step)

    events = [event("a", 3), event("a", 3), event("b", 3), event("a", 4), event("a", None), event("a", None)]
    assert file_stems(events, "batch-000007-0a1b2c3d.parquet") == [
        ("step_3", 0), ("step_3-1", 1), ("step_3", 0), ("step_4", 0),
        ("batch-000007-0a1b2c3d-0", 0), ("batch-000007-0a1b2c3d-1", 1)]
