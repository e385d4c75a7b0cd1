"""Policy names: the built-ins and those loaded from files at start.

``load_file(path)`` runs a Python file of this machine's own (``engine.serve --policy-file``) and
registers each ``Policy`` subclass it defines under its ``name``. Only at start and only from a
local path: a policy is code that runs inside the engine with the engine's rights, so it is never
taken from a viewer, an upload or the network (docs/protocol.md says the same).
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

from engine.core.errors import InvalidPolicy
from engine.core.policy.base import Policy
from engine.core.policy.builtin import BUILTINS

NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}")
_REGISTRY: dict[str, type[Policy]] = {cls.name: cls for cls in BUILTINS}
BUILTIN_NAMES = tuple(_REGISTRY)
_SOURCES: dict[str, Path] = {}  # loaded name -> its file: loading the same file again replaces


def names() -> tuple[str, ...]:
    """Every policy a config may name: the built-ins first, then the loaded ones."""
    return tuple(_REGISTRY)


def loaded() -> tuple[str, ...]:
    return tuple(n for n in _REGISTRY if n not in BUILTIN_NAMES)


def get(name: str) -> type[Policy]:
    return _REGISTRY[name]


def register(cls: type[Policy], source: Path | None = None) -> str:
    """Add ``cls`` under ``cls.name``; a bad or taken name is an ``InvalidPolicy`` (a name taken
    by the same ``source`` file is replaced: the file was loaded again)."""
    if not (isinstance(cls, type) and issubclass(cls, Policy)):
        raise InvalidPolicy(f"{cls!r} is not a Policy subclass")
    name = cls.name
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise InvalidPolicy(
            f"policy {cls.__name__} needs a name of 1-32 lowercase letters, digits, - or _ "
            f"(starting with a letter), got {name!r}"
        )
    again = source is not None and _SOURCES.get(name) == source
    if _REGISTRY.get(name, cls) is not cls and not again:
        raise InvalidPolicy(f"a policy named {name!r} is already registered")
    if cls.trusted or cls.batch:
        raise InvalidPolicy(f"policy {name!r}: trusted and batch are for the built-ins")
    try:
        cls()  # the engine makes one per scheduler: a policy that cannot be made fails here
    except Exception as exc:  # noqa: BLE001 - whatever its __init__ does wrong
        raise InvalidPolicy(
            f"policy {name!r} cannot be created: {type(exc).__name__}: {exc}"
        ) from exc
    _REGISTRY[name] = cls
    if source is not None:
        _SOURCES[name] = source
    return name


def unregister(name: str) -> None:
    """Forget a loaded policy (tests); the built-ins stay."""
    if name not in BUILTIN_NAMES:
        _REGISTRY.pop(name, None)
        _SOURCES.pop(name, None)


def load_file(path: str | Path) -> list[str]:
    """Run the policy file ``path`` and register every Policy subclass it defines; returns their
    names. Any failure is an ``InvalidPolicy`` naming the file."""
    path = Path(path)
    if path.suffix != ".py" or not path.is_file():
        raise InvalidPolicy(f"{path}: not a Python file on this machine")
    module_name = f"fluxo_policy_{re.sub(r'[^0-9a-zA-Z_]', '_', path.stem)}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise InvalidPolicy(f"{path}: cannot be loaded as a module")
    module = importlib.util.module_from_spec(spec)
    try:
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - whatever the file does wrong, say so and stop
        sys.modules.pop(module_name, None)
        raise InvalidPolicy(f"{path}: {type(exc).__name__}: {exc}") from exc
    found = [
        obj
        for obj in vars(module).values()
        if isinstance(obj, type) and issubclass(obj, Policy) and obj.__module__ == module_name
    ]
    if not found:
        raise InvalidPolicy(f"{path}: defines no subclass of engine.core.policy.Policy")
    return [register(cls, path.resolve()) for cls in found]
