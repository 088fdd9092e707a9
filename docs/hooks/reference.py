"""The documentation site's generated reference: a MkDocs hook and a griffe extension.

MkDocs hook (``hooks:`` in ``mkdocs.yml``): a page line ``<!-- generated: NAME -->`` is replaced,
at build time, with markdown made from the code, so the page cannot drift from it:

``cli``
    Every ``triton-nb`` sub-command: usage, description and options (flag, default, help,
    choices), from the parser :func:`triton_nb.cli._build_parser` builds.
``settings``
    One table row per :class:`triton_nb.ServerSettings` field (name, type, default, the
    ``triton-nb serve`` flag, description), from the fields' metadata, which ``triton-nb serve``
    builds its flags from too.
``magics``
    The options of ``%triton``, ``%%triton_infer`` and ``%triton_perf``, from their
    ``magic_arguments`` parsers.

Griffe extension (``extensions:`` of mkdocstrings' Python handler), for the docstrings of
``triton_nb``, which are numpydoc with reStructuredText inline markup:

* Sphinx roles (``:class:`~triton_nb.X```, ``:func:``, ``:meth:``...) become cross-references:
  a link where the target is on the site, inline code otherwise;
* a paragraph ending in ``::`` (reST's literal block) ends in ``:``, its indented block stays code;
* a class whose ``__doc__`` is assigned in its body (the server, whose parameters are the
  settings') gets its docstring as Python sees it;
* a dataclass field documented in its ``dataclasses.field`` metadata (``help``) gets that
  documentation and its real default, and ``#:`` comments above an attribute document it.

Nothing here changes the package; it only reads it.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import html
import importlib
import inspect
import os
import re
import textwrap
from collections.abc import Callable, Iterator
from typing import Any

from griffe import Alias, Attribute, Class, Docstring, ExprCall, Extension, GriffeLoader, Module, Object

PACKAGE = "triton_nb"
_MARKER = re.compile(r"^<!--\s*generated:\s*([\w-]+)\s*-->\s*$", re.MULTILINE)
# the width argparse wraps usage lines at (it reads COLUMNS)
_USAGE_COLUMNS = "100"


# --------------------------------------------------------------------------- reST -> markdown
_ROLE = re.compile(r":(?:py:)?(class|func|meth|mod|attr|data|exc|obj|const):`([^`]+)`")
_CODE_SPAN = re.compile(r"(``.+?``|`[^`]+`)")


def rst_to_markdown(text: str, resolve: Callable[[str], str] = lambda target: target) -> str:
    """reST inline markup of a docstring as markdown: roles as optional cross-references
    (``resolve`` turns a role's target into a full identifier), literal-block markers as colons."""

    def role(match: re.Match[str]) -> str:
        kind, content = match.groups()
        explicit = re.fullmatch(r"(.+?)\s*<(.+)>", content)
        if explicit:
            title, target = explicit.groups()
        else:
            short = content.startswith("~")
            target = content.lstrip("~")
            title = target.lstrip(".").rsplit(".", 1)[-1] if short else target.lstrip(".")
            if kind in ("func", "meth"):
                title += "()"
        identifier = resolve(target.lstrip("~"))
        # autorefs links an optional reference where the target is rendered, else shows it as code
        return (f'<autoref identifier="{html.escape(identifier)}" optional>'
                f"<code>{html.escape(title)}</code></autoref>")

    text = _ROLE.sub(role, text)
    text = re.sub(r"^[ \t]*::[ \t]*$\n?", "", text, flags=re.MULTILINE)  # a bare "::" line
    return re.sub(r"(\S)::[ \t]*$", r"\1:", text, flags=re.MULTILINE)  # "Typical use::"


def _table_cell(markdown: str) -> str:
    """Markdown for one table cell: one line, pipes outside code spans escaped."""
    parts = _CODE_SPAN.split(" ".join(markdown.split()))
    return "".join(part if i % 2 else part.replace("|", r"\|") for i, part in enumerate(parts))


def _text_cell(text: str) -> str:
    """Plain text (argparse help) for a table cell: nothing in it is read as markup."""
    text = html.escape(" ".join(text.split()), quote=False)
    for char in "|*_`[]\\":
        text = text.replace(char, f"&#{ord(char)};")
    return text


def _code_cell(text: str) -> str:
    return f"<code>{_text_cell(text)}</code>"


# --------------------------------------------------------------------------- argparse -> markdown
@contextlib.contextmanager
def _usage_width() -> Iterator[None]:
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = _USAGE_COLUMNS
    try:
        yield
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved


def _default(action: argparse.Action) -> str:
    default = action.default
    if action.required:
        return "required"
    if isinstance(action, argparse._StoreTrueAction):
        return "on" if default else "off"
    if isinstance(action, argparse._StoreFalseAction):
        return "off" if default is False else "on"
    if default is None or default is argparse.SUPPRESS or default in ([], ""):
        return "—"
    if isinstance(default, bool):
        return _code_cell(str(default).lower())  # as a flag's true/false value reads
    if isinstance(default, list | tuple):
        values = [str(value) for value in default]
        return _code_cell(",".join(values if len(values) <= 6 else [*values[:2], "…", values[-1]]))
    return _code_cell(str(default))


def _sentences(*parts: str) -> str:
    """Parts of a description joined as sentences (argparse help rarely ends with a full stop)."""
    parts = tuple(part for part in parts if part)
    return " ".join(part if part[-1] in ".!?" or i == len(parts) - 1 else part + "." for i, part in enumerate(parts))


def _options_table(parser: argparse.ArgumentParser, actions: list[argparse.Action], heading: str) -> list[str]:
    formatter = parser._get_formatter()
    rows = [f"| {heading} | Default | Description |", "| --- | --- | --- |"]
    for action in actions:
        if isinstance(action, argparse._HelpAction) or action.help is argparse.SUPPRESS:
            continue
        invocation = formatter._format_action_invocation(action)
        parts = [_text_cell(formatter._expand_help(action)) if action.help else ""]
        # choices the invocation does not show already ({a,b}), as with a metavar
        if action.choices is not None and "{" not in invocation:
            parts.append("Choices: " + ", ".join(_code_cell(str(choice)) for choice in action.choices) + ".")
        if isinstance(action, argparse._AppendAction) and "repeatable" not in (action.help or "").lower():
            parts.append("Repeatable.")
        rows.append(f"| {_code_cell(invocation)} | {_default(action)} | {_sentences(*parts) or '—'} |")
    return rows if len(rows) > 2 else []


def _exclusive_groups(parser: argparse.ArgumentParser) -> list[str]:
    notes = []
    for group in parser._mutually_exclusive_groups:
        # a deprecated spelling kept for a release is hidden (help=SUPPRESS): a group of one shown flag
        # is that flag, required or not as its usage line says
        shown = [action for action in group._group_actions if action.help is not argparse.SUPPRESS]
        if len(shown) < 2:
            continue
        flags = ", ".join(_code_cell(action.option_strings[-1] if action.option_strings else action.dest)
                          for action in shown)
        notes.append(f"{'Exactly' if group.required else 'At most'} one of {flags}.")
    return notes


def _usage(parser: argparse.ArgumentParser) -> str:
    with _usage_width():
        usage = parser.format_usage()
    # IPython's magic parsers format theirs as a reST literal block ("::", then indented)
    return textwrap.dedent(re.sub(r"^\s*::\s*\n", "", usage)).strip()


def _parser_markdown(parser: argparse.ArgumentParser, usage: str | None = None) -> list[str]:
    """Usage, description, option tables (one per argument group) and epilog of one parser."""
    lines = ["```text", usage or _usage(parser), "```", ""]
    if parser.description:
        lines += [_text_cell(parser.description), ""]
    for group in parser._action_groups:
        positional = group.title == "positional arguments"
        table = _options_table(parser, group._group_actions, "Argument" if positional else "Option")
        if not table:
            continue
        title = {"options": "Options", "optional arguments": "Options",
                 "positional arguments": "Arguments"}.get(group.title or "", group.title or "")
        lines += [f"**{_text_cell(title[:1].upper() + title[1:])}**", ""]
        if group.description:
            lines += [_text_cell(group.description), ""]
        lines += [*table, ""]
    notes = _exclusive_groups(parser)
    if notes:
        lines += [" ".join(notes), ""]
    if parser.epilog:
        lines += [_text_cell(parser.epilog), ""]
    return lines


def _subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, subparser in action.choices.items():
                yield name, helps.get(name, ""), subparser


def cli_markdown() -> str:
    """Reference of the ``triton-nb`` command, from its argparse parser."""
    from triton_nb.cli import _build_parser

    parser = _build_parser()
    commands = list(_subcommands(parser))
    lines = ["```text", _usage(parser), "```", "", "| Command | What it does |", "| --- | --- |"]
    lines += [f"| [`{name}`](#triton-nb-{name}) | {_text_cell(help_text)} |" for name, help_text, _ in commands]
    lines.append("")
    for name, help_text, subparser in commands:
        lines += [f"## `triton-nb {name}` {{ #triton-nb-{name} }}", ""]
        if help_text and help_text.rstrip(".") != (subparser.description or "").rstrip("."):
            lines += [_text_cell(help_text[:1].upper() + help_text[1:]) + ".", ""]
        lines += _parser_markdown(subparser)
    return "\n".join(lines)


def magics_markdown() -> str:
    """Reference of the IPython magics, from their ``magic_arguments`` parsers."""
    from triton_nb.notebook.magics import TritonMagics

    lines: list[str] = []
    for name, prefix in (("triton", "%"), ("triton_infer", "%%"), ("triton_perf", "%")):
        parser = getattr(TritonMagics, name).parser
        usage = _usage(parser)  # "%name ...", as IPython shows it; a cell magic takes "%%"
        lines += [f"### `{prefix}{name}` {{ #magic-{name.replace('_', '-')} }}", ""]
        lines += _parser_markdown(parser, prefix[1:] + usage)
    return "\n".join(lines)


# --------------------------------------------------------------------------- ServerSettings -> markdown
def _setting_default(field: dataclasses.Field[Any]) -> str:
    default = field.default
    if default is None:
        return "`None`"
    if isinstance(default, int) and not isinstance(default, bool) and default >= 1 << 20 and default % (1 << 20) == 0:
        return f"`{default}` ({default >> 20} MiB)"
    if isinstance(default, tuple) and not default:
        return "`()`"
    return f"`{default!r}`"


def settings_markdown() -> str:
    """One row per :class:`triton_nb.ServerSettings` field, from the field's metadata."""
    from triton_nb.server.settings import ServerSettings

    rows = ["| Setting | Type | Default | `triton-nb serve` flag | Description |", "| --- | --- | --- | --- | --- |"]
    for field in dataclasses.fields(ServerSettings):
        meta = field.metadata
        flag_parts = []
        if meta["flag"] is not None:
            flags = [meta["flag"], *meta.get("aliases", ())]
            metavar = meta.get("metavar")
            flag_parts.append(", ".join(f"`{flag}{' ' + metavar if metavar else ''}`" for flag in flags))
            if "cli_default" in meta:
                flag_parts.append(f"(default `{meta['cli_default']}`)")
            if meta.get("repeat"):
                flag_parts.append("(repeatable)")
        if meta.get("cli"):
            flag_parts.append(("no flag — " if meta["flag"] is None else "; ") + html.escape(meta["cli"]))
        description = rst_to_markdown(meta["help"], _absolute)
        if "choices" in meta:
            description += " One of " + ", ".join(f"`{choice}`" for choice in meta["choices"]) + "."
        cells = [f"`{field.name}`", f"`{field.type}`", _setting_default(field), " ".join(flag_parts).replace(" ;", ";"),
                 description]
        rows.append("| " + " | ".join(_table_cell(cell) for cell in cells) + " |")
    return "\n".join(rows)


def _absolute(target: str) -> str:
    return target if target.startswith(f"{PACKAGE}.") else f"{PACKAGE}.{target.lstrip('.')}"


_GENERATORS: dict[str, Callable[[], str]] = {"cli": cli_markdown, "settings": settings_markdown,
                                             "magics": magics_markdown}


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    """Replace each ``<!-- generated: NAME -->`` line with the markdown NAME's generator makes."""

    def generate(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in _GENERATORS:
            raise ValueError(f"{page.file.src_uri}: no generator named {name!r} (known: {', '.join(_GENERATORS)})")
        return _GENERATORS[name]()

    return _MARKER.sub(generate, markdown)


# --------------------------------------------------------------------------- griffe extension
class TritonNBDocstrings(Extension):
    """Docstrings of ``triton_nb`` made ready for mkdocstrings (see the module's docstring)."""

    def on_package(self, *, pkg: Module, loader: GriffeLoader, **kwargs: Any) -> None:
        if pkg.name != PACKAGE:
            return
        objects = list(_walk(pkg))
        for obj in objects:
            if isinstance(obj, Class):
                _runtime_class_docstring(obj, loader)
                _field_docstrings(obj, loader)
            elif isinstance(obj, Attribute) and obj.docstring is None:
                _comment_docstring(obj, loader)
                _trait_docstring(obj, loader)
        for obj in objects:
            if obj.docstring is not None:
                obj.docstring.value = rst_to_markdown(obj.docstring.value, lambda target, o=obj: _resolve(o, target))


def _walk(obj: Object) -> Iterator[Object]:
    yield obj
    for member in list(obj.members.values()):
        if not isinstance(member, Alias):
            yield from _walk(member)


def _docstring(text: str, obj: Object, loader: GriffeLoader) -> Docstring:
    return Docstring(inspect.cleandoc(text), lineno=obj.lineno, parent=obj, parser=loader.docstring_parser,
                     parser_options=loader.docstring_options)


def _runtime_object(obj: Object) -> Any:
    return getattr(importlib.import_module(obj.module.path), obj.name)


def _runtime_class_docstring(cls: Class, loader: GriffeLoader) -> None:
    """A class body that assigns ``__doc__`` (built from other text): the docstring Python has."""
    if "__doc__" not in cls.members:
        return
    cls.del_member("__doc__")
    cls.docstring = _docstring(_runtime_object(cls).__doc__ or "", cls, loader)


def _field_docstrings(cls: Class, loader: GriffeLoader) -> None:
    """Dataclass fields documented in their metadata (``help``): that text, and the real default."""
    if not any("dataclass" in str(decorator.value) for decorator in cls.decorators):
        return
    # fields declared through a helper call (not a plain default, not dataclasses.field itself)
    declared = {name: member for name, member in cls.members.items()
                if isinstance(member, Attribute) and member.docstring is None and isinstance(member.value, ExprCall)
                and getattr(member.value.function, "canonical_path", "") != "dataclasses.field"}
    if not declared:
        return
    try:
        runtime = _runtime_object(cls)
    except ImportError:  # a module that runs elsewhere (a model.py template): its static docs stand
        return
    for field in dataclasses.fields(runtime):
        member = declared.get(field.name)
        if member is None or "help" not in field.metadata:
            continue
        member.docstring = _docstring(field.metadata["help"], member, loader)
        if field.default is not dataclasses.MISSING:
            member.value = repr(field.default)  # the dataclasses extension makes __init__'s defaults from it


def _comment_docstring(attr: Attribute, loader: GriffeLoader) -> None:
    """Sphinx's ``#:`` comments above an attribute, as its docstring."""
    if attr.lineno is None or not attr.module.filepath:
        return
    lines = attr.module.lines
    comment: list[str] = []
    index = attr.lineno - 2
    while index >= 0 and lines[index].lstrip().startswith("#:"):
        comment.insert(0, lines[index].lstrip()[2:].strip())
        index -= 1
    if comment:
        attr.docstring = _docstring("\n".join(comment), attr, loader)


def _trait_docstring(attr: Attribute, loader: GriffeLoader) -> None:
    """A traitlets trait (``Unicode("", help="...").tag(config=True)``): its ``help``, as its docstring."""
    if attr.docstring is not None or attr.value is None:
        return
    try:
        tree = ast.parse(str(attr.value), mode="eval")
    except SyntaxError:
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "help" and isinstance(node.value, ast.Constant):
            attr.docstring = _docstring(str(node.value.value), attr, loader)
            return


def _resolve(obj: Object, target: str) -> str:
    """The full identifier a role's target names, seen from ``obj`` (as Sphinx looks it up)."""
    collection = obj.modules_collection
    scopes = []
    scope: Object | None = obj
    while scope is not None:
        scopes.append(scope.path)
        scope = scope.parent
    if target.startswith("."):
        candidates = [f"{path}{target}" for path in scopes]
    else:
        candidates = [target, *(f"{path}.{target}" for path in scopes)]
    for candidate in candidates:
        with contextlib.suppress(Exception):
            collection[candidate]
            return candidate
    return target.lstrip(".")
