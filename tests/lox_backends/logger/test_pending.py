"""Logs waiting for the router's tick (lox_backends/logger/pending.py): which items leave
together (`Waiting.take`), and the parts they become (`Departure.parts`), each checked
against arrays written by hand."""

import jax
import jax.numpy as jnp
import numpy as np

import lox
from lox_backends.logger import pending
from lox_backends.logger.pending import Waiting


def batch(x, steps=None, key="x") -> lox.logdict:
    return lox.logdict({key: np.asarray(x)}, None if steps is None else {"step": {key: np.asarray(steps)}})


def shown(part) -> tuple:
    """A part as plain lists: (runs, batch_ndim, values, steps)."""
    values = {k: np.asarray(v).tolist() for k, v in part.logs.items()}
    steps = {name: {k: np.asarray(s).tolist() for k, s in per_key.items()} for name, per_key in part.logs.steps.items()}
    return part.runs.tolist(), part.batch_ndim, values, steps


def all_parts(waiting: Waiting) -> list[list[tuple]]:
    """Each departure's parts, shown; failing if a departure reports an error."""
    out = []
    for departure in waiting.take():
        parts, error = departure.parts()
        assert error is None, error
        out.append([shown(part) for part in parts])
    return out


def test_vmapped_batches_of_one_structure_leave_as_one_part_stacked_along_their_event_axis():
    waiting = Waiting()
    for k in range(3):  # two runs (seeds), two events a call
        x = [[10 * k, 10 * k + 1], [100 + 10 * k, 100 + 10 * k + 1]]
        waiting.add_batch(1, np.array([0, 1]), batch(x, [[2 * k, 2 * k + 1]] * 2))
    assert all_parts(waiting) == [[(
        [0, 1], 1,
        {"x": [[0, 1, 10, 11, 20, 21], [100, 101, 110, 111, 120, 121]]},
        {"step": {"x": [[0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5]]}},
    )]]
    assert waiting.take() == []  # taken: nothing waits any more


def test_batches_with_two_vmap_axes_stack_after_both():
    waiting = Waiting()
    runs = np.array([[0, 1], [2, 3]])
    waiting.add_batch(2, runs, batch(np.arange(12).reshape(2, 2, 1, 3)))  # one event of shape (3,) per run
    waiting.add_batch(2, runs, batch(np.arange(12, 24).reshape(2, 2, 1, 3)))
    ((part,),) = [d.parts()[0] for d in waiting.take()]
    assert part.runs.tolist() == [[0, 1], [2, 3]] and part.batch_ndim == 2
    assert part.logs["x"].tolist() == [
        [[[0, 1, 2], [12, 13, 14]], [[3, 4, 5], [15, 16, 17]]],
        [[[6, 7, 8], [18, 19, 20]], [[9, 10, 11], [21, 22, 23]]],
    ]


def test_vmapped_batches_of_other_keys_runs_or_shapes_leave_separately_in_order():
    waiting = Waiting()
    seeds, others = np.array([0, 1]), np.array([2, 3])
    waiting.add_batch(1, seeds, batch([[1], [2]]))
    waiting.add_batch(1, seeds, batch([[3], [4]]))
    waiting.add_batch(1, seeds, batch([[5], [6]], key="y"))  # another key
    waiting.add_batch(1, others, batch([[7], [8]]))  # other runs (another `init`)
    waiting.add_batch(1, seeds, batch([[[9, 9]], [[10, 10]]]))  # x with another event shape
    waiting.add_batch(1, seeds, batch([[11], [12]], [[0], [0]]))  # x with steps
    assert all_parts(waiting) == [
        [([0, 1], 1, {"x": [[1, 3], [2, 4]]}, {})],
        [([0, 1], 1, {"y": [[5], [6]]}, {})],
        [([2, 3], 1, {"x": [[7], [8]]}, {})],
        [([0, 1], 1, {"x": [[[9, 9]], [[10, 10]]]}, {})],
        [([0, 1], 1, {"x": [[11], [12]]}, {"step": {"x": [[0], [0]]}})],
    ]


def test_batches_of_single_runs_leave_together_as_one_part_per_run_in_arrival_order():
    waiting = Waiting()
    waiting.add_batch(0, np.array(1), batch([1.0, 2.0], [0, 1]))
    waiting.add_batch(0, np.array(0), batch([10.0], [0]))
    waiting.add_batch(0, np.array(1), batch([3.0], [2]))
    waiting.add_batch(0, np.array(0), batch([20.0, 30.0], [1, 2], key="y"))  # another key joins the run's part
    (departure,) = waiting.take()
    parts, error = departure.parts()
    assert error is None
    assert [shown(p) for p in parts] == [
        (1, 0, {"x": [1.0, 2.0, 3.0]}, {"step": {"x": [0, 1, 2]}}),
        (0, 0, {"x": [10.0], "y": [20.0, 30.0]}, {"step": {"x": [0], "y": [1, 2]}}),
    ]
    assert all(p.runs.ndim == 0 for p in parts)  # one run's number


