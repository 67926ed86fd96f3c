"""Cutting the built-in prompts from the running Python's standard library: the maintainers' regeneration.

Users never run this: the ``builtin`` source reads the sets shipped in ``data_gen/prompts/data``
(:mod:`data_gen.prompts.shipped`), cut once with this code, so that every Python decodes the same
prompts; ``python -m data_gen.prompts --rebuild`` cuts them again (``docs/zoo.md``).

A prompt's split is the split of the module it comes from (``data_gen.corpus.split_of``), so
test prompts come only from modules the built-in models never trained on.

* ``function``: a function or method's decorators, ``def`` line(s) and docstring, dedented to
  column 0 and ending with a newline, so the model continues with the body.
* ``module``: the first lines of a module, or of a multi-line top-level statement, so the model
  continues the code.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Iterator

from data_gen.corpus import Split, StdlibModule, modules_in
from data_gen.prompts.builtin import SOURCE, STYLES
from runtime.prompt import Prompt

MAX_CHARS = 600  # prompt budget: longer docstrings are cut after their first paragraph, or the function skipped
MAX_LINES = 40  # line budget of module-style prompts and of references

_Lines = list[str]
_TRIPLE_QUOTE = re.compile(r"\s*[rRuU]?(\"\"\"|''')")


def cut_prompts(split: Split, max_chars: int = MAX_CHARS) -> dict[str, list[Prompt]]:
    """Every prompt of one split, by style, in corpus order (module name, then position)."""
    prompts: dict[str, list[Prompt]] = {style: [] for style in STYLES}
    for module in modules_in(split):
        for prompt in _module_prompts(module, max_chars):
            prompts[prompt.style].append(prompt)
    return prompts


def _module_prompts(module: StdlibModule, max_chars: int) -> tuple[Prompt, ...]:
    """Both styles' prompts of one module; empty if the module does not parse."""
    source = module.read()
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):  # ValueError: null bytes in the source
        return ()
    lines = source.rstrip("\n").split("\n")  # not splitlines(): ast counts only \n (read() made \r\n \n)
    found: list[tuple[str, str, str, str]] = []  # style, name, text, reference
    for name, node in _functions(tree.body, ""):
        cut = _function_prompt(lines, node, max_chars)
        if cut is not None:
            found.append(("function", name, *cut))
    for name, start, end in _spans(tree, len(lines)):
        cut = _head(lines, start, end, max_chars)
        if cut is not None:
            found.append(("module", name, *cut))
    return tuple(_with_ids(module, found))


def _with_ids(module: StdlibModule, found: list[tuple[str, str, str, str]]) -> Iterator[Prompt]:
    """Prompts with stable ids; a name repeated in a module (e.g. a property setter) gets ``#2``, ``#3`` …"""
    seen: Counter[tuple[str, str]] = Counter()
    for style, name, text, reference in found:
        seen[style, name] += 1
        suffix = f"#{seen[style, name]}" if seen[style, name] > 1 else ""
        target = f"{module.name}:{name}" if name else module.name
        yield Prompt(
            id=f"{SOURCE}/{style}/{target}{suffix}",
            text=text,
            source=SOURCE,
            split=module.split,
            style=style,
            reference=reference,
        )


def _functions(body: list[ast.stmt], prefix: str) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function or method under ``body`` (also inside ``if``/``try``), with its qualified name."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, node
            yield from _functions(node.body, f"{prefix}{node.name}.<locals>.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node.body, f"{prefix}{node.name}.")
        else:  # conditional definitions: inside if / try / with / for / while / match
            for field in ("body", "orelse", "finalbody"):
                yield from _functions(getattr(node, field, []), prefix)
            for clause in getattr(node, "handlers", []) + getattr(node, "cases", []):
                yield from _functions(clause.body, prefix)


def _function_prompt(lines: _Lines, node: ast.FunctionDef | ast.AsyncFunctionDef, max_chars: int) -> tuple[str, str] | None:
    """(prompt, reference) for a function whose docstring stands on its own lines and is followed by a body."""
    doc = node.body[0]
    if not (isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str)):
        return None
    if len(node.body) < 2 or node.body[1].lineno <= doc.end_lineno:
        return None
    first_doc_line, last_doc_line = lines[doc.lineno - 1], lines[doc.end_lineno - 1]
    if first_doc_line[: doc.col_offset].strip() or last_doc_line.encode()[doc.end_col_offset :].strip():
        return None  # docstring shares a line with other code
    start = min([node.lineno] + [d.lineno for d in node.decorator_list])
    indent = lines[node.lineno - 1][: node.col_offset]
    signature = lines[start - 1 : doc.lineno - 1]
    docstring = lines[doc.lineno - 1 : doc.end_lineno]
    text = _dedent(signature + docstring, indent)
    if len(text) > max_chars:
        summary = _summary(docstring, first_doc_line[: doc.col_offset])
        if summary is None:
            return None
        text = _dedent(signature + summary, indent)
        if len(text) > max_chars:
            return None
    body = _fit(lines[doc.end_lineno : node.end_lineno], max_chars, MAX_LINES)
    return text, _dedent(body, indent)


def _summary(docstring: _Lines, indent: str) -> _Lines | None:
    """A triple-quoted docstring cut after its first paragraph and closed again; None if it has no break."""
    quote = _TRIPLE_QUOTE.match(docstring[0])
    if quote is None:
        return None
    kept, has_content = [docstring[0]], bool(docstring[0][quote.end() :].strip())
    for line in docstring[1:-1]:
        if not line.strip() and has_content:
            return kept + [indent + quote.group(1)]
        kept.append(line)
        has_content = has_content or bool(line.strip())
    return None


def _spans(tree: ast.Module, n_lines: int) -> Iterator[tuple[str, int, int]]:
    """(name, first line, last line) of the module and of each multi-line top-level statement."""
    yield "", 1, n_lines
    for node in tree.body:
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        if node.end_lineno is None or node.end_lineno - start < 2:
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = node.name
        else:
            name = f"<{type(node).__name__.lower()}>"
        yield name, start, node.end_lineno


def _head(lines: _Lines, start: int, end: int, max_chars: int) -> tuple[str, str] | None:
    """(prompt, reference): the first lines of lines ``start..end`` (1-based) within the budgets, and what follows."""
    span = lines[start - 1 : end]
    head = _fit(span[:-1], max_chars, MAX_LINES)
    while head and not head[-1].strip():
        head.pop()
    if sum(1 for line in head if line.strip()) < 2:
        return None
    rest = _fit(span[len(head) :], max_chars, MAX_LINES)
    if not any(line.strip() for line in rest):
        return None
    return "\n".join(head) + "\n", "\n".join(rest) + "\n"


def _fit(lines: _Lines, max_chars: int, max_lines: int) -> _Lines:
    """The longest leading run of whole lines within ``max_lines`` lines and ``max_chars`` characters."""
    kept, used = [], 0
    for line in lines[:max_lines]:
        used += len(line) + 1
        if used > max_chars:
            break
        kept.append(line)
    return kept


def _dedent(lines: _Lines, indent: str) -> str:
    """Lines with ``indent`` removed where they start with it, joined and newline-terminated."""
    return "".join((line[len(indent) :] if line.startswith(indent) else line) + "\n" for line in lines)
