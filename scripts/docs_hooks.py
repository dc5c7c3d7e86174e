"""MkDocs hooks: pages made from the repository's own files and from the code.

* ``index.md``, ``benchmarks.md``, ``reliability.md``, ``changelog.md`` and
  ``examples.md`` are the README, BENCHMARKS.md, RELIABILITY.md, CHANGELOG.md and the
  examples' READMEs, with their links pointed at the site's pages;
* ``docs/settings.md`` lists every field of ``celery_scheduler.config.Settings`` with its
  type and default, and the meaning ``configuration.md`` gives it (a setting without one
  fails the build), and ``docs/cli.md`` is the ``--help`` of every ``celery ... scheduler``
  command, from click. Both are committed, to be read in the repository too: the build fails
  when either differs from what the code makes now, and ``python scripts/docs_hooks.py``
  writes them again.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path
from typing import Any

import click
from mkdocs.structure.files import File, Files

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# repository files shown as pages, and the page each becomes
PAGES = {"README.md": "index.md", "BENCHMARKS.md": "benchmarks.md",
         "RELIABILITY.md": "reliability.md", "CHANGELOG.md": "changelog.md"}
EXAMPLES = ["examples/django_app", "examples/flask_app"]
_LINK = re.compile(r"\]\(([^)#\s]+)(#[^)\s]*)?\)")


def _target(link: str, page: str) -> str | None:
    """Where a link of *page* (a path in the repository) points on the site, if it moved."""
    if "://" in link or link.startswith("mailto:"):
        return None
    where = (REPO / Path(page).parent / link).resolve()
    relative = where.relative_to(REPO).as_posix() if where.is_relative_to(REPO) else link
    if relative in PAGES:
        return PAGES[relative]
    if relative.startswith("docs/"):
        return relative[len("docs/"):]
    if relative == "LICENSE":
        return "changelog.md#license"
    if any(relative.startswith(example) for example in EXAMPLES):
        return "examples.md#" + relative.rstrip("/").rsplit("/", 1)[-1].replace("_", "-")
    return None


def _relinked(text: str, source: str) -> str:
    """*text* of repository file *source*, its links pointed at the pages they became."""

    def replace(match: re.Match[str]) -> str:
        target = _target(match.group(1), source)
        if target is None:
            return match.group(0)
        anchor = match.group(2) or ""
        if "#" in target and anchor:
            target = target.split("#")[0]
        return f"]({target}{anchor})"

    return _LINK.sub(replace, text)


def _settings_page(configuration: str) -> str:
    from celery_scheduler.config import PREFIX, Settings

    meanings: dict[str, str] = {}
    for line in configuration.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].startswith(f"`{PREFIX}"):
            meanings[cells[0].strip("`")] = cells[-1]
    rows = ["| setting | type | default | meaning |", "|---|---|---|---|"]
    missing = []
    for field in dataclasses.fields(Settings):
        name = PREFIX + field.name
        if name not in meanings:
            missing.append(name)
            continue
        if field.default is not dataclasses.MISSING:
            default = repr(field.default)
        elif field.default_factory is not dataclasses.MISSING:
            default = repr(field.default_factory())
        else:
            default = "(required)"
        kind = str(field.type).replace("|", "or")
        rows.append(f"| `{name}` | `{kind}` | `{default}` | {meanings[name]} |")
    if missing:
        raise ValueError(f"configuration.md gives no meaning for {missing}")
    return ("# Every setting\n\nGenerated from `celery_scheduler.config.Settings`; the meanings "
            "are those of [Configuration](configuration.md).\n\n" + "\n".join(rows) + "\n")


def _cli_page() -> str:
    from celery_scheduler.cli import scheduler

    parts = ["# Command line\n", "Every command runs as `celery -A proj scheduler ...`; this page is "
             "their `--help`.\n", "![scheduler status](images/cli-status.png)\n"]

    def walk(command: click.Command, path: list[str]) -> None:
        # one width, whatever the terminal: the page is compared with the committed one
        context = click.Context(command, info_name=" ".join(path), terminal_width=90,
                                max_content_width=90)
        parts.append(f"## `{' '.join(path)}`\n\n```text\n{command.get_help(context)}\n```\n")
        if isinstance(command, click.Group):
            for name in sorted(command.commands):
                walk(command.commands[name], [*path, name])

    walk(scheduler, ["celery -A proj scheduler"])
    return "\n".join(parts)


def _examples_page() -> str:
    parts = ["# Examples\n"]
    for example in EXAMPLES:
        readme = (REPO / example / "README.md").read_text().replace("\n## ", "\n### ")
        anchor = example.rsplit("/", 1)[-1].replace("_", "-")
        parts.append(f'<a id="{anchor}"></a>\n\n' + re.sub(r"^# ", "## ", readme, count=1))
    return _relinked("\n".join(parts), "examples/README.md")


def on_files(files: Files, config: Any) -> Files:
    for source, page in PAGES.items():
        text = _relinked((REPO / source).read_text(), source)
        if source == "CHANGELOG.md":
            text += "\n## License\n\n```text\n" + (REPO / "LICENSE").read_text() + "\n```\n"
        files.append(File.generated(config, page, content=text))
    stale = [name for name, text in reference_pages().items()
             if not (REPO / "docs" / name).exists() or (REPO / "docs" / name).read_text() != text]
    if stale:
        raise ValueError(f"docs/{' and docs/'.join(stale)} differ from what the code makes now: "
                         "run python scripts/docs_hooks.py and commit them")
    files.append(File.generated(config, "examples.md", content=_examples_page()))
    return files


def reference_pages() -> dict[str, str]:
    """The pages made from the code, by their name under docs/."""
    import celery_scheduler

    where = Path(celery_scheduler.__file__).resolve().parent
    if where != REPO / "celery_scheduler":
        raise ValueError(f"celery_scheduler is imported from {where}, not from this checkout: "
                         f"install this one (pip install -e {REPO}) to build its docs")
    return {"settings.md": _settings_page((REPO / "docs/configuration.md").read_text()),
            "cli.md": _cli_page()}


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    source = page.file.src_uri
    if (REPO / "docs" / source).exists():  # a page of docs/: its links as from docs/
        return _relinked(markdown, "docs/" + source)
    return markdown


if __name__ == "__main__":
    for name, text in reference_pages().items():
        (REPO / "docs" / name).write_text(text)
        print(f"wrote docs/{name}")