def test_a_vmapped_batch_among_single_runs_is_split_into_its_runs():
    waiting = Waiting()
    waiting.add_batch(0, np.array(2), batch([1.0]))
    waiting.add_batch(1, np.array([0, 1]), batch([[5.0, 6.0], [7.0, 8.0]], [[0, 1], [0, 1]]))
    waiting.add_batch(0, np.array(2), batch([2.0]))
    assert all_parts(waiting) == [[
        (2, 0, {"x": [1.0, 2.0]}, {}),
        (0, 0, {"x": [5.0, 6.0]}, {"step": {"x": [0, 1]}}),
        (1, 0, {"x": [7.0, 8.0]}, {"step": {"x": [0, 1]}}),
    ]]


def test_a_vmapped_batch_that_repeats_one_run_gives_that_run_every_elements_events():
    """A state that is not vmapped, with logs that are: one run, each element's events after the other's."""
    waiting = Waiting()
    waiting.add_batch(1, np.array([4, 4]), batch([[1, 2], [3, 4]], [[0, 1], [2, 3]]))
    waiting.add_batch(1, np.array([4, 4]), batch([[5], [6]], [[4], [5]]))
    assert all_parts(waiting) == [[(4, 0, {"x": [1, 2, 3, 4, 5, 6]}, {"step": {"x": [0, 1, 2, 3, 4, 5]}})]]


def test_padded_or_dropping_vmapped_batches_are_split_with_each_runs_padding():
    def count_to(n):
        def body(i):
            lox.log({"x": i * 1.0}, step=i)
            return i + 1

        return jax.lax.while_loop(lambda i: i < n, body, 0)

    _, logs = jax.vmap(lox.spool(count_to, max_events=3))(jnp.array([2, 5]))  # seed 1: 5 events, 2 dropped
    waiting = Waiting()
    waiting.add_batch(1, np.array([0, 1]), logs)
    (departure,) = waiting.take()
    parts, error = departure.parts()
    assert error is None and [(p.runs.tolist(), p.batch_ndim) for p in parts] == [(0, 0), (1, 0)]
    zero, one = (p.logs.trim() for p in parts)
    assert (zero["x"].tolist(), zero.step["x"].tolist(), int(zero.dropped["x"])) == ([0.0, 1.0], [0, 1], 0)
    assert (one["x"].tolist(), one.step["x"].tolist(), int(one.dropped["x"])) == ([0.0, 1.0, 2.0], [0, 1, 2], 2)


def test_device_arrays_leave_as_numpy_arrays():
    waiting = Waiting()
    waiting.add_batch(1, np.array([0, 1]), lox.logdict({"x": jnp.array([[1.0], [2.0]])}))  # stacked alone
    waiting.add_batch(0, np.array(0), lox.logdict({"y": jnp.array([3.0])}))  # split
    for departure in waiting.take():
        for part in departure.parts()[0]:
            assert all(isinstance(leaf, np.ndarray) for leaf in jax.tree_util.tree_leaves(part.logs)), part


def event(values, steps, batch_ndim=1) -> lox.logdict:
    """One tapped event per vmap element, as the tap hands it over: an event axis after the vmap axes."""
    expand = lambda a: np.expand_dims(np.asarray(a), batch_ndim)  # noqa: E731
    return lox.logdict({"x": expand(values)}, {"step": {"x": expand(steps)}})


def test_tapped_events_leave_as_one_part_per_run_with_only_the_events_each_run_took():
    waiting = Waiting()
    runs = np.array([0, 1, 2])
    took = [[True, True, False], [True, False, False], [False, True, False]]  # run 2 (a cond's other branch) never
    for k in range(3):
        waiting.add_events(1, runs, event([k, 10 + k, 20 + k], [k, k, k]), np.array(took[k]))
    assert all_parts(waiting) == [[
        (0, 0, {"x": [0, 1]}, {"step": {"x": [0, 1]}}),
        (1, 0, {"x": [10, 12]}, {"step": {"x": [0, 2]}}),
    ]]


def test_events_outside_vmap_leave_as_one_part_of_their_run():
    waiting = Waiting()
    for k in range(3):
        waiting.add_events(0, np.array(3), event(0.5 * k, k, batch_ndim=0), np.array(True))
    assert all_parts(waiting) == [[(3, 0, {"x": [0.0, 0.5, 1.0]}, {"step": {"x": [0, 1, 2]}})]]


