"""The interpreter's rules, one primitive at a time (`lox_core.interpreter`).

Each higher-order primitive lox rebuilds has a case here: a program with a
log inside that primitive, and its events and output computed by hand. Every
transform is held to them: `spool` collects exactly those events, `tap`
delivers them in that order, `nolog` computes the same output, and the
gradient goes through unchanged. A rule without a case fails
`test_every_rule_has_a_case`: adding a primitive means adding its case here.
The primitive objects and parameter readers the rules use are
`lox_core/_compat.py`'s, and the equations lox leaves alone are emitted by
`lox_core/segments.py`: both are held here.
"""

from __future__ import annotations

import ast
import dataclasses
import pathlib
import re
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from devices import DEVICES
from logs_testing import assert_logs_equal, logs_of_events, tapped

import lox
from lox_core import _compat, interpreter, segments


@dataclasses.dataclass
class Case:
    fun: Callable  # f(x) for a float32 vector x, logging inside the primitive
    out: Callable  # its output, by hand (NumPy)
    events: Callable  # its events in program order, by hand: [(values, steps)]
    spool: dict = dataclasses.field(default_factory=dict)  # options `spool` needs (max_events)
    spools: bool = True  # whether `spool` can collect the events (not in shard_map)


def _jit(x):
    y = jax.jit(lambda x: (lox.log({"y": x * 2}, step=1), x * 2)[1])(x)
    return y + 1


def _scan(x):
    def step(c, vi):
        v, i = vi
        c = c + v
        lox.log({"c": c}, step=i)
        return c, c * 2

    c, ys = jax.lax.scan(step, 0.0, (x, jnp.arange(x.shape[0])))
    return c + ys.sum()


def _scan_events(x):
    c, events = 0.0, []
    for i, v in enumerate(x):
        c += v
        events.append(({"c": c}, {"step": i}))
    return events


def _while(x):
    def body(carry):
        i, s = carry
        lox.log({"s": s}, step=i)
        return i + 1, s + x[i]

    return jax.lax.while_loop(lambda carry: carry[0] < x.shape[0], body, (0, 0.0))[1]


def _cond(x):
    return jax.lax.cond(
        x.sum() > 0,
        lambda x: (lox.log({"v": x.sum()}, step=3), x * 2)[1],
        lambda x: (lox.log({"v": -x.sum()}, step=4), x * 3)[1],
        x,
    )


def _remat(x):
    return jax.checkpoint(lambda x: (lox.log({"r": jnp.sin(x)}, step=5), jnp.sin(x) * 2)[1])(x)


@jax.custom_jvp
def _scaled(x):
    lox.log({"primal": x}, step=7)
    return 3.0 * x


_scaled.defjvp(lambda p, t: (_scaled(p[0]), 3.0 * t[0]))


@jax.custom_vjp
def _clipped(x):
    lox.log({"primal": x}, step=8)
    return x * 4.0


_clipped.defvjp(lambda x: (_clipped(x), None), lambda _, g: (g * 4.0,))


def _shard_map(x):
    mesh = jax.make_mesh((DEVICES,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))

    def body(x):
        lox.log({"part": x.sum()}, step=9)
        return x * 2

    return jax.shard_map(body, mesh=mesh, in_specs=jax.P("d"), out_specs=jax.P("d"))(x)


X = np.linspace(0.5, 4.0, DEVICES).astype(np.float32)
CASES = {
    "jit": Case(_jit, lambda x: x * 2 + 1, lambda x: [({"y": x * 2}, {"step": 1})]),
    "scan": Case(_scan, lambda x: np.cumsum(x)[-1] + 2 * np.cumsum(x).sum(), _scan_events),
    "while": Case(_while, lambda x: x.sum(), lambda x: [({"s": x[:i].sum()}, {"step": i}) for i in range(len(x))],
                  spool={"max_events": len(X)}),
    "cond": Case(_cond, lambda x: x * 2, lambda x: [({"v": x.sum()}, {"step": 3})]),
    "remat": Case(_remat, lambda x: np.sin(x) * 2, lambda x: [({"r": np.sin(x)}, {"step": 5})]),
    "custom_jvp": Case(lambda x: _scaled(x) + 1, lambda x: 3 * x + 1, lambda x: [({"primal": x}, {"step": 7})]),
    "custom_vjp": Case(lambda x: _clipped(x) - 1, lambda x: 4 * x - 1, lambda x: [({"primal": x}, {"step": 8})]),
    "shard_map": Case(_shard_map, lambda x: x * 2,
                      lambda x: [({"part": p.sum()}, {"step": 9}) for p in np.split(x, DEVICES)], spools=False),
}
RULES = {
    "jit": interpreter.jit_rule, "scan": interpreter.scan_rule, "while": interpreter.while_rule,
    "cond": interpreter.cond_rule, "remat": interpreter.remat_rule, "custom_jvp": interpreter.custom_jvp_rule,
    "custom_vjp": interpreter.custom_vjp_rule, "shard_map": interpreter.shard_map_rule,
}


