"""`run`'s flags, derived from their one declaration: the Config fields declared with a CliOption.

typer reads a command's parameters from its function's signature, so `with_run_options` writes
that signature (one keyword parameter per declared option) instead of a hand-written copy that
could drift from Config. The docs' table of run options (docs/reference/cli.md) is `options_table()`'s output.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Optional, TypeVar

import typer
from rich.markup import escape

from .config import cli_options, option_help

__all__ = ["with_run_options", "options_table"]

F = TypeVar("F", bound=Callable[..., Any])


def with_run_options(fn: F) -> F:
    """Give `fn(..., **options)` one typer option per declared flag, in place of its `**options`.

    Each is None unless given, so a flag overrides the config file only when it was passed."""
    signature = inspect.signature(fn, eval_str=True)   # real types: typer reads the annotations
    own = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    # escape: typer renders help as rich markup, which would swallow `[s3]` as a style tag
    derived = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=Optional[opt.cli_type],
                          default=typer.Option(None, opt.flag, help=escape(option_help(name))))
        for name, opt in cli_options().items()
    ]
    fn.__signature__ = signature.replace(parameters=own + derived)  # type: ignore[attr-defined]
    return fn


def options_table() -> str:
    """The Markdown table of run's options (flag, YAML key, help), as the docs show it."""
    rows = ["| flag | YAML key | meaning |", "|---|---|---|"]
    for name, opt in cli_options().items():
        flags = " ".join(f"`{f}`" for f in opt.flag.split("/"))
        # `<script stem>` would be read as an HTML tag and dropped by a Markdown renderer
        rows.append(f"| {flags} | `{name}` | {option_help(name).replace('<', '&lt;')} |")
    return "\n".join(rows)
