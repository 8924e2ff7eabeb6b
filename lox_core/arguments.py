"""A call's arguments on their way into a compiled program, and back.

*Filtered arguments.* lox's transforms take pytrees whose leaves are not all
arrays (an equinox model holds its activation function; a config holds
strings), as `equinox.filter_jit` does: array leaves (JAX and NumPy arrays,
`jax.Ref`s) are traced, and every other leaf is static, part of the cache
key (by value when it is hashable, by identity otherwise). Python numbers
are traced where `jax.jit` traces them, as arguments or in tuples, lists and
dicts, so that a new float reuses the compiled program; inside any other
node (a module's field) they are static, as `equinox.filter_jit` keeps them.
Outputs are split the same way: non-array leaves come back as the function
returned them when it was traced.

*Changed arguments.* A function that updates its arguments in place (a
flax.nnx model or optimizer, an `nnx.Variable`, a dict or list it assigns
into) changes, under `jax.jit`, only the copies `jit` made of them. lox
compares the arguments' leaves after the function ran with those it passed
in, returns the changed ones as extra outputs of the compiled program, and
writes them back into the caller's objects along their pytree paths: the
caller's objects end as the function alone would have left them. A change of
structure (an attribute added or removed, a static attribute changed) cannot
be written back this way, and is an error at the call.

*Shared objects.* An object that the arguments hold in two places (a model
and the optimizer that refers to it, tied weights) is one object in the
copies the function sees too, and a node of the arguments that the function
returns comes back as the caller's own object, as `nnx.jit` does.
"""

from __future__ import annotations

import dataclasses
import inspect
import warnings
from typing import Any, Callable

import jax
import numpy as np

from lox_core import _compat

tree_util = jax.tree_util

_NUMBERS = (bool, int, float, complex)
_kinds: dict[type, bool | None] = {}  # leaf type -> traced (True), static (False), a Python number (None)


def _kind(x) -> bool | None:
    kind = _kinds.get(type(x), 0)
    if kind == 0:
        kind = True if is_array(x) else None if isinstance(x, _NUMBERS) else False
        if not hasattr(x, "__jax_array__"):  # a type decides, except for objects that say they are arrays
            _kinds[type(x)] = kind
    return kind


def is_array(x) -> bool:
    """Whether the leaf `x` is an array lox traces (JAX and NumPy arrays and
    scalars, `jax.Ref`s); Python numbers are decided by `traced`."""
    return isinstance(x, (jax.Array, np.ndarray, np.generic)) or _compat.is_ref(x) or hasattr(x, "__jax_array__")


def traced(leaves: list, root) -> list[bool]:
    """Which of `root`'s `leaves` are traced: arrays, and Python numbers
    reached through tuples, lists and dicts only (as `jax.jit` traces them);
    a number inside any other node (a module's field) is static."""
    kinds = [_kind(x) for x in leaves]
    if None not in kinds:
        return kinds
    paths = [path for path, _ in tree_util.tree_flatten_with_path(root)[0]]
    return [kind if kind is not None else all(isinstance(k, _CONTAINER_KEYS) for k in path)
            for kind, path in zip(kinds, paths)]


_CONTAINER_KEYS = (tree_util.SequenceKey, tree_util.DictKey)


# --- the static part of a call: the cache key ------------------------------------------
class _Static:
    """A static argument (`static_argnums`/`static_argnames`): one leaf, whatever
    it holds, so that its own leaves are not traced."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


def _key_of(value):
    """What a static leaf contributes to the cache key: itself when hashable
    (compared by type and value), its identity otherwise."""
    if isinstance(value, _Static):
        value = value.value
    try:
        hash(value)
    except TypeError:
        return _Identity(value)
    return value


class _Identity:
    """An unhashable static leaf, compared by identity (the key holds it, so
    its id is not reused while the compiled program is cached)."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __hash__(self):
        return id(self.value)

    def __eq__(self, other):
        return isinstance(other, _Identity) and other.value is self.value


