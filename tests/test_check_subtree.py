"""`subtree` must yield exactly what `ast.walk` yields, in the same order: rules that stop at the first match rely
on it."""

from __future__ import annotations

import ast
from pathlib import Path

from torchdoctor.rules.static.semantic.subtree import node_fields, subtree

# Shapes whose fields hold None inside lists (`**rest` keys, keyword-only arguments without defaults), optional
# fields left empty, leaf singletons (Load, Add, And), match patterns, f-strings, async, type comments.
SOURCE = '''
import os, sys as system
from . import sibling
async def run(a, /, b=1, *args, c, d=2, **kw) -> int:  # type: ignore
    async with lock as held, other():
        async for x in stream():
            await x
    merged = {**kw, "k": [i async for i in gen() if i]}
    return a if b else -c
def plain(x, *, y, z=3):
    global counter
    match x:
        case {"a": 1, **rest}:
            pass
        case [1, *others] | Point(x=0, y=_) as p:
            pass
        case _:
            del x[0], y
    try:
        raise ValueError(f"{x!r:>{y}} and {z}") from None
    except* (OSError, KeyError) as e:
        assert e, "never"
    finally:
        lambda q=1, *r, **s: (yield q)
    with open(p) as f: print(*f, sep="", **{"end": ""})
    return [a for a in range(3) for b in range(a) if a and not b or a @ b]
class C(Base, metaclass=M):
    x: int = 1
    def __init__(self): super().__init__(); self.y += 1; self.z = self.y[1:2:3]
'''


def _same(tree: ast.AST) -> None:
    expected = [id(n) for n in ast.walk(tree)]
    assert [id(n) for n in subtree(tree)] == expected


def test_subtree_matches_ast_walk_on_every_shape() -> None:
    tree = ast.parse(SOURCE, type_comments=True)
    _same(tree)
    for node in ast.walk(tree):  # every subtree, not only the module
        _same(node)


def test_subtree_matches_ast_walk_on_the_project_sources() -> None:
    root = Path(__file__).resolve().parent.parent
    files = sorted(root.glob("rules/static/**/*.py"))[:40]
    assert files
    for path in files:
        _same(ast.parse(path.read_text(encoding="utf-8")))


def test_fields_that_cannot_hold_nodes_are_skipped() -> None:
    assert node_fields(ast.Name) == ("ctx",)  # `id` is an identifier
    assert node_fields(ast.Constant) == ()  # `value` is a constant, `kind` a string
    assert node_fields(ast.BinOp) == ("left", "op", "right")


def test_a_class_whose_signature_cannot_be_read_keeps_every_field() -> None:
    class Odd(ast.AST):
        """not an ASDL signature"""

        _fields = ("a", "b")

    assert node_fields(Odd) == ("a", "b")
    node = Odd()
    node.a, node.b = ast.Name("x", ast.Load()), [ast.Constant(1), None, "text"]
    assert [type(n).__name__ for n in subtree(node)] == [type(n).__name__ for n in ast.walk(node)]
