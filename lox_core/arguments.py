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
import functools
import inspect
import warnings
from typing import Any, Callable, cast

import jax
import jax.core
import numpy as np

from lox_core import _compat

tree_util = jax.tree_util


# --- which leaves are traced --------------------------------------------------------------------
_NUMBERS = (bool, int, float, complex)
_kinds: dict[type, bool | None] = {}  # leaf type -> traced (True), static (False), a Python number (None)


def _kind(x) -> bool | None:
    try:
        return _kinds[type(x)]
    except KeyError:  # a type seen for the first time
        kind = _kinds[type(x)] = True if is_array(x) else None if isinstance(x, _NUMBERS) else False
        return kind


def is_array(x) -> bool:
    """Whether the leaf `x` is an array lox traces: JAX and NumPy arrays and
    scalars, `jax.Ref`s, and `jax.ShapeDtypeStruct`s (for `lower`)."""
    return isinstance(x, (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct)) or _compat.is_ref(x)


def traced(leaves: list, tree) -> list[bool]:
    """Which `leaves` of a pytree of structure `tree` are traced: arrays, and
    Python numbers held by tuples, lists and dicts only (as `jax.jit` traces
    them); a number inside any other node (a module's field) is static."""
    kinds = [_kind(x) for x in leaves]
    if None not in kinds:
        return cast("list[bool]", kinds)
    in_containers = _layout(tree)[0]  # one per leaf of `tree`, as `leaves` are
    return [kind if kind is not None else held for kind, held in zip(kinds, in_containers, strict=True)]


@functools.lru_cache(maxsize=4096)
def _layout(tree) -> tuple[tuple[bool, ...], bool]:
    """For a pytree structure: per leaf, whether every node above it is a
    tuple, list or dict; and whether a node below the top two levels (those
    of ``(args, kwargs)``) may be mutable (is not a tuple or None)."""
    in_containers: list = []
    mutable = False

    def walk(t, held: bool, depth: int):
        nonlocal mutable
        data = t.node_data()
        if data is None:  # a leaf
            in_containers.append(held)
            return
        kind = data[0]
        mutable = mutable or (depth >= 2 and not issubclass(kind, (tuple, type(None))))
        for child in t.children():
            walk(child, held and issubclass(kind, (tuple, list, dict)), depth + 1)

    walk(tree, True, 0)
    return tuple(in_containers), mutable


# --- the static part of a call: the cache key ------------------------------------------
class _Static:
    """A static argument (`static_argnums`/`static_argnames`): one leaf, whatever
    it holds, so that its own leaves are not traced."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


def _key_of(value):
    """What a static leaf contributes to the cache key: its type and itself
    when hashable, its identity otherwise."""
    if isinstance(value, _Static):
        value = value.value
    try:
        hash(value)
    except TypeError:
        return type(value), _Identity(value)
    return type(value), value


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
        self._keys = tuple((i, *_key_of(v)) for i, v in static)
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
            # (the same tree may hold a different number of static leaves: stop at the shorter, as before)
            return all(a is b for (_, _, a), (_, _, b) in zip(self._keys, other._keys, strict=False))

    def rebuild(self, dynamic) -> tuple[tuple, dict]:
        """The call's ``(args, kwargs)`` with `dynamic` as its traced leaves."""
        leaves = list(dynamic)
        for i, value in self.static:
            leaves.insert(i, value.value if isinstance(value, _Static) else value)
        return share(tree_util.tree_unflatten(self.tree, leaves), self.aliases)

    @property
    def filtered(self) -> bool:
        """Whether leaves other than static arguments are static."""
        return any(not isinstance(value, _Static) for _, value in self.static)


