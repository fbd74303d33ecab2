"""Processors get what they use, typed (issue 29): no processor module imports ``Broker``, and every dependency a
processor's constructor takes is typed with a real class or a protocol, never ``Any``."""
from __future__ import annotations

import ast
import inspect
import typing
from pathlib import Path

import pytest

from sparkmq.platform.broker import processors
from sparkmq.platform.broker.processors.base import Processor
from sparkmq.platform.broker.processors.pop import PopProcessor

PROCESSORS_DIR = Path(processors.__file__).parent
MODULES = sorted(PROCESSORS_DIR.glob("*.py"))
PROCESSOR_CLASSES = sorted({*(getattr(processors, name) for name in processors.__all__
                              if isinstance(getattr(processors, name), type)
                              and issubclass(getattr(processors, name), Processor)
                              and getattr(processors, name) is not Processor), PopProcessor},
                           key=lambda cls: cls.__name__)


def _imports_of_broker(tree: ast.Module) -> list[str]:
    """Each import (anywhere, TYPE_CHECKING blocks included) of the broker module or of the name ``Broker``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            # `from ..broker import X` (the package platform.broker.broker seen from processors/), or any absolute
            # path ending in broker.broker.
            if (node.level == 2 and module == "broker") or module.endswith("broker.broker"):
                found.append(f"line {node.lineno}: from {'.' * node.level}{module} import ...")
            found += [f"line {node.lineno}: imports {a.name}" for a in node.names if a.name == "Broker"]
        elif isinstance(node, ast.Import):
            found += [f"line {node.lineno}: import {a.name}" for a in node.names if a.name.endswith("broker.broker")]
    return found


def _names_in(annotation: ast.expr) -> set[str]:
    """Every name an annotation mentions (``typing.Any`` and ``Any`` both give ``Any``); strings are parsed."""
    names: set[str] = set()
    for node in ast.walk(annotation):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names |= _names_in(ast.parse(node.value, mode="eval").body)
    return names


def test_the_processor_modules_are_found() -> None:
    assert {p.stem for p in MODULES} >= {"base", "send", "pull", "consumer", "admin", "transaction", "query", "pop"}
    assert len(PROCESSOR_CLASSES) == 7


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_no_processor_module_imports_the_broker(path: Path) -> None:
    assert _imports_of_broker(ast.parse(path.read_text(), str(path))) == []


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_processor_constructors_take_typed_dependencies_and_no_any(path: Path) -> None:
    tree = ast.parse(path.read_text(), str(path))
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        if not any(isinstance(b, ast.Name) and b.id.endswith("Processor") for b in cls.bases) \
                and cls.name != "Processor":
            continue
        for init in (n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"):
            args = init.args
            params = [*args.posonlyargs, *args.args, *args.kwonlyargs][1:]  # not self
            assert args.vararg is None and args.kwarg is None, f"{cls.name}.__init__ takes *args/**kwargs"
            for param in params:
                assert param.annotation is not None, f"{cls.name}.__init__({param.arg}) is not annotated"
                names = _names_in(param.annotation)
                assert "Any" not in names and "object" not in names, \
                    f"{cls.name}.__init__({param.arg}: {ast.unparse(param.annotation)}) is untyped"
                assert "Broker" not in names, f"{cls.name}.__init__({param.arg}) takes the whole Broker"


@pytest.mark.parametrize("cls", PROCESSOR_CLASSES, ids=lambda c: c.__name__)
def test_processor_dependencies_resolve_to_real_types(cls: type[Processor]) -> None:
    """The annotations name importable classes or protocols (not strings only a type checker could read)."""
    hints = typing.get_type_hints(cls.__init__)
    params = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    assert params, f"{cls.__name__} takes no dependencies"
    for name in params:
        hint = hints[name]
        assert hint is not typing.Any and hint is not object, f"{cls.__name__}({name}) is {hint!r}"
        assert isinstance(hint, type), f"{cls.__name__}({name}) is {hint!r}, not a class or protocol"


def test_the_processor_base_re_exports_no_broker_component() -> None:
    """``Processor`` keeps the broker's state (name, running, operation) and the shared checks; no ``Any`` property."""
    properties = {name for name, value in vars(Processor).items() if isinstance(value, property)}
    assert properties <= {"name", "running"}
    hints = typing.get_type_hints(Processor.__init__)
    assert typing.Any not in hints.values()