def test_events_and_batches_leave_in_arrival_order_events_of_another_structure_apart():
    waiting = Waiting()
    runs, took = np.array([0, 1]), np.array([True, True])
    waiting.add_events(1, runs, event([1, 2], [0, 0]), took)
    waiting.add_events(1, runs, event([3, 4], [1, 1]), took)
    waiting.add_batch(1, runs, batch([[5], [6]], [[2], [2]]))
    waiting.add_events(1, runs, event([[7, 7], [8, 8]], [3, 3]), took)  # x with another shape
    waiting.add_events(1, runs, event([9, 10], [4, 4]), took)
    assert all_parts(waiting) == [
        [(0, 0, {"x": [1, 3]}, {"step": {"x": [0, 1]}}), (1, 0, {"x": [2, 4]}, {"step": {"x": [0, 1]}})],
        [([0, 1], 1, {"x": [[5], [6]]}, {"step": {"x": [[2], [2]]}})],
        [(0, 0, {"x": [[7, 7]]}, {"step": {"x": [3]}}), (1, 0, {"x": [[8, 8]]}, {"step": {"x": [3]}})],
        [(0, 0, {"x": [9]}, {"step": {"x": [4]}}), (1, 0, {"x": [10]}, {"step": {"x": [4]}})],
    ]


def test_a_key_that_changes_shape_gives_its_run_one_part_per_call():
    waiting = Waiting()
    waiting.add_batch(0, np.array(0), batch([1.0]))
    waiting.add_batch(0, np.array(1), batch([10.0]))
    waiting.add_batch(0, np.array(0), batch([2.0]))
    waiting.add_batch(0, np.array(0), batch([[3.0, 4.0]]))  # run 0's x: now two numbers an event
    waiting.add_batch(0, np.array(1), batch([20.0]))
    assert all_parts(waiting) == [[
        (0, 0, {"x": [1.0]}, {}),
        (0, 0, {"x": [2.0]}, {}),
        (0, 0, {"x": [[3.0, 4.0]]}, {}),
        (1, 0, {"x": [10.0, 20.0]}, {}),  # run 1 is joined all the same
    ]]


def test_an_item_that_cannot_be_split_is_left_out_alone_with_the_first_error():
    waiting = Waiting()
    waiting.add_batch(0, np.array(0), batch([1.0]))
    waiting.add_batch(1, np.array([5, 6]), batch([9.0]))  # two runs, but x holds one element: run 6 has none
    waiting.add_batch(0, np.array(1), batch([2.0]))
    waiting.add_batch(1, np.array([7, 8, 9]), batch([9.0, 9.0]))  # another: run 9 has none
    waiting.add_batch(0, np.array(0), batch([3.0]))
    (departure,) = waiting.take()
    parts, error = departure.parts()
    # Runs 5 and 7 could be split from their items, but each item is left out whole.
    assert [shown(p) for p in parts] == [(0, 0, {"x": [1.0, 3.0]}, {}), (1, 0, {"x": [2.0]}, {})]
    assert isinstance(error, IndexError) and "size 1" in str(error)  # the first item's, not the second's


def test_an_event_that_cannot_be_split_is_left_out_alone():
    waiting = Waiting()
    runs = np.array([0, 1])
    waiting.add_events(1, runs, event([1, 2], [0, 0]), np.array([True, True]))
    waiting.add_events(1, runs, event([3, 4], [1, 1]), np.array([True]))  # a mask for one element of two
    waiting.add_events(1, runs, event([5, 6], [2, 2]), np.array([True, False]))
    (departure,) = waiting.take()
    parts, error = departure.parts()
    assert [shown(p) for p in parts] == [
        (0, 0, {"x": [1, 5]}, {"step": {"x": [0, 2]}}),
        (1, 0, {"x": [2]}, {"step": {"x": [0]}}),
    ]
    assert isinstance(error, IndexError)


def test_adding_says_when_enough_waits_to_send_without_waiting_for_the_tick():
    assert pending.MAX_WAITING == 256
    waiting = Waiting()
    said = [waiting.add_batch(0, np.array(0), batch([float(i)])) for i in range(200)]
    said += [waiting.add_events(0, np.array(0), event(1.0, 0, batch_ndim=0), np.array(True)) for _ in range(56)]
    assert said == [False] * 255 + [True]
    assert len(waiting.take()) == 2 and waiting.take() == []
    assert waiting.add_batch(0, np.array(0), batch([0.0])) is False  # counted again from nothing

