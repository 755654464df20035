"""MkDocs hooks: pages generated from the code at build time, so they cannot drift from it.

* ``<!-- cli-help -->`` in a page becomes the ``--help`` of every ``tfdist`` command.
* ``<!-- error-messages -->`` becomes every error message with a "Fix:" in ``tfdist/``.
* ``<!-- plot: NAME.svg -->`` before a table makes ``img/NAME.svg``, a plot of that table.
* The notebooks of ``notebooks/`` are added to the site as ``notebooks/*.ipynb``.
* Pages other engineers write (``OPTIONAL_PAGES``) join the navigation when they exist.
* A notebook's table of contents links to its headings' real ids (mkdocs-jupyter leaves the
  code words of a heading out of the link, but not out of the id).
"""

from __future__ import annotations

import argparse
import ast
import html
import io
import os
import re
import sys

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# page -> (navigation section, title): listed only when the page exists.
OPTIONAL_PAGES = {
    "data.md": ("Your data", "Use your tf.data pipeline"),
    "outputs.md": ("Get started", "Export, track and profile"),
    "ray.md": ("Scale out", "Run on Ray"),
}

PLOT = re.compile(r"<!-- plot: (?P<name>[\w-]+\.svg) -->\n(?P<table>(?:\|.*\|\n)+)")


def on_config(config):
    """Adds the optional pages that exist to their navigation section."""
    nav = config["nav"]
    for page, (section, title) in OPTIONAL_PAGES.items():
        if not os.path.exists(os.path.join(config["docs_dir"], page)):
            continue
        if page in _listed(nav):
            continue  # already listed by hand
        for entry in nav:
            if isinstance(entry, dict) and section in entry:
                entry[section].append({title: page})
                break
    return config


def _listed(entries) -> set[str]:
    """Every page a navigation (or a section of it) lists."""
    found = set()
    for entry in entries:
        for value in (entry.values() if isinstance(entry, dict) else [entry]):
            found |= _listed(value) if isinstance(value, list) else {value}
    return found


@event_priority(100)  # before mkdocs-jupyter, which converts the .ipynb files it is given
def on_files(files, config):
    """Adds the notebooks and the plots of the benchmark tables."""
    notebooks = os.path.join(ROOT, "notebooks")
    for name in sorted(os.listdir(notebooks)):
        if name.endswith(".ipynb"):
            files.append(File(f"notebooks/{name}", ROOT, config["site_dir"], config["use_directory_urls"]))
    for page in [f for f in files if f.src_uri.endswith(".md")]:
        with open(page.abs_src_path, encoding="utf-8") as handle:
            text = handle.read()
        for match in PLOT.finditer(text):
            svg = plot_table(match.group("table"), title=match.group("name"))
            files.append(File.generated(config, f"img/{match.group('name')}", content=svg))
    return files


def on_page_markdown(markdown, page, config, files):
    """Fills in the generated sections."""
    if "<!-- cli-help -->" in markdown:
        markdown = markdown.replace("<!-- cli-help -->", cli_help())
    if "<!-- error-messages -->" in markdown:
        markdown = markdown.replace("<!-- error-messages -->", error_messages())
    return markdown


def on_post_page(output, page, config):
    """Points a notebook's table-of-contents links at the ids its headings have."""
    if not page.file.src_uri.endswith(".ipynb"):
        return output
    ids = re.findall(r'\bid="([^"]+)"', output)
    known = set(ids)

    def heading(fragment: str) -> str | None:
        words = fragment.split("-")
        for candidate in ids:
            rest = iter(candidate.split("-"))
            if all(word in rest for word in words):  # the fragment's words, in order, within the id
                return candidate
        return None

    def fix(match: re.Match) -> str:
        fragment = match.group(1)
        if fragment in known:
            return match.group(0)
        target = heading(fragment)
        return f'href="#{target}"' if target else match.group(0)

    return re.sub(r'href="#([^"]+)"', fix, output)


