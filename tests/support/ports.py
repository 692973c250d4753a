"""Whether a Protocol port is what its production adapter offers.

mypy checks that the adapters fill the ports where the sidecar is wired
(``sidecar.compose``); this checks the same at run time by name, parameters and kind,
so a port cannot drift from its adapter in a way the fakes of the unit tests would hide.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable


def port_methods(port: type) -> dict[str, Callable[..., object]]:
    """The methods a port names, its port bases' included."""
    return {
        name: value
        for name, value in _declared(port).items()
        if callable(value) and not name.startswith("_")
    }


def port_properties(port: type) -> set[str]:
    """The read-only attributes a port names (as properties), its bases' included."""
    return {name for name, value in _declared(port).items() if isinstance(value, property)}


def assert_adapter_offers(port: type, adapter: type) -> None:
    """Every method of ``port`` is ``adapter``'s, with the same parameters and kind
    (coroutine or not); every property is a property of it or set by its ``__init__``."""
    methods = port_methods(port)
    assert methods, f"{port.__name__} names no method"
    for name, declared in methods.items():
        offered = getattr(adapter, name, None)
        assert offered is not None, f"{adapter.__name__} has no {name}"
        assert callable(offered), name
        assert list(inspect.signature(offered).parameters) == list(
            inspect.signature(declared).parameters
        ), name
        assert inspect.iscoroutinefunction(offered) == inspect.iscoroutinefunction(declared), name
    attributes = _set_in_init(adapter)
    for name in port_properties(port):
        offered = inspect.getattr_static(adapter, name, None)
        assert isinstance(offered, property) or name in attributes, (
            f"{adapter.__name__} has no {name}"
        )


def _declared(port: type) -> dict[str, object]:
    members: dict[str, object] = {}
    for klass in reversed(port.__mro__):
        if klass is object or klass.__name__ in ("Protocol", "Generic"):
            continue
        members |= vars(klass)
    return members


def _set_in_init(adapter: type) -> set[str]:
    """The attributes ``adapter.__init__`` assigns to ``self``."""
    init = adapter.__dict__.get("__init__")
    if init is None:
        return set()
    tree = ast.parse(textwrap.dedent(inspect.getsource(init)))
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.ctx, ast.Store)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    }
