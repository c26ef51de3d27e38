"""Reference tables generated from the code at build time, so the site cannot drift from it.

A page asks for a table with a marker line, `<!-- gen:NAME -->`; this mkdocs hook (`hooks:` in
mkdocs.yml) replaces the marker with `GENERATORS[NAME]()` while the page is built. The prose around
a table stays in the page's Markdown file; the names, defaults, values and help come from their one
declaration in the code (the typer app, `Options`, `CallbackOptions`, the contract's enums, modules
and records). An unknown marker fails the build. The same functions are imported by
tests/docs/test_docs_site.py.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import inspect
import io
import re
import tokenize
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^<!-- gen:([a-z0-9_-]+) -->$", re.M)


# --- reading declarations ----------------------------------------------------------------------

def declared_comments(module: Any) -> dict[str, str]:
    """NAME -> the comment that documents its declaration in `module`'s source: the comment at the
    end of its line, else the comment lines right above it. Enum members, dataclass fields and module
    constants alike (`NAME = ...`, `NAME: type = ...`)."""
    source = inspect.getsource(module)
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    lines = source.splitlines()
    out: dict[str, str] = {}
    for no, line in enumerate(lines, 1):
        m = re.match(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?::[^=]+)?=(?!=)", line)
        if not m or line.lstrip().startswith("#"):
            continue
        name = m.group(1)
        if no in comments and not line.lstrip().startswith("#"):
            text = comments[no]
        else:
            above = []
            k = no - 1
            while k >= 1 and lines[k - 1].lstrip().startswith("#"):
                if not comments.get(k, "").startswith("---"):   # a section rule (`# --- the trainer ---`)
                    above.insert(0, comments.get(k, ""))
                k -= 1
            text = " ".join(above)
        out.setdefault(name, text)
    return out


def cell(text: Any) -> str:
    """One Markdown table cell: no pipes or newlines, no HTML read into `<tags>`."""
    parts = " ".join(str(text).split()).replace("|", "\\|").split("`")
    # `<` outside code spans only: inside one, `&lt;` would show as typed
    return "`".join(s if i % 2 else s.replace("<", "&lt;") for i, s in enumerate(parts))


def table(header: list[str], rows: list[list[Any]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def code(text: Any) -> str:
    return f"`{text}`"


# --- the CLI -----------------------------------------------------------------------------------

def _unmarkup(text: str) -> str:
    """typer reads help as rich markup, so the declarations escape brackets (`\\[s3]`): show them plain."""
    return text.replace("\\[", "[")


def is_option(param: Any) -> bool:
    """An option rather than an argument (typer's parameters are click's, or its own copy of click's)."""
    return getattr(param, "param_type_name", "") == "option"


def _param_row(param: Any, ctx: Any) -> list[str]:
    """[how it is written, its help]: the very record `--help` prints for it."""
    decl, help_text = param.get_help_record(ctx) or (param.name, "")
    return [decl if "|" in decl else code(decl), _unmarkup(help_text)]


def cli_commands() -> dict[str, Any]:
    """Command name -> its click command, as `resilient-run` builds it from the typer app."""
    import typer.main

    from supervisor.cli import app

    group = typer.main.get_command(app)
    return dict(group.commands)  # type: ignore[attr-defined]


def cli_reference() -> str:
    import typer.main

    from supervisor.cli import app

    group = typer.main.get_command(app)
    parts = [_unmarkup(group.help or ""), ""]
    top = [p for p in group.params if is_option(p)]
    if top:
        ctx = group.context_class(group, info_name="resilient-run")
        parts += ["Options of `resilient-run` itself:", "",
                  table(["option", "meaning"], [_param_row(p, ctx) for p in top]), ""]
    for name, cmd in cli_commands().items():
        ctx = cmd.context_class(cmd, info_name=f"resilient-run {name}")
        usage = " ".join(cmd.collect_usage_pieces(ctx))
        parts += [f"### `{name}`", "", "```", f"resilient-run {name} {usage}".rstrip(), "```", "",
                  _unmarkup(inspect.cleandoc(cmd.help or "")), ""]
        params = [p for p in cmd.params if p.name != "help"]
        if params:
            parts += [table(["parameter", "meaning (as `--help` shows it)"], [_param_row(p, ctx) for p in params]), ""]
    return "\n".join(parts).rstrip()


def run_options() -> str:
    from supervisor.cli_options import options_table

    return options_table()


# --- the shim's options ------------------------------------------------------------------------

def init_options() -> str:
    from trainer_shim._loop import options

    # `runs/<script stem>` would be read as an HTML tag (a <script> one, even)
    return options.table().replace("<", "&lt;")


def callback_options() -> str:
    from trainer_shim.integrations._options import CallbackOptions
    from trainer_shim.rundir import CALLBACK_OPTIONS

    params = inspect.signature(CallbackOptions.__init__).parameters
    rows = []
    for name, p in params.items():
        if name in ("self", "trainer"):
            continue
        yaml = f"`{name}` ({CALLBACK_OPTIONS[name].__name__})" if name in CALLBACK_OPTIONS else "—"
        rows.append([code(name), code(repr(p.default)), yaml])
    doc = " ".join(inspect.getdoc(CallbackOptions).split())
    return table(["option", "default", "config file `callback:` key"], rows) + "\n\n" + doc


# --- the run-dir contract ----------------------------------------------------------------------

def rundir_modules() -> str:
    """The contract package's own map (its docstring): one module per idea, and the layout."""
    import trainer_shim.rundir as rundir

    doc = inspect.getdoc(rundir) or ""
    return "```text\n" + doc.split("\n", 2)[2].strip().replace("::\n", ":\n") + "\n```"


def env_names() -> str:
    from trainer_shim.rundir import env

    notes = declared_comments(env)
    by_value = {v: k for k, v in vars(env).items() if k.startswith("ENV_") and isinstance(v, str)}
    return table(["variable", "constant", "meaning"],
                 [[code(n), code(by_value[n]), notes.get(by_value[n], "")] for n in env.ENV_NAMES])


def records() -> str:
    from trainer_shim.rundir import records as rec

    parts = []
    for cls in (rec.HeartbeatRecord, rec.SupervisorState, rec.ErrorRecord, rec.StandbyMessage):
        notes = declared_comments(cls)
        rows = []
        for f in dataclasses.fields(cls):
            default = "required" if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING else (
                code(repr(f.default)) if f.default is not dataclasses.MISSING else code(repr(f.default_factory())))
            rows.append([code(f.name), code(getattr(f.type, "__name__", f.type)), default, notes.get(f.name, "")])
        doc = " ".join((inspect.getdoc(cls) or "").split())
        parts += [f"### `{cls.__name__}`", "", doc, "", table(["field", "type", "default", "meaning"], rows), ""]
    for enum_cls in (rec.Phase, rec.RunState):
        parts += [f"### `{enum_cls.__name__}`", "", " ".join((inspect.getdoc(enum_cls) or "").split()), "",
                  _enum_table(enum_cls, rec), ""]
    return "\n".join(parts).rstrip()


def _enum_table(cls: type[enum.Enum], module: Any, header: str = "value") -> str:
    notes = declared_comments(cls)
    return table([header, "name", "meaning"], [[code(m.value), code(m.name), notes.get(m.name, "")] for m in cls])


# --- events, exit codes, failure kinds -----------------------------------------------------------

def events() -> str:
    from trainer_shim.rundir import events as ev

    notes = declared_comments(ev.Event)
    rows = []
    for m in ev.Event:
        note = notes.get(m.name, "")
        writer, _, fields = note.partition(":") if note.startswith("W ") else ("", "", note)
        rows.append([code(m.value), writer.removeprefix("W ").strip(), fields.strip()])
    return table(["event", "written by", "fields and meaning (from `Event`)"], rows)


def events_doc() -> str:
    from trainer_shim.rundir import events as ev

    return " ".join((inspect.getdoc(ev) or "").split("\n\n", 1)[-1].split())


def exit_codes() -> str:
    from trainer_shim.rundir import exits

    notes = declared_comments(exits)
    return table(["name", "code", "meaning (from `exits.py`)"],
                 [[code(n), getattr(exits, n), notes.get(n, "")] for n in exits.__all__])


def failure_kinds() -> str:
    from trainer_shim.rundir import kinds

    return _enum_table(kinds.Kind, kinds, header="kind")


GENERATORS: dict[str, Callable[[], str]] = {
    "cli": cli_reference,
    "run-options": run_options,
    "init-options": init_options,
    "callback-options": callback_options,
    "rundir-modules": rundir_modules,
    "env": env_names,
    "records": records,
    "events-doc": events_doc,
    "events": events,
    "exit-codes": exit_codes,
    "failure-kinds": failure_kinds,
}


def render(markdown: str, where: str = "") -> str:
    def one(m: re.Match) -> str:
        name = m.group(1)
        if name not in GENERATORS:
            raise KeyError(f"{where}: unknown generated table <!-- gen:{name} -->; known: {', '.join(GENERATORS)}")
        return GENERATORS[name]()

    return MARKER.sub(one, markdown)


# --- the mkdocs hook ---------------------------------------------------------------------------

def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    return render(markdown, page.file.src_path)


if __name__ == "__main__":   # print every table: python docs/gen_reference.py
    import sys

    sys.path.insert(0, str(REPO))
    for key, fn in GENERATORS.items():
        print(f"<!-- {key} -->\n{fn()}\n")
    importlib.invalidate_caches()