def test_every_rule_has_a_case():
    assert set(interpreter.rules.values()) == set(RULES.values())
    assert set(RULES) == set(CASES)
    # Rules are keyed by the primitive objects `_compat` exposes.
    assert interpreter.rules[_compat.scan_p] is interpreter.scan_rule
    assert interpreter.rules[_compat.closed_call_p] is interpreter.rules[_compat.jit_p]


def _primitives_of(fun, x):
    found, todo = set(), [jax.make_jaxpr(fun)(x).jaxpr]
    while todo:
        jaxpr = todo.pop()
        for eqn in jaxpr.eqns:
            found.add(eqn.primitive)
            todo.extend(getattr(s, "jaxpr", s) for s in _compat.subjaxprs_of(eqn))
    return found


@pytest.mark.parametrize("name", CASES)
def test_each_case_holds_its_primitive(name):
    rule = RULES[name]
    held = {p for p in _primitives_of(CASES[name].fun, jnp.asarray(X)) if interpreter.rules.get(p) is rule}
    assert held, f"the {name} case does not use a primitive of {rule.__name__}"


@pytest.mark.parametrize("name", CASES)
def test_spool_collects_the_events_by_hand(name):
    case = CASES[name]
    want = logs_of_events(case.events(X))
    if not case.spools:
        with pytest.raises(ValueError, match=r"cannot collect logs \(keys 'part'\) from inside `jax.shard_map`"):
            lox.spool(case.fun)(jnp.asarray(X))
        return
    out, logs = lox.spool(case.fun, **case.spool)(jnp.asarray(X))
    np.testing.assert_allclose(out, case.out(X), rtol=1e-6)
    if case.spool:  # padded series (max_events)
        logs = logs.trim()
    assert_logs_equal(logs, want, rtol=1e-6, dtypes=False)


@pytest.mark.parametrize("buffer", [None, 3])
@pytest.mark.parametrize("name", CASES)
def test_tap_delivers_the_events_by_hand_in_order(name, buffer):
    case = CASES[name]
    if name == "shard_map" and buffer:
        buffer = None  # only the per-device events of a shard_map outside loops: no buffer to fill
    events = []
    out = lox.tap(case.fun, events.append, buffer=buffer)(jnp.asarray(X))
    np.testing.assert_allclose(out, case.out(X), rtol=1e-6)
    want = logs_of_events(case.events(X))
    got = tapped(events)
    if name == "shard_map":  # one event per device, from devices' threads: in any order across devices
        order = np.argsort(np.asarray(got["part"]))
        got = got.map_series(lambda a: a[order])
        want = want.map_series(lambda a: a[np.argsort(np.asarray(want["part"]))])
    assert_logs_equal(got, want, rtol=1e-6, dtypes=False)


@pytest.mark.parametrize("name", CASES)
def test_nolog_computes_the_output_with_no_log_left(name):
    case = CASES[name]
    out = lox.nolog(case.fun)(jnp.asarray(X))
    np.testing.assert_allclose(out, case.out(X), rtol=1e-6)
    assert "lox_log" not in str(jax.make_jaxpr(lox.nolog(case.fun))(jnp.asarray(X)))


@pytest.mark.parametrize("name", [n for n in CASES if n not in ("while", "shard_map")])
def test_gradients_go_through_every_rule_unchanged(name):
    case = CASES[name]
    loss = lambda x: jnp.sum(case.fun(x))  # noqa: E731
    want = jax.grad(lox.nolog(loss))(jnp.asarray(X))
    got = jax.grad(lambda x: lox.spool(loss)(x)[0])(jnp.asarray(X))
    np.testing.assert_allclose(got, want, rtol=1e-6)


