"""The docs site builds clean and shows everything the code declares, and the README stays a front page.

`mkdocs build --strict` is run as `make docs` runs it, into a temporary dir: a broken link, a missing
anchor, a page left out of the nav or an unknown generated table fails it. The built HTML then has to
name every CLI command and option (from the typer app), every `init()` and callback option, every
event, exit code and failure kind (from their declarations), so a new one cannot be missing from the
site: the reference tables are generated at build time (docs/gen_reference.py), and this checks that
the pages still ask for them and that what they render reaches the HTML.
"""

from __future__ import annotations

import dataclasses
import html
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.docs import gen_reference

pytestmark = pytest.mark.xdist_group("docs_site")   # one worker, one build

MKDOCS = [sys.executable, "-m", "mkdocs"]
README_MAX_LINES = 200


def gen():
    return gen_reference()


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> str:
    """The text of every page of a strict build, tags stripped, entities decoded."""
    out = tmp_path_factory.mktemp("site")
    p = subprocess.run([*MKDOCS, "build", "--strict", "--site-dir", str(out)], cwd=REPO, capture_output=True,
                       text=True, timeout=240)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    pages = [f.read_text() for f in out.rglob("*.html")]
    return html.unescape(re.sub(r"<[^>]+>", "", "\n".join(pages)))


def test_the_strict_build_succeeds(site: str) -> None:
    assert "resilient-run" in site


def test_every_cli_command_and_parameter_is_on_the_site(site: str) -> None:
    commands = gen().cli_commands()
    from supervisor.cli import COMMANDS

    assert set(commands) == set(COMMANDS)
    flat = " ".join(site.split())
    for name, cmd in commands.items():
        assert f"resilient-run {name}" in site, name
        for param in cmd.params:
            if param.name == "help":
                continue
            words = [*param.opts, *param.secondary_opts] if gen().is_option(param) else [
                param.metavar or param.name.upper()]
            for w in words:
                assert w in site, (name, w)
            if gen().is_option(param) and param.help:
                assert " ".join(param.help.replace("\\[", "[").split())[:40] in flat, (name, param.opts)


def test_the_top_level_options_are_on_the_site(site: str) -> None:
    import typer.main

    from supervisor.cli import app

    top = [p for p in typer.main.get_command(app).params if gen().is_option(p)]
    assert top   # --version
    for param in top:
        for w in [*param.opts, *param.secondary_opts]:
            assert w in site, w


def test_every_init_and_callback_option_is_on_the_site(site: str) -> None:
    from trainer_shim._loop.options import Options
    from trainer_shim.integrations._options import CallbackOptions
    from trainer_shim.rundir import CALLBACK_OPTIONS

    for f in dataclasses.fields(Options):
        assert f"{f.name} {f.default!r} {' '.join(f.metadata['doc'].split())}" in " ".join(site.split()), f.name
    for name in [*inspect.signature(CallbackOptions.__init__).parameters, *CALLBACK_OPTIONS]:
        if name not in ("self", "trainer"):
            assert name in site, name


def test_every_event_exit_code_and_failure_kind_is_on_the_site(site: str) -> None:
    from trainer_shim.rundir import Event, Kind, exits

    flat = " ".join(site.split())
    for ev in Event:
        assert ev.value in site, ev
    for name in exits.__all__:
        assert f"{name} {getattr(exits, name)}" in flat, name
    for kind in Kind:
        assert f"{kind.value} {kind.name}" in flat, kind


def test_the_run_dir_contract_is_on_the_site(site: str) -> None:
    from trainer_shim.rundir import env

    for name in env.ENV_NAMES:
        assert name in site, name


def test_every_generated_table_is_asked_for_by_a_page() -> None:
    """A generator no page uses would leave its table off the site; a page's marker without one fails the build."""
    asked = {m for p in (REPO / "docs").rglob("*.md") for m in gen().MARKER.findall(p.read_text())}
    assert asked == set(gen().GENERATORS)


def test_a_declared_comment_is_read_from_the_code() -> None:
    # What the generated tables' "meaning" columns rest on: a parser that read nothing would pass the rest.
    from trainer_shim.rundir import Event, exits

    notes = gen().declared_comments(exits)
    assert notes["EXIT_LOCKED"] == "another live supervisor holds the run dir"
    assert "a preempt checkpoint was saved" in notes["EXIT_PREEMPTED"].lower()
    assert gen().declared_comments(Event)["ATTEMPT_STARTED"].startswith("W supervisor")


def test_an_unknown_generated_table_fails_the_build() -> None:
    with pytest.raises(KeyError, match="gen:nope"):
        gen().render("x\n<!-- gen:nope -->\n", "page.md")


def test_the_readme_is_a_front_page() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES
    for path in re.findall(r"\]\(((?:docs/)[^)#]+)", readme):   # every link into the docs lands on a file
        assert (REPO / path).exists(), path


def test_no_readme_paragraph_is_also_in_the_docs() -> None:
    """Everything moved, nothing copied: a paragraph (3+ lines of prose) of the README is in no docs page."""
    docs = " ".join(" ".join(p.read_text() for p in (REPO / "docs").rglob("*.md")).split())
    blocks = [b for b in (REPO / "README.md").read_text().split("\n\n") if len(b.splitlines()) >= 3]
    prose = [b for b in blocks if not b.startswith(("```", "#", "-", "!"))]
    assert prose
    assert [b[:60] for b in prose if " ".join(b.split()) in docs] == []