def split(where: str, args: tuple, kwargs: dict, static_argnums: tuple = (), static_argnames: tuple = ()):
    """A call's static part (its `Signature`) and its traced leaves."""
    if static_argnums or static_argnames:
        args = tuple(_static(where, f"argument {i}", a) if i in static_argnums or i - len(args) in static_argnums
                     else a for i, a in enumerate(args))
        kwargs = {k: _static(where, f"argument `{k}`", v) if k in static_argnames else v for k, v in kwargs.items()}
    root = (args, kwargs)
    leaves, tree, shared = flatten(root)
    dynamic, static = [], []
    for i, (leaf, is_traced) in enumerate(zip(leaves, traced(leaves, tree), strict=True)):
        if is_traced:
            dynamic.append(leaf)
        else:
            static.append((i, leaf))
    return Signature(tree, tuple(static), shared), dynamic


def _static(where: str, name: str, value) -> _Static:
    try:
        hash(value)
    except TypeError:
        raise ValueError(
            f"`{where}`: the static {name} (`static_argnums`/`static_argnames`) is a {type(value).__name__}, "
            "which cannot be hashed; static arguments are part of the cache key, as under `jax.jit`. Pass a "
            "hashable value (a tuple instead of a list), or leave the argument traced."
        ) from None
    return _Static(value)


def plain(args: tuple, kwargs: dict) -> bool:
    """Whether every argument is an array or a number (no pytree node)."""
    return all(_kind(x) is not False for x in args) and all(_kind(x) is not False for x in kwargs.values())


# --- objects held in several places ------------------------------------------------------------
def flatten(root) -> tuple[list, Any, tuple]:
    """`root`'s leaves and structure, and ``(path, first path)`` for each
    mutable node it holds again after its first place (`share` makes a copy
    hold them once)."""
    if plain(*root):
        leaves, tree = tree_util.tree_flatten(root)  # no node to hold twice
        return leaves, tree, ()
    seen: set = set()
    again: list = []

    def note(node):
        if id(node) in seen:
            again.append(node)
        seen.add(id(node))
        return False

    leaves, tree = tree_util.tree_flatten(root, is_leaf=note)
    if not _layout(tree)[1]:  # tuples of arrays: nothing mutable
        return leaves, tree, ()
    if not any(_mutable(node) and not tree_util.all_leaves([node]) for node in again):
        return leaves, tree, ()
    first: dict = {}
    found: list = []

    def visit(path, node) -> bool:
        if id(node) in first and _mutable(node):
            found.append((path, first[id(node)]))
            return False  # what it holds is the first place's
        first.setdefault(id(node), path)
        return True

    _walk(root, visit)
    return leaves, tree, tuple(found)


def _mutable(node) -> bool:
    return node is not None and not _frozen(node)


def _walk(root, visit: Callable[[tuple, Any], bool]) -> None:
    """Call ``visit(path, node)`` on each node of `root` that is not a leaf,
    parents first; a visit that returns False skips the node's children."""

    def walk(node, path):
        if node is None or tree_util.all_leaves([node]) or not visit(path, node):
            return
        for key, child in _children(node).items():
            walk(child, (*path, key))

    walk(root, ())


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
    key, rest = path[0], path[1:]
    child = _replaced(_child(node, key), rest, value) if rest else value
    if _can_set(node, key):
        _set(node, {key: child})
        return node
    return _rebuilt(node, {key: child})


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

    def visit(path, node) -> bool:
        if id(node) in common:
            paths.setdefault(id(node), path)
        return True

    _walk(root, visit)
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
        kinds = traced(leaves, tree)
        static = tuple((i, x) for i, (x, k) in enumerate(zip(leaves, kinds, strict=True)) if not k)
        for _, x in static:
            _check_holds_no_tracer(x)
        return cls(tree, static, [x for x, k in zip(leaves, kinds, strict=True) if k])

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


def _tracer_inside(x) -> str | None:
    """The attribute of the object `x` (not a pytree node) that holds a
    tracer, looking one level into its attributes, or None."""
    fields = getattr(x, "__dict__", None)
    if not isinstance(fields, dict) or callable(x):
        return None
    for name, value in fields.items():
        inner = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else (value,)
        if any(isinstance(v, jax.core.Tracer) for v in inner):
            return name
    return None