class Signature:
    """The static part of a call: the pytree structure of its arguments, its
    static leaves by position, and the objects it holds in several places
    (`aliases`). Hashable: `jax.jit` caches on it."""

    __slots__ = ("tree", "static", "aliases", "_keys", "_hash")

    def __init__(self, tree, static: tuple, aliases: tuple = ()):
        self.tree = tree
        self.static = static  # ((position, leaf), ...)
        self.aliases = aliases  # ((path, path of the same object), ...)
        self._keys = tuple((i, type(v), _key_of(v)) for i, v in static)
        self._hash = hash((tree, self._keys, aliases))

    def __hash__(self):
        return self._hash

    def __eq__(self, other):
        if not isinstance(other, Signature) or self._hash != other._hash or self.tree != other.tree:
            return False
        if self.aliases != other.aliases:
            return False
        try:
            return bool(self._keys == other._keys)
        except Exception:  # an __eq__ that does not return a bool (e.g. an array): compare identities
            return all(a is b for (_, _, a), (_, _, b) in zip(self._keys, other._keys))

    def rebuild(self, dynamic: list) -> tuple[tuple, dict]:
        """The call's ``(args, kwargs)`` with `dynamic` as its traced leaves."""
        leaves = list(dynamic)
        for i, value in self.static:
            leaves.insert(i, value.value if isinstance(value, _Static) else value)
        return share(tree_util.tree_unflatten(self.tree, leaves), self.aliases)


def split(args: tuple, kwargs: dict, static_argnums: tuple = (), static_argnames: tuple = ()) -> tuple[Signature, list]:
    """A call's static part (its `Signature`) and its traced leaves."""
    if static_argnums or static_argnames:
        args = tuple(_Static(a) if i in static_argnums or i - len(args) in static_argnums else a
                     for i, a in enumerate(args))
        kwargs = {k: _Static(v) if k in static_argnames else v for k, v in kwargs.items()}
    root = (args, kwargs)
    leaves, tree = tree_util.tree_flatten(root)
    dynamic, static = [], []
    for i, (leaf, is_traced) in enumerate(zip(leaves, traced(leaves, root))):
        if is_traced:
            dynamic.append(leaf)
        else:
            static.append((i, leaf))
    return Signature(tree, tuple(static), aliases(root, leaves)), dynamic


# --- objects held in several places ------------------------------------------------------------
def aliases(root, leaves: list) -> tuple:
    """``(path, first path)`` for each mutable node that `root` holds again
    (after its first place, in flattening order). A node held twice holds its
    arrays twice, so the common case (no array seen twice) costs one set."""
    arrays = [id(x) for x in leaves if _kind(x)]
    if len(set(arrays)) == len(arrays):
        return ()
    first: dict = {}
    found: list = []

    def visit(node, path):
        if tree_util.all_leaves([node]) or node is None:
            return
        if id(node) in first and _mutable(node):
            found.append((path, first[id(node)]))
            return  # what it holds is the first place's
        first.setdefault(id(node), path)
        for key, child in _children(node).items():
            visit(child, (*path, key))

    visit(root, ())
    return tuple(found)


def _mutable(node) -> bool:
    if isinstance(node, tuple):
        return False
    return not (dataclasses.is_dataclass(node) and node.__dataclass_params__.frozen)


def share(root, aliases: tuple):
    """`root` (a fresh copy of the caller's arguments) with each alias the same
    object as its first place, as in the caller's objects. Immutable
    containers on the way are rebuilt: the copy is lox's own."""
    for path, source in aliases:
        root = _replaced(root, path, _node_at(root, source))
    return root


def _replaced(node, path: tuple, value):
    """`node` with `value` at `path`: set in place, or rebuilt where immutable."""
    if not path:
        return value
    child = _replaced(_child(node, path[0]), path[1:], value) if len(path) > 1 else value
    try:
        _set(node, path[0], child)
        return node
    except _Unsettable:
        return _rebuilt(node, {path[0]: child})


