"""The documentation (README.md and docs/*.md) as the tests read it: pages, sections,
fenced samples, links and GitHub's heading anchors, and the CLI help the reference shows.

`python -m tests.support.docs` rewrites the `--help` blocks of docs/cli.md from the
parsers (after changing a command's flags); tests/test_docs.py fails until it is run."""

from __future__ import annotations

import contextlib
import io
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
FENCE = re.compile(r"^(```|~~~)")
# Width the CLI help is rendered at, in the page and in the test (argparse reads COLUMNS).
HELP_COLUMNS = "80"


def pages() -> list[Path]:
    """Every page: the front page and docs/*.md."""
    return [REPO / "README.md", *sorted(DOCS.glob("*.md"))]


def page(name: str) -> str:
    """`README.md` (the front page) or a docs page by file name (`install.md`)."""
    return (REPO / name if name == "README.md" else DOCS / name).read_text()


def section(text: str, title: str) -> str:
    """The section under the heading `title` (any level), up to the next heading of the
    same or a higher level."""
    match = re.search(rf"^(#+) {re.escape(title)}\n", text, re.M)
    if match is None:
        raise KeyError(f"no heading {title!r}")
    level = len(match.group(1))
    end = re.compile(rf"^#{{1,{level}}} ", re.M).search(text, match.end())
    return text[match.start():end.start() if end else None]


def fenced_after(text: str, first_line: str) -> str:
    """The rest of the fenced block whose content starts with `first_line`."""
    return text.split(f"\n{first_line}\n", 1)[1].split("\n```", 1)[0]


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            out.append((number, line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text lowercased, every character but
    letters, digits, `_`, `-` and spaces dropped, spaces turned into hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's anchor on a page; a repeated one gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    out = set()
    for _, line in prose_lines(text):
        match = re.match(r"#{1,6} (.+?)#*\s*$", line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def links(text: str) -> list[tuple[int, str]]:
    """(line number, target) of every Markdown link outside code (blocks and spans)."""
    out = []
    for number, line in prose_lines(text):
        line = re.sub(r"`[^`]*`", "", line)
        out += [(number, target) for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", line)]
    return out


def cli_help(*argv: str) -> str:
    """`initshift ARGV... --help` as printed at HELP_COLUMNS columns."""
    import os

    from webhook.cli import main

    out = io.StringIO()
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_COLUMNS
    try:
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            main([*argv, "--help"])
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old
    return out.getvalue().rstrip("\n")


# A fenced `$ initshift ... --help` block: the command line, then the output up to the fence.
HELP_BLOCK = re.compile(r"^(```console\n\$ initshift (?P<argv>[\w -]*?) ?--help\n)(?P<body>.*?)^(```)$", re.S | re.M)


def help_blocks(text: str) -> dict[tuple[str, ...], str]:
    """The `$ initshift ... --help` blocks of a page: argv -> the output shown."""
    return {tuple(m.group("argv").split()): m.group("body").rstrip("\n") for m in HELP_BLOCK.finditer(text)}


def render_help_blocks(text: str) -> str:
    """The page with every `--help` block replaced by what the parser prints now."""
    return HELP_BLOCK.sub(lambda m: m.group(1) + cli_help(*m.group("argv").split()) + "\n" + m.group(4), text)


if __name__ == "__main__":
    cli = DOCS / "cli.md"
    cli.write_text(render_help_blocks(cli.read_text()))
    sys.exit(0)