def _check_holds_no_tracer(x) -> None:
    name = _tracer_inside(x)
    if name is not None:
        raise TypeError(
            f"the function returned a `{type(x).__name__}` whose attribute `{name}` holds a traced array, but "
            f"`{type(x).__name__}` is not a pytree, so a compiled program cannot return it (as under `jax.jit`). "
            "Register the class as a pytree (`jax.tree_util.register_dataclass`, or an equinox/flax module), "
            "or return the arrays themselves."
        )


def guard_static(where: str, fun: Callable, leaves: list, root) -> Callable[[], None]:
    """Before `fun` runs: a check to call after it, that it stored no traced
    value in an attribute of a static (non-pytree) argument object, which lox
    hands to `fun` as it is and cannot write back. The check puts the
    attributes back as they were before it raises."""
    kinds = traced(leaves, tree_util.tree_structure(root))
    saved = [(i, x, dict(x.__dict__)) for i, (x, k) in enumerate(zip(leaves, kinds, strict=True))
             if not k and isinstance(getattr(x, "__dict__", None), dict) and not callable(x)]

    def check() -> None:
        for i, x, before in saved:
            name = _tracer_inside(x)
            if name is None:
                continue
            x.__dict__.clear()
            x.__dict__.update(before)
            raise ValueError(
                f"`{where}`: the function stored a traced value in `.{name}` of the `{type(x).__name__}` "
                f"`{_place(fun, root, _paths(root)[i])}` it was given. That object is not a pytree, so lox passes it "
                "as a static value and cannot write the new value back. Register its class as a pytree (its "
                "arrays are then traced and written back), or return the value from the function."
            )

    return check


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
        self.where = where  # the transform, for error messages

    def apply(self, args: tuple, kwargs: dict) -> None:
        """Write the changes into the caller's `args` and `kwargs`."""
        writes = dict(zip(self.paths, self.arrays, strict=True))  # one path per array
        writes.update(self.static)
        with warnings.catch_warnings():
            # Pytree paths name attributes that some libraries now want set another
            # way (flax's `Variable.value`); lox writes through the path the library registered.
            warnings.simplefilter("ignore", DeprecationWarning)
            _write((args, kwargs), writes)


tree_util.register_pytree_node(
    Changes,
    lambda c: (c.arrays, (c.paths, c.static, c.where)),
    lambda aux, arrays: Changes(aux[0], list(arrays), aux[1], aux[2]),
)


def changes(where: str, fun: Callable, tree, before: list, after_args: tuple, after_kwargs: dict) -> Changes | None:
    """What `fun` changed in the arguments it was called with: `before` are the
    leaves it got, `after_args`/`after_kwargs` the objects it got, now. Raises
    when it changed their structure, or a leaf that cannot be written back.
    None when nothing changed."""
    root = (after_args, after_kwargs)
    after, after_tree = tree_util.tree_flatten(root)
    if after_tree != tree:
        raise ValueError(_structure_message(where, fun, tree, after_args, after_kwargs))
    # `before` are the leaves of `tree` too, so both have tree.num_leaves.
    changed = [i for i, (b, a) in enumerate(zip(before, after, strict=True)) if a is not b]
    if not changed:
        return None
    paths = _paths(root)
    for i in changed:
        _check_writable(where, fun, root, paths[i])
    kinds = traced(after, after_tree)
    arrays = [i for i in changed if kinds[i]]
    static = tuple((paths[i], after[i]) for i in changed if not kinds[i])
    return Changes(tuple(paths[i] for i in arrays), [after[i] for i in arrays], static, where)