def _node_at(root, path):
    node = root
    for key in path:
        node = _child(node, key)
    return node


class Argument:
    """In an output: the node of the arguments at `path`, which the function
    returned as it was given (the caller gets back its own object)."""

    __slots__ = ("path",)

    def __init__(self, path: tuple):
        self.path = path

    def __eq__(self, other):
        return isinstance(other, Argument) and other.path == self.path

    def __hash__(self):
        return hash(self.path)


def returned_arguments(out, root, leaves: list):
    """`out` with each node that is a node of the arguments `root` (whose
    leaves are `leaves`) replaced by an `Argument` marker."""
    seen: set = set()

    def collect(node):
        seen.add(id(node))
        return False

    out_leaves = tree_util.tree_leaves(out, is_leaf=collect)
    mine = seen - {id(x) for x in out_leaves} - {id(None), id(())}
    if not mine:
        return out
    seen.clear()
    tree_util.tree_leaves(root, is_leaf=collect)
    common = (mine & seen) - {id(x) for x in leaves}
    if not common:
        return out
    paths: dict = {}

    def visit(node, path):
        if id(node) in common:
            paths.setdefault(id(node), path)
        if tree_util.all_leaves([node]) or node is None:
            return
        for key, child in _children(node).items():
            visit(child, (*path, key))

    visit(root, ())
    return tree_util.tree_map(lambda x: Argument(paths[id(x)]) if id(x) in paths else x, out,
                              is_leaf=lambda x: id(x) in paths)


# --- outputs with non-array leaves ----------------------------------------------------------
class Filtered:
    """An output pytree that leaves a compiled program as its traced leaves
    only; the rest comes back from the trace as it was. `value` is the
    original pytree."""

    __slots__ = ("tree", "static", "arrays")

    def __init__(self, tree, static: tuple, arrays: list):
        self.tree, self.static, self.arrays = tree, static, arrays

    @classmethod
    def of(cls, value) -> "Filtered":
        leaves, tree = tree_util.tree_flatten(value)
        kinds = traced(leaves, value)
        return cls(tree, tuple((i, x) for i, (x, k) in enumerate(zip(leaves, kinds)) if not k),
                   [x for x, k in zip(leaves, kinds) if k])

    def value(self, root=None):
        """The pytree; with `root` (the caller's ``(args, kwargs)``), its
        `Argument` markers become the nodes of `root` they stand for."""
        leaves = list(self.arrays)
        for i, x in self.static:
            leaves.insert(i, _node_at(root, x.path) if type(x) is Argument and root is not None else x)
        return tree_util.tree_unflatten(self.tree, leaves)


tree_util.register_pytree_node(
    Filtered, lambda f: (f.arrays, (f.tree, f.static)), lambda aux, arrays: Filtered(aux[0], aux[1], list(arrays))
)


def partition(value) -> tuple[list, Callable[[list], Any]]:
    """`value`'s traced leaves, and a function that puts new ones in their place."""
    node = Filtered.of(value)
    tree, static = node.tree, node.static  # not the arrays: they may be tracers of a finished trace
    return node.arrays, lambda arrays: Filtered(tree, static, list(arrays)).value()


# --- what a function changed in its arguments ------------------------------------------------
class Changes:
    """The leaves a traced function changed in its arguments: their paths from
    ``(args, kwargs)``, the new arrays (outputs of the compiled program) and
    the new static leaves. `apply` writes them into the caller's objects."""

    __slots__ = ("paths", "arrays", "static", "where")

    def __init__(self, paths: tuple, arrays: list, static: tuple, where: str):
        self.paths = paths  # one key path per array
        self.arrays = arrays
        self.static = static  # ((path, value), ...)
        self.where = where  # the transform and function, for error messages

    def apply(self, args: tuple, kwargs: dict) -> None:
        """Write the changes into the caller's `args` and `kwargs`."""
        writes = dict(zip(self.paths, self.arrays))
        writes.update(self.static)
        with warnings.catch_warnings():
            # Pytree paths name attributes that some libraries now want set another
            # way (flax's `Variable.value`); lox writes through the path the library registered.
            warnings.simplefilter("ignore", DeprecationWarning)
            _write((args, kwargs), writes, self.where)