# --- the contributor page ------------------------------------------------------------------
ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_contributor_page_names_places_that_exist():
    page = (ROOT / "docs" / "contributing.md").read_text()
    paths = set(re.findall(r"`((?:lox_core|lox_backends|tests)/[\w/]+\.py)`", page))
    assert {"lox_core/interpreter.py", "lox_backends/logger/worker.py", "tests/lox_core/test_interpreter.py"} <= paths
    for path in paths:
        assert (ROOT / path).is_file(), path
    modules = {"interpreter": interpreter, "_compat": _compat, "segments": segments, "Handler": interpreter.Handler}
    for owner, name in re.findall(r"`(interpreter|_compat|segments|Handler)\.(\w+)`", page):
        assert hasattr(modules[owner], name), f"{owner}.{name}"
    for name in re.findall(r"`(\w+_rule)`", page):
        assert getattr(interpreter, name) in interpreter.rules.values(), name


def test_only_the_compatibility_module_names_primitives():
    # Primitives are compared by object: a name string elsewhere would miss a renamed one.
    names = {p.name for p in interpreter.rules} | {"pjit", "checkpoint", "remat", "xla_pmap"}
    for path in sorted((ROOT / "lox_core").glob("*.py")):
        if path.name == "_compat.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert node.value not in names, f"{path.name} names the primitive {node.value!r}"


# --- constants made inside the logged function -------------------------------------------
# JAX 0.10 hands them to the interpreter as literals (typed Python scalars, no shape).
CONSTANTS = {
    "asarray int": (lambda: jnp.asarray(5), np.int32(5)),
    "asarray float": (lambda: jnp.asarray(0.5), np.float32(0.5)),
    "asarray bool": (lambda: jnp.asarray(True), np.bool_(True)),
    "asarray complex": (lambda: jnp.asarray(1 + 2j), np.complex64(1 + 2j)),
    "array int": (lambda: jnp.array(-3), np.int32(-3)),
    "array float": (lambda: jnp.array(2.5), np.float32(2.5)),
    "array bool": (lambda: jnp.array(False), np.bool_(False)),
    "weak float": (lambda: jnp.float32(1.0) * 0 + 0.25, np.float32(0.25)),
    "small array": (lambda: jnp.array([1, 2, 3]), np.array([1, 2, 3], np.int32)),
    "zeros": (lambda: jnp.zeros(()), np.float32(0)),
    "full 2x2": (lambda: jnp.full((2, 2), 7.0), np.full((2, 2), 7.0, np.float32)),
}
# Where the constant is logged: each place runs the log `n` times at steps 0..n-1.
PLACES = {
    "top": lambda log: log(0),
    "scan": lambda log: jax.lax.scan(lambda c, i: (log(i), (c, None))[1], 0, jnp.arange(3)),
    "cond": lambda log: jax.lax.cond(True, lambda: log(0), lambda: log(0)),
    "nested jit": lambda log: jax.jit(lambda: log(0))(),
    "fori": lambda log: jax.lax.fori_loop(0, 2, lambda i, c: (log(i), c)[1], 0),
}
EVENTS = {"top": 1, "scan": 3, "cond": 1, "nested jit": 1, "fori": 2}


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("constant", CONSTANTS)
def test_a_constant_made_inside_logs_its_value(constant, place):
    make, value = CONSTANTS[constant]

    def f(x):
        PLACES[place](lambda i: lox.log({"c": make()}, step=i))
        return x + 1

    n = EVENTS[place]
    want = lox.logdict({"c": np.stack([value] * n)}, steps={"step": {"c": np.arange(n, dtype=np.int32)}})
    for spooled in (lox.spool(f), jax.jit(lox.spool(f))):
        out, logs = spooled(1.0)
        assert float(out) == 2.0
        assert_logs_equal(logs, want)
    for buffer in (None, 2):
        events = []
        lox.tap(f, events.append, buffer=buffer)(1.0)
        assert_logs_equal(tapped(events), want)
    assert float(lox.nolog(f)(1.0)) == 2.0


def test_a_constant_logged_under_vmap_is_each_elements():
    def f(x):
        lox.log({"c": jnp.asarray(0.5), "x": x}, step=1)
        return x

    _, logs = jax.vmap(lox.spool(f))(jnp.arange(3.0))
    np.testing.assert_array_equal(logs["c"], np.full((3, 1), 0.5, np.float32))
    _, logs = lox.spool(jax.vmap(f))(jnp.arange(3.0))
    np.testing.assert_array_equal(logs["c"], np.full((1, 3), 0.5, np.float32))