def _check_writable(where: str, fun: Callable, root, path: tuple) -> None:
    """That the leaf at `path` can be written into the caller's objects: some
    node on its way inside the argument can be set (the immutable ones below
    it are rebuilt)."""
    for depth in range(len(path) - 1, 1, -1):  # the parent of path[depth], deepest first, inside an argument
        if _can_set(_node_at(root, path[:depth]), path[depth]):
            return
    raise ValueError(
        f"`{where}` cannot write back what the function changed at `{_place(fun, root, path)}`: every object on "
        f"the way from the argument `{_place(fun, root, path[:2])}` to it is immutable (tuples, frozen "
        "dataclasses), so the change never reached the object you passed. Return the new value from the "
        "function instead."
    )


def _place(fun: Callable, root, path: tuple) -> str:
    """A path of the arguments ``(args, kwargs)`` as the user writes it: ``model.l1.kernel``."""
    args, kwargs = root
    names = _argument_names(fun, len(args), kwargs)
    argument = names[path[1].idx] if isinstance(path[1], tree_util.SequenceKey) else str(path[1].key)
    return argument + tree_util.keystr(path[2:])


def _structure_message(where: str, fun: Callable, tree, args: tuple, kwargs: dict) -> str:
    args_tree, kwargs_tree = tree.children()
    names = _argument_names(fun, len(args), kwargs)  # one per argument, as `tree` holds them
    before = dict(zip(names, [*args_tree.children(), *kwargs_tree.children()], strict=True))
    # Not strict: names that repeat (a signature that misnames the arguments) leave `before` shorter.
    for name, value in zip(before, [*args, *kwargs.values()], strict=False):
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
def _child(node, key):
    if isinstance(key, tree_util.GetAttrKey):
        return getattr(node, key.name)
    if isinstance(key, tree_util.DictKey):
        return node[key.key]
    if isinstance(key, tree_util.SequenceKey):
        return node[key.idx]
    return _children(node)[key]


def _node_at(root, path):
    node = root
    for key in path:
        node = _child(node, key)
    return node


def _children(node) -> dict:
    """The children of one pytree node, by key."""
    pairs, _ = tree_util.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
    return {path[0]: child for path, child in pairs}


def _frozen(node) -> bool:
    if isinstance(node, tuple):
        return True
    # A dataclass (class or instance) keeps its options, `frozen` among them, in `__dataclass_params__`.
    params = getattr(node, "__dataclass_params__", None) if dataclasses.is_dataclass(node) else None
    return params is not None and params.frozen


def _can_set(node, key) -> bool:
    """Whether `_set` can change the child `key` of `node` in place."""
    if isinstance(key, tree_util.DictKey):
        return isinstance(node, dict)
    if isinstance(key, tree_util.SequenceKey):
        return isinstance(node, list)
    if _frozen(node):
        return False
    # An attribute; or, for a node registered without keys, its attributes all at once.
    return isinstance(key, tree_util.GetAttrKey) or isinstance(getattr(node, "__dict__", None), dict)


def _set(node, children: dict) -> None:
    """Set children of `node` (one that `_can_set`) in place."""
    keys = list(children)
    if isinstance(keys[0], tree_util.FlattenedIndexKey):
        # No key to set: rebuild the node with its new children, then take its attributes.
        node.__dict__.update(_rebuilt(node, children).__dict__)
        return
    for key, value in children.items():
        if isinstance(key, tree_util.GetAttrKey):
            setattr(node, key.name, value)
        elif isinstance(key, tree_util.DictKey):
            node[key.key] = value
        else:
            node[key.idx] = value


def _rebuilt(node, new_children: dict):
    """A copy of `node` with some children replaced."""
    pairs, tree = tree_util.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
    return tree_util.tree_unflatten(tree, [new_children.get(path[0], child) for path, child in pairs])


def _write(root, writes: dict) -> None:
    """Set each ``path: value`` of `writes` in `root`, deepest first. A child
    of an immutable node (a tuple, a frozen dataclass) is written by
    rebuilding that node in its own parent (`changes` checked that some node
    on the way can be set)."""
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
            parent = node_at(parent_path)
            if _can_set(parent, next(iter(children))):
                _set(parent, children)
            else:
                pending[parent_path] = _rebuilt(parent, children)
