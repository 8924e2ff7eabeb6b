"""Helpers shared by the backend tests: small logdicts and an exact comparison."""

import numpy as np

import lox


def event(step, **values):
    """A one-event logdict of `values` at `step`."""
    return lox.logdict(
        {k: np.asarray([v]) for k, v in values.items()},
        steps={"step": {k: np.array([step]) for k in values}},
    )


def assert_logs_equal(got, want):
    """Same keys in the same order, same dtypes, values and steps, exactly."""
    assert list(got) == list(want)
    for key in want:
        g, w = np.asarray(got[key]), np.asarray(want[key])
        assert g.dtype == w.dtype, key
        np.testing.assert_array_equal(g, w, err_msg=key)
        assert got.step_names(key) == want.step_names(key), key
        for name in want.step_names(key):
            g, w = np.asarray(got.steps[name][key]), np.asarray(want.steps[name][key])
            assert g.dtype == w.dtype, (name, key)
            np.testing.assert_array_equal(g, w)