tree_util.register_pytree_node(
    Changes,
    lambda c: (c.arrays, (c.paths, c.static, c.where)),
    lambda aux, arrays: Changes(aux[0], list(arrays), aux[1], aux[2]),
)


def changes(where: str, fun: Callable, tree, before: list, after_args: tuple, after_kwargs: dict) -> Changes | None:
    """What `fun` changed in the arguments it was called with: `before` are the
    leaves it got, `after_args`/`after_kwargs` the objects it got, now.
    Raises when it changed their structure. None when nothing changed."""
    after, after_tree = tree_util.tree_flatten((after_args, after_kwargs))
    if after_tree != tree:
        raise ValueError(_structure_message(where, fun, tree, after_args, after_kwargs))
    changed = [i for i, (b, a) in enumerate(zip(before, after)) if a is not b]
    if not changed:
        return None
    paths = [path for path, _ in tree_util.tree_flatten_with_path((after_args, after_kwargs))[0]]
    kinds = traced(after, (after_args, after_kwargs))
    arrays = [i for i in changed if kinds[i]]
    static = tuple((paths[i], after[i]) for i in changed if not kinds[i])
    return Changes(tuple(paths[i] for i in arrays), [after[i] for i in arrays], static, where)


def _structure_message(where: str, fun: Callable, tree, args: tuple, kwargs: dict) -> str:
    args_tree, kwargs_tree = tree.children()
    before = dict(zip(_argument_names(fun, len(args), kwargs), [*args_tree.children(), *kwargs_tree.children()]))
    for name, value in zip(before, [*args, *kwargs.values()]):
        was = before[name]
        if was == tree_util.tree_structure(value):
            continue
        old_value = tree_util.tree_unflatten(was, [0] * was.num_leaves)
        old, new = _paths(old_value), _paths(value)
        added, removed = _first_differing(new, old), _first_differing(old, new)
        detail = (f"it added {_listed(name, added)}" if added else "") + (
            (" and " if added else "it ") + f"removed {_listed(name, removed)}" if removed else "")
        if not detail:
            where_static = _static_changed(old_value, value, ())
            detail = "it changed a static (non-array) attribute" + (
                f" of {_listed(name, [tree_util.keystr(where_static)])}" if where_static else "")
        return (
            f"`{where}` cannot write back what the function did to its argument `{name}`: {detail}. lox writes "
            "changed array values back into the objects you passed (parameters, optimizer state, RNG counts), "
            "but not a change of their structure. Make that change outside the function, before calling it "
            "(lox compiles again for the new structure; e.g. flax's `model.eval()` before an evaluation step), "
            "or make it on a copy that the function returns."
        )
    return f"`{where}`: the function changed the structure of its arguments, which lox cannot write back."


def _static_changed(before, after, path):
    """The path of the outermost node whose own static data differs between
    `before` and `after` (same children), or None."""
    if tree_util.all_leaves([before]) or before is None:
        return None
    one_level = lambda node: tree_util.tree_structure(node, is_leaf=lambda x: x is not node)  # noqa: E731
    if one_level(before) != one_level(after):
        return path
    after_children = _children(after)
    for key, child in _children(before).items():
        found = _static_changed(child, after_children[key], (*path, key))
        if found is not None:
            return found
    return None


def _paths(tree) -> list[tuple]:
    return [path for path, _ in tree_util.tree_flatten_with_path(tree)[0]]