# --- the command line -------------------------------------------------------------------------
def cli_help() -> str:
    """A section per command (and per subcommand of ``tfdist ckpt``), with its ``--help``."""
    os.environ["COLUMNS"] = "100"  # argparse wraps its help to the terminal's width
    from tfdist.cli import build_parser

    out = []

    def walk(parser: argparse.ArgumentParser, depth: int) -> None:
        out.append(f"{'#' * depth} `{parser.prog}`\n\n```text\n{parser.format_help().rstrip()}\n```\n")
        for action in parser._actions:  # noqa: SLF001 -- argparse keeps its subcommands here
            if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
                for sub in dict.fromkeys(action.choices.values()):
                    walk(sub, depth + 1)

    walk(build_parser(), 2)
    return "\n".join(out)


# --- the error messages -----------------------------------------------------------------------
def _text(node: ast.AST) -> str | None:
    """A string literal or f-string as text, with ``{expression}`` for each formatted value."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            else:
                parts.append("{" + ast.unparse(value.value) + "}")
        return "".join(parts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _text(node.left), _text(node.right)
        if left is not None or right is not None:
            return (left or "{...}") + (right or "{...}")
    return None


def messages() -> dict[str, list[tuple[str, str]]]:
    """Every message with "Fix:" in ``tfdist/``, by module: (exception or "", message)."""
    found: dict[str, list[tuple[str, str]]] = {}
    package = os.path.join(ROOT, "tfdist")
    for folder, _, names in sorted(os.walk(package)):
        for name in sorted(names):
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            module = os.path.relpath(path, ROOT)
            with open(path, encoding="utf-8") as handle:
                tree = ast.parse(handle.read())
            raised: dict[int, str] = {}
            for node in ast.walk(tree):
                if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                    func = node.exc.func
                    label = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
                    for inner in ast.walk(node.exc):
                        raised[id(inner)] = label
            seen = set()
            for node in ast.walk(tree):
                if not isinstance(node, (ast.Constant, ast.JoinedStr, ast.BinOp)):
                    continue
                text = _text(node)
                if text is None or "Fix:" not in text or text in seen:
                    continue
                if any(text in other and text != other for other in seen):
                    continue
                seen.add(text)
                found.setdefault(module, []).append((raised.get(id(node), ""), " ".join(text.split())))
            # keep the longest form of a message built from parts
            found[module] = [m for m in found.get(module, []) if not any(m[1] != o[1] and m[1] in o[1]
                                                                         for o in found.get(module, []))]
            if not found[module]:
                del found[module]
    return found


def error_messages() -> str:
    """The catalogue: one list per module, each message with the exception that carries it."""
    found = messages()
    count = sum(len(v) for v in found.values())
    out = [f"{count} messages in {len(found)} modules. `{{...}}` stands for a value filled in when it is printed.\n"]
    for module, items in sorted(found.items()):
        out.append(f"### `{module}`\n\n<ul class=\"tfdist-errors\">")
        for label, text in items:
            prefix = f"<b>{html.escape(label)}</b>: " if label else ""
            out.append(f"<li>{prefix}<code>{html.escape(text)}</code></li>")
        out.append("</ul>\n")
    return "\n".join(out)


# --- the benchmark plots ----------------------------------------------------------------------
def plot_table(table: str, *, title: str) -> bytes:
    """A horizontal bar chart of a Markdown table: the first column labels the bars, the
    second is the median, the third the spread ``min–max``; a fourth, the target, is drawn
    as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in table.strip().splitlines()]
    header, body = rows[0], [r for r in rows[2:]]
    labels = [r[0].replace("`", "") for r in body]
    medians = [float(r[1]) for r in body]
    spreads = [[float(x) for x in re.split(r"\s*[–-]\s*(?=\d)", r[2])] for r in body]
    lower = [m - s[0] for m, s in zip(medians, spreads)]
    upper = [s[1] - m for m, s in zip(medians, spreads)]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(body) + 1.2))
    ax.barh(range(len(body)), medians, xerr=[lower, upper], color="#5c6bc0", capsize=3)
    ax.set_yticks(range(len(body)), labels)
    ax.invert_yaxis()
    if len(header) > 3:
        target = float(body[0][3].lstrip("≤ ").strip())
        ax.axvline(target, color="#c62828", linestyle="--", label=f"target {target:g}")
        ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), frameon=False)  # above the bars
    ax.set_xlabel(header[1])
    fig.tight_layout()
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", metadata={"Date": None})
    plt.close(fig)
    return buffer.getvalue().encode()
