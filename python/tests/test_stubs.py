"""The type stubs ``chorus/_chorus.pyi`` describe the extension as it is: every class,
function and method the extension has is in the stubs and the reverse, with the same
parameters (PyO3 publishes each one's ``__text_signature__``)."""

import ast
import inspect
import pathlib

import chorus
from chorus import _chorus

STUBS = pathlib.Path(chorus.__file__).with_name("_chorus.pyi")


def _stub_tree():
    return ast.parse(STUBS.read_text())


def _params(fn: ast.FunctionDef):
    a = fn.args
    names = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs]
    if a.vararg:
        names.append("*" + a.vararg.arg)
    if a.kwarg:
        names.append("**" + a.kwarg.arg)
    return [n for n in names if n not in ("self", "cls")]


def _runtime_params(obj):
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    names = []
    for p in sig.parameters.values():
        if p.name in ("self", "cls", "$self", "$cls"):
            continue
        prefix = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "")
        names.append(prefix + p.name)
    return names


def _public(names):
    return {n for n in names if not n.startswith("__") or n in ("__str__",)}


def test_module_level_names_match():
    tree = _stub_tree()
    stubbed = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            stubbed.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            stubbed.add(node.target.id)
    actual = {n for n in dir(_chorus) if not n.startswith("__") or n == "__version__"}
    assert stubbed == actual, f"only in stubs: {stubbed - actual}; only in the extension: {actual - stubbed}"


def test_every_method_and_its_parameters_match():
    tree = _stub_tree()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            assert _params(node) == _runtime_params(getattr(_chorus, node.name)), node.name
        if not isinstance(node, ast.ClassDef):
            continue
        cls = getattr(_chorus, node.name)
        stubbed = {}
        for item in node.body:
            if isinstance(item, ast.FunctionDef):
                stubbed[item.name] = item
        actual = _public(n for n, v in vars(cls).items() if callable(v) or isinstance(v, (property, staticmethod)) or inspect.isdatadescriptor(v))
        actual.discard("__new__")
        stub_names = _public(stubbed) - {"__init__"}
        assert stub_names == actual - {"__init__"}, (
            f"{node.name}: only in stubs: {stub_names - actual}; only in the extension: {actual - stub_names}"
        )
        for name, fn in stubbed.items():
            if name in ("__init__", "__str__") or any(
                isinstance(d, ast.Name) and d.id == "property" for d in fn.decorator_list
            ):
                continue
            runtime = _runtime_params(getattr(cls, name))
            if runtime is not None:
                assert _params(fn) == runtime, f"{node.name}.{name}: stubs {_params(fn)}, extension {runtime}"