def _first_differing(paths: list[tuple], others: list[tuple]) -> list[str]:
    """For each path of `paths` that `others` lack, its shortest prefix that
    no path of `others` starts with (the attribute added, not its leaves)."""
    known = {path[:i] for path in others for i in range(len(path) + 1)}
    found = []
    for path in paths:
        if path in known:
            continue
        prefix = next(path[:i] for i in range(1, len(path) + 1) if path[:i] not in known)
        found.append(tree_util.keystr(prefix))
    return sorted(set(found))


def _listed(name: str, paths: list[str]) -> str:
    shown = ", ".join(f"`{name}{p}`" for p in paths[:3])
    return shown + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")


def _argument_names(fun: Callable, count: int, kwargs: dict) -> list[str]:
    """The names of a call's positional arguments (from `fun`'s signature where
    it names them, ``args[i]`` otherwise), then its keyword arguments."""
    try:
        parameters = [p.name for p in inspect.signature(fun).parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        parameters = []
    names = [parameters[i] if i < len(parameters) else f"args[{i}]" for i in range(count)]
    return names + list(kwargs)


# --- writing back -------------------------------------------------------------------------------
class _Unsettable(Exception):
    pass


def _child(node, key):
    if isinstance(key, tree_util.GetAttrKey):
        return getattr(node, key.name)
    if isinstance(key, tree_util.DictKey):
        return node[key.key]
    if isinstance(key, tree_util.SequenceKey):
        return node[key.idx]
    return _children(node)[key]


def _children(node) -> dict:
    """The children of one pytree node, by key."""
    pairs, _ = tree_util.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
    return {path[0]: child for path, child in pairs}


def _set(node, key, value) -> None:
    try:
        if isinstance(key, tree_util.GetAttrKey):
            if isinstance(node, tuple) or (dataclasses.is_dataclass(node) and node.__dataclass_params__.frozen):
                raise _Unsettable
            setattr(node, key.name, value)
        elif isinstance(key, tree_util.DictKey) and isinstance(node, dict):
            node[key.key] = value
        elif isinstance(key, tree_util.SequenceKey) and isinstance(node, list):
            node[key.idx] = value
        else:
            raise _Unsettable
    except (AttributeError, TypeError) as e:
        raise _Unsettable from e


def _rebuilt(node, new_children: dict):
    """A copy of the immutable `node` with some children replaced."""
    pairs, tree = tree_util.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
    return tree_util.tree_unflatten(tree, [new_children.get(path[0], child) for path, child in pairs])


def _write(root, writes: dict, where: str) -> None:
    """Set each ``path: value`` of `writes` in `root`, deepest first. A child
    of an immutable node (a tuple, a frozen dataclass) is written by
    rebuilding that node in its own parent."""
    nodes = {(): root}  # the nodes on the paths, each found once

    def node_at(path):
        node = nodes.get(path)
        if node is None:
            node = nodes[path] = _child(node_at(path[:-1]), path[-1])
        return node

    pending = dict(writes)
    while pending:
        depth = max(len(path) for path in pending)
        by_parent: dict = {}
        for path in [p for p in pending if len(p) == depth]:
            by_parent.setdefault(path[:-1], {})[path[-1]] = pending.pop(path)
        for parent_path, children in by_parent.items():
            if len(parent_path) < 2:  # `args` or `kwargs` itself: the caller's variables, out of reach
                raise ValueError(f"`{where}` cannot write back a change of the arguments themselves.")
            parent = node_at(parent_path)
            try:
                for key, value in children.items():
                    _set(parent, key, value)
            except _Unsettable:
                if len(parent_path) == 2:  # an argument that is immutable: its new value cannot reach the caller
                    raise ValueError(
                        f"`{where}` cannot write back a change inside an immutable argument "
                        f"(`{tree_util.keystr(parent_path)}`): the function changed it in place. Return the new "
                        "value from the function instead."
                    ) from None
                pending[parent_path] = _rebuilt(parent, children)
