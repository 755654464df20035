"""The documentation cannot drift from the code: every code block of the README and of the site
runs, every public symbol documents every parameter, and the built site renders in a browser."""

from __future__ import annotations

import ast
import contextlib
import glob
import html.parser
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import traceback
import urllib.parse
import urllib.request

import pytest

from conftest import REPO, base_env, free_port, wait_for

FENCE = re.compile(r"^```(?P<lang>[\w-]*)[^\n]*\n(?P<code>.*?)^```[ \t]*$", re.S | re.M)
NOT_RUN = re.compile(r"<!--\s*not-run:(?P<reason>.*?)-->\s*$")
RUN = {"python", "bash"}


def _yaml(text: str):
    import yaml

    return yaml.safe_load(text)


PARSED = {"json": json.loads, "yaml": _yaml}
SHOWN = {"text"}  # output or layouts: shown, never run
NAMED_TEST = re.compile(r"\btests/[\w/]+\.py\b")  # a marker may name the test that runs what the block shows


def _pages() -> list[str]:
    return ["README.md"] + sorted(os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, "docs", "**", "*.md"),
                                                                               recursive=True))


PAGES = _pages()


def blocks(text: str) -> list[tuple[str, str, str | None, int]]:
    """Every fenced block of a Markdown text: (language, code, not-run reason or None, line)."""
    found = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").splitlines()
        marker = NOT_RUN.search(before[-1]) if before else None
        reason = marker.group("reason").strip() if marker else None
        found.append((match.group("lang"), match.group("code"), reason, text.count("\n", 0, match.start()) + 1))
    return found


def _read(page: str) -> str:
    with open(os.path.join(REPO, page), encoding="utf-8") as handle:
        return handle.read()


# --- every block is run, parsed or marked -------------------------------------------------------
@pytest.mark.parametrize("page", PAGES)
def test_every_block_is_labelled_and_markers_give_a_reason(page):
    text = _read(page)
    assert text.count("```") % 2 == 0, f"{page}: an unclosed code fence"
    for lang, code, reason, line in blocks(text):
        where = f"{page}:{line}"
        assert lang in RUN | set(PARSED) | SHOWN, f"{where}: a code block without a known language ({lang!r})"
        if reason is not None:
            assert len(reason) >= 10, f"{where}: a not-run marker must say why the block cannot run here"
            assert lang in RUN, f"{where}: only python and bash blocks take a not-run marker"
            for named in NAMED_TEST.findall(reason):
                assert os.path.isfile(os.path.join(REPO, named)), (
                    f"{where}: the not-run marker names {named}, which does not exist")
        if lang in PARSED:
            PARSED[lang](code)  # raises on a block that does not parse
    for marker in re.finditer(r"<!--\s*not-run\b(?P<rest>[^>]*)-->", text):
        assert marker.group("rest").startswith(":") and marker.group("rest")[1:].strip(), (
            f"{page}: a not-run marker without a reason: {marker.group(0)}")


def test_the_block_parser_finds_markers_and_languages():
    text = textwrap.dedent("""\
        Intro.

        <!-- not-run: needs a Kubernetes cluster -->
        ```bash
        kubectl get pods
        ```

        ```python
        print(1)
        ```
        """)
    found = blocks(text)
    assert [(lang, reason) for lang, _, reason, _ in found] == [("bash", "needs a Kubernetes cluster"), ("python", None)]
    assert found[1][1] == "print(1)\n"
    assert NAMED_TEST.findall("needs Slurm; tests/engines/test_slurm_engine.py runs it") == [
        "tests/engines/test_slurm_engine.py"]


def _runnable(page: str) -> tuple[str, str]:
    python, bash = [], []
    for lang, code, reason, line in blocks(_read(page)):
        if reason is None and lang == "python":
            python.append(f"# --- {page}:{line}\n{code}")
        elif reason is None and lang == "bash":
            bash.append(f"# --- {page}:{line}\n{code}")
    return "\n".join(python), "\n".join(bash)


def _env(cwd: str) -> dict:
    environ = base_env()
    bin_dir = os.path.dirname(sys.executable)  # where `tfdist` is installed with the package
    environ["PATH"] = bin_dir + os.pathsep + environ.get("PATH", "")
    environ["MPLBACKEND"] = "Agg"
    environ["HOME"] = environ.get("HOME", cwd)
    return environ


def _run(args, *, cwd, timeout, what):
    try:
        done = subprocess.run(args, cwd=cwd, env=_env(cwd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=timeout, start_new_session=True)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{what} did not finish within {timeout} s; output:\n{(e.output or '')[-4000:]}")
    assert done.returncode == 0, f"{what} failed with exit code {done.returncode}; output:\n{done.stdout[-6000:]}"
    return done.stdout


RUNNABLE = [p for p in PAGES if any(_runnable(p))]


# Blocks that configure TensorFlow's runtime, which only a process that has not started it can do.
FRESH_RUNTIME = re.compile(r"\bsplit_cpu\(")


def _run_here(code: str, *, what: str) -> None:
    """Runs Python ``code`` as ``__main__`` in this process; a failure shows what it printed."""
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            exec(compile(code, f"<{what}>", "exec"), {"__name__": "__main__"})
    except BaseException:  # a page's SystemExit or KeyboardInterrupt fails its test, not the run
        pytest.fail(f"{what} failed; output:\n{printed.getvalue()[-3000:]}\n{traceback.format_exc()[-6000:]}")


@pytest.mark.parametrize("page", RUNNABLE)
def test_code_blocks_run(page, tmp_path, monkeypatch):
    """The page's python blocks, in order, as one script; then its bash blocks, in order.

    The python blocks run in this process, which has imported TensorFlow already, in a directory of
    their own; blocks that configure TensorFlow's runtime run in a fresh process."""
    python, bash = _runnable(page)
    if python:
        script = tmp_path / "blocks.py"
        script.write_text(python)
        what = f"the python blocks of {page}"
        if FRESH_RUNTIME.search(python):
            _run([sys.executable, str(script)], cwd=tmp_path, timeout=600, what=what)
        else:
            monkeypatch.chdir(tmp_path)
            monkeypatch.setattr(sys, "argv", [str(script)])
            _run_here(python, what=what)
    if bash:
        script = tmp_path / "blocks.sh"
        script.write_text("set -euo pipefail\n" + bash)
        out = _run(["bash", str(script)], cwd=tmp_path, timeout=600, what=f"the bash blocks of {page}")
        printed = " ".join(out.split())
        for line in shown_output(_read(page)):
            assert " ".join(line.split()) in printed, f"{page} shows {line!r}, which its commands no longer print"


def shown_output(text: str) -> list[str]:
    """The lines of the ``text`` blocks a page introduces with "It prints:", but ``...``."""
    lines = []
    for match in re.finditer(r"It prints:\n\n```text\n(.*?)^```", text, re.S | re.M):
        lines += [line for line in match.group(1).splitlines() if line.strip() and line.strip() != "..."]
    return lines


# --- the README and the navigation -----------------------------------------------------------
TEST_COMMAND = ('python3 -m venv .venv && . .venv/bin/activate && pip install ".[test]" && '
                "python -m pytest -q -n 2 --dist worksteal")


def test_the_readme_fits_on_a_few_screens_and_gives_the_ci_command():
    text = _read("README.md")
    assert len(text.split()) <= 1500, f"README.md has {len(text.split())} words: move detail into docs/"
    assert TEST_COMMAND in text
    assert "python -m pytest -q -n 2 --dist worksteal" in _read(".ci/run")


def _nav_pages(entries) -> list[tuple[str, str]]:
    found = []
    for entry in entries:
        for title, value in entry.items():
            found += _nav_pages(value) if isinstance(value, list) else [(title, value)]
    return found


def test_the_navigation_answers_the_common_questions_and_lists_pages_that_exist():
    import yaml

    config = yaml.safe_load(_read("mkdocs.yml"))
    nav = dict(_nav_pages(config["nav"]))
    for question, title in (("how do I run on two machines", "Run on several machines"),
                            ("how do I resume", "Resume after a crash"),
                            ("how do I use my TFRecords", "Use your TFRecord files"),
                            ("how do I turn on mixed precision", "Mixed precision and gradient accumulation")):
        assert title in nav, f"no page answers {question!r}"
    for title, page in nav.items():
        source = os.path.join(REPO, "notebooks", os.path.basename(page)) if page.startswith("notebooks/") \
            else os.path.join(REPO, "docs", page)
        assert os.path.exists(source), f"the navigation's {title!r} names {page}, which does not exist"


# --- house style -----------------------------------------------------------------------------
LONGEST_SENTENCE = 40  # words: the style asks for about 25; this catches the run-on ones


def prose_sentences(text: str) -> list[str]:
    """The sentences of Markdown prose: no code, comments, headings or tables; list items apart."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    found = []
    for block in re.split(r"\n\s*\n", text):
        items: list[list[str]] = []
        for line in block.splitlines():
            if not line.strip() or line.lstrip().startswith(("|", "#", ">>>")):
                continue
            # A list item, or a docstring's ``name: description`` line under Args/Raises, starts its own sentence.
            if re.match(r"\s*([*-]|\d+\.)\s", line) or re.match(r"\s+\w+: ", line) or not items:
                items.append([])
            items[-1].append(line)
        for item in items:
            words = re.sub(r"``[^`]*``|`[^`]*`", "X", " ".join(item))  # reST and Markdown code
            words = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", words)
            found += [s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z*X\[(])", words) if s.strip()]
    return found


def test_prose_follows_the_house_style():
    texts = {page: _read(page) for page in PAGES}
    texts.update({f"tfdist.{name}": re.sub(r"\nExamples:\n.*", "", ast.get_docstring(node) or "", flags=re.S)
                  for name, node in PUBLIC.items()})
    problems = []
    for where, text in texts.items():
        for sentence in prose_sentences(text):
            if len(sentence.split()) > LONGEST_SENTENCE:
                problems.append(f"{where}: {len(sentence.split())} words: {sentence[:100]}...")
            if sentence.count(";") >= 2:
                problems.append(f"{where}: a chain of semicolons: {sentence[:100]}...")
    assert not problems, "\n".join(problems)


def test_the_style_check_finds_a_run_on_sentence():
    run_on = "Word " + " ".join(["word"] * 44) + "."
    assert [len(s.split()) for s in prose_sentences(f"Short one. {run_on}\n\n* A list item.\n")] == [2, 45, 4]


# --- the public API's docstrings ------------------------------------------------------------
SECTION = re.compile(r"^(?P<indent>\s*)(?P<name>Args|Arguments|Attributes|Returns|Raises|Examples):\s*$")
EXAMPLE_REQUIRED = {"fit", "evaluate", "predict", "plan", "make_strategy", "TFRecordSource", "ImageFolderSource",
                    "save_model", "load_model", "split_cpu", "detect_cluster", "ClusterSpec", "Plan",
                    "CheckpointOptions", "StrategyOptions"}


def _own_statements(function: ast.AST):
    """The nodes of ``function``'s body, without those of the functions and classes defined in it."""
    stack = list(ast.iter_child_nodes(function))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(node))


def _definition(module: str, attr: str) -> ast.AST:
    """The top-level function or class ``attr`` of ``module`` (of a package: of one of its modules)."""
    path = importlib.util.find_spec(module).origin
    candidates = [path]
    if os.path.basename(path) == "__init__.py":  # a package re-exporting the name: find where it is defined
        candidates += sorted(glob.glob(os.path.join(os.path.dirname(path), "*.py")))
    for candidate in candidates:
        tree = ast.parse(open(candidate, encoding="utf-8").read())
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == attr:
                return node
    raise LookupError(f"{module}.{attr} is not defined in {candidates}")


def _public() -> dict[str, ast.AST]:
    """Every name of ``tfdist.__all__`` (but ``__version__``) -> its function or class node. A
    module in ``__all__`` (``tfdist.callbacks``) gives each name of its own ``__all__``."""
    import tfdist  # imports no TensorFlow

    nodes = {}
    for name in tfdist.__all__:
        if name == "__version__":
            continue
        if name in getattr(tfdist, "_SUBMODULES", ()):
            module = importlib.import_module(f"tfdist.{name}")
            for attr in getattr(module, "__all__", ()):
                nodes[f"{name}.{attr}"] = _definition(module.__name__, attr)
            continue
        target = tfdist._LAZY.get(name, ("tfdist.errors", name))
        module, attr = target if isinstance(target, tuple) else (target, name)
        nodes[name] = _definition(module, attr)
    return nodes


def sections(doc: str) -> dict[str, list[str]]:
    """A Google-style docstring's sections: name -> the lines of its body."""
    found: dict[str, list[str]] = {}
    current = None
    for line in doc.splitlines():
        match = SECTION.match(line)
        if match and not match.group("indent"):
            current = found.setdefault(match.group("name").replace("Arguments", "Args"), [])
        elif current is not None and (not line.strip() or line.startswith(" ")):
            current.append(line)
        else:
            current = None
    return found


def documented(body: list[str]) -> set[str]:
    """The names an Args or Attributes section documents: its least-indented ``name:`` lines."""
    lines = [line for line in body if line.strip()]
    if not lines:
        return set()
    indent = min(len(line) - len(line.lstrip()) for line in lines)
    return {m.group(1) for line in lines if len(line) - len(line.lstrip()) == indent
            for m in [re.match(r"\s*\**(\w+)(?: \(.*\))?:", line)] if m}


def parameters(node: ast.AST) -> list[str]:
    """What a caller passes: a function's parameters (``*args`` and ``**kwargs`` too), a class's
    ``__init__`` or dataclass fields."""
    if isinstance(node, ast.FunctionDef):
        args = node.args
        named = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs if a.arg not in ("self", "cls")]
        return named + [a.arg for a in (args.vararg, args.kwarg) if a is not None]
    init = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    if init is not None:
        return parameters(init)
    return [n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]


PUBLIC = _public()


def _shown_members() -> dict[str, list[str]]:
    """``members: [a, b]`` of each ``::: tfdist.X`` in the API reference's pages."""
    shown = {}
    for page in glob.glob(os.path.join(REPO, "docs", "api", "*.md")):
        text = open(page, encoding="utf-8").read()
        for match in re.finditer(r"^::: tfdist\.(\w+)\n(?:[ \t]+.*\n)*?[ \t]+members: \[(.*?)\]", text, re.M):
            shown[match.group(1)] = [m.strip() for m in match.group(2).split(",")]
    return shown


SHOWN_MEMBERS = _shown_members()


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_every_public_symbol_documents_every_parameter(name):
    node = PUBLIC[name]
    doc = ast.get_docstring(node)
    assert doc, f"tfdist.{name} has no docstring"
    found = sections(doc)
    names = documented(found.get("Args", [])) | documented(found.get("Attributes", []))
    missing = [p for p in parameters(node) if p not in names]
    assert not missing, f"tfdist.{name} does not document {missing} in Args: (or Attributes:)"
    unknown = sorted(names - set(parameters(node)) - _properties(node))
    assert not unknown, f"tfdist.{name} documents {unknown}, which it does not take"
    if isinstance(node, ast.FunctionDef):
        returns = node.returns is not None and ast.unparse(node.returns) not in ("None", "'None'")
        if returns or any(isinstance(n, ast.Return) and n.value is not None for n in _own_statements(node)):
            assert "Returns" in found, f"tfdist.{name} returns a value but has no Returns: section"
    if _raises(node):
        assert "Raises" in found, f"tfdist.{name} raises but has no Raises: section"
    if name in EXAMPLE_REQUIRED:
        assert "```python" in "\n".join(found.get("Examples", [])), f"tfdist.{name} has no Examples: section"
    # The members the API reference shows document their parameters too.
    for member in SHOWN_MEMBERS.get(name, ()):
        method = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == member), None)
        assert method is not None, f"the API reference shows tfdist.{name}.{member}, which does not exist"
        method_doc = ast.get_docstring(method)
        assert method_doc, f"tfdist.{name}.{member} has no docstring"
        have = documented(sections(method_doc).get("Args", []))
        assert set(parameters(method)) <= have, f"tfdist.{name}.{member} does not document {set(parameters(method)) - have}"


def _raises(node: ast.AST) -> bool:
    """Whether a function raises, or a class raises while it is made (``__init__``, ``__post_init__``)."""
    if isinstance(node, ast.ClassDef):
        makers = [n for n in node.body if isinstance(n, ast.FunctionDef) and n.name in ("__init__", "__post_init__")]
        return any(_raises(maker) for maker in makers)
    return any(isinstance(n, ast.Raise) for n in ast.walk(node))


def _properties(node: ast.AST) -> set[str]:
    """A class's own members: its methods and properties, and the attributes its body assigns."""
    body = getattr(node, "body", [])
    names = {n.name for n in body if isinstance(n, ast.FunctionDef)}
    names |= {n.target.id for n in body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    return names | {t.id for n in body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}


def test_the_api_reference_shows_every_public_name():
    import tfdist

    shown = set()
    for page in glob.glob(os.path.join(REPO, "docs", "api", "*.md")):
        shown |= set(re.findall(r"^::: tfdist\.(\w+)", open(page, encoding="utf-8").read(), re.M))
    missing = sorted(set(tfdist.__all__) - shown - {"__version__"})
    assert not missing, f"docs/api/*.md lacks a '::: tfdist.NAME' line for {missing}"


def test_the_docstring_check_catches_a_missing_parameter():
    node = ast.parse(textwrap.dedent('''\
        def f(a, *, b=1):
            """Does f.

            Args:
              a: The a.
            """
        ''')).body[0]
    names = documented(sections(ast.get_docstring(node))["Args"])
    assert [p for p in parameters(node) if p not in names] == ["b"]


def test_the_docstring_check_catches_undocumented_star_parameters_and_a_class_that_raises():
    function, cls = ast.parse(textwrap.dedent('''\
        def f(a, *rest, **options):
            """Does f.

            Args:
              a: The a.
              rest: The other a's.
            """

        class Options:
            """Options.

            Attributes:
              size: The size.
            """

            size: int = 1

            def __post_init__(self):
                raise ValueError(self.size)
        ''')).body
    names = documented(sections(ast.get_docstring(function))["Args"])
    assert [p for p in parameters(function) if p not in names] == ["options"]
    assert parameters(cls) == ["size"] and _raises(cls) and "Raises" not in sections(ast.get_docstring(cls))


def test_docstring_examples_run(tmp_path):
    """Every ``Examples:`` block of the public API, each in its own directory, in one process
    (``split_cpu``'s first: it must run before TensorFlow's runtime starts)."""
    examples = []
    for name, node in sorted(PUBLIC.items()):
        body = "\n".join(sections(ast.get_docstring(node) or "").get("Examples", []))
        for code in re.findall(r"```python\n(.*?)```", textwrap.dedent(body), re.S):
            examples.append((name, code))
    assert len(examples) >= len(EXAMPLE_REQUIRED)
    examples.sort(key=lambda item: "split_cpu(" not in item[1])
    driver = textwrap.dedent("""\
        import os, sys, traceback
        examples = %r
        failed = []
        for name, code in examples:
            os.makedirs(name, exist_ok=True)
            os.chdir(name)
            try:
                exec(compile(code, f"<example of tfdist.{name}>", "exec"), {"__name__": "__main__"})
            except BaseException:
                failed.append(name)
                traceback.print_exc()
            os.chdir("..")
        print("failed:", failed)
        sys.exit(1 if failed else 0)
        """) % (examples,)
    script = tmp_path / "examples.py"
    script.write_text(driver)
    out = _run([sys.executable, str(script)], cwd=tmp_path, timeout=600, what="the docstrings' examples")
    assert "failed: []" in out


# --- the site, built and opened in a browser ------------------------------------------------
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
HAS_MKDOCS = importlib.util.find_spec("mkdocs") is not None and importlib.util.find_spec("mkdocstrings") is not None


class _Links(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.links: list[str] = []
        self.title = ""
        self._in_title = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "a" and attrs.get("href"):
            self.links.append(attrs["href"])
        if tag in ("img", "script") and attrs.get("src"):
            self.links.append(attrs["src"])
        if tag == "link" and attrs.get("href") and attrs.get("rel") in ("stylesheet",):
            self.links.append(attrs["href"])
        self._in_title = tag == "title"

    def handle_data(self, data):
        if self._in_title:
            self.title += data

    def handle_endtag(self, tag):
        if tag == "title":
            self._in_title = False


def broken_links(site: str) -> list[str]:
    """Internal links of every page of a built site that lead to no file or no anchor."""
    broken = []
    ids: dict[str, set[str]] = {}

    def anchors(path: str) -> set[str]:
        if path not in ids:
            with open(path, encoding="utf-8") as handle:
                ids[path] = set(re.findall(r'\bid="([^"]+)"', handle.read()))
        return ids[path]

    for page in glob.glob(os.path.join(site, "**", "*.html"), recursive=True):
        parser = _Links()
        with open(page, encoding="utf-8") as handle:
            parser.feed(handle.read())
        for link in parser.links:
            parts = urllib.parse.urlsplit(link)
            if parts.scheme or parts.netloc or link.startswith(("mailto:", "javascript:")):
                continue
            path = urllib.parse.unquote(parts.path)
            base = site if path.startswith("/") else os.path.dirname(page)  # the 404 page links from the root
            target = os.path.normpath(os.path.join(base, path.lstrip("/"))) if path else page
            if os.path.isdir(target):
                target = os.path.join(target, "index.html")
            if not os.path.exists(target):
                broken.append(f"{os.path.relpath(page, site)} -> {link}")
            elif parts.fragment and target.endswith(".html") and parts.fragment not in anchors(target):
                broken.append(f"{os.path.relpath(page, site)} -> {link} (no such anchor)")
    return broken


def build_site(site: str) -> str:
    return _run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", site], cwd=REPO, timeout=600,
                what="mkdocs build --strict")


@pytest.mark.site
@pytest.mark.skipif(not HAS_MKDOCS, reason="the docs extra is not installed (pip install '.[docs]')")
def test_a_broken_reference_fails_the_build(tmp_path):
    """The site's own settings (theme, plugins, strict), on two pages: a broken reference fails the build."""
    import yaml

    config = _yaml(open(os.path.join(REPO, "mkdocs.yml"), encoding="utf-8").read())
    assert config["strict"] is True
    config.pop("hooks")  # they add the notebooks and generated pages, which two pages do not need
    config["nav"] = [{"Home": "index.md"}]
    config["docs_dir"] = str(tmp_path / "docs")
    (mkdocstrings,) = [p["mkdocstrings"] for p in config["plugins"] if isinstance(p, dict) and "mkdocstrings" in p]
    mkdocstrings["handlers"]["python"]["paths"] = [REPO]
    os.makedirs(tmp_path / "docs")
    (tmp_path / "docs" / "index.md").write_text("# Home\n\n::: tfdist.TfdistError\n\nSee [`TfdistError`]"
                                                 "[tfdist.TfdistError] and [`no_such_function`][tfdist.no_such_function].\n")
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=tmp_path, env=_env(str(tmp_path)), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=600)
    assert done.returncode != 0, done.stdout[-3000:]
    warnings = [line for line in done.stdout.splitlines() if line.startswith(("WARNING", "ERROR"))]
    # The broken reference is the only complaint: the one that exists resolves.
    assert warnings and all("tfdist.no_such_function" in line or "Aborted" in line for line in warnings), warnings


@pytest.mark.site
@pytest.mark.skipif(not HAS_MKDOCS, reason="the docs extra is not installed (pip install '.[docs]')")
@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get install -y chromium)")
def test_the_site_renders_in_chromium(tmp_path, procs):
    site = str(tmp_path / "site")
    build_site(site)
    assert broken_links(site) == []
    for nav_title in ("Run on several machines", "Resume after a crash", "Use your TFRecord files",
                      "Mixed precision and gradient accumulation"):
        assert nav_title in open(os.path.join(site, "index.html"), encoding="utf-8").read()

    port = free_port()
    procs.start([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", site])

    def serving() -> bool:
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2).status == 200
        except OSError:
            return False

    wait_for(serving, timeout=60, what="the site's server")
    shots = os.environ.get("DOCS_SCREENSHOTS_DIR") or str(tmp_path / "screenshots")  # pytest keeps the last runs
    os.makedirs(shots, exist_ok=True)
    pages = {"home": ("", "tfdist"), "fit-reference": ("api/training/", "tfdist.fit"),
             "notebook": ("notebooks/01_quickstart/", "tfdist.fit")}
    for name, (path, expected) in pages.items():
        url = f"http://127.0.0.1:{port}/{path}"
        flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={tempfile.mkdtemp(dir=tmp_path)}", "--window-size=1280,1000",
                 "--virtual-time-budget=5000"]
        dom = _run(flags + ["--dump-dom", url], cwd=tmp_path, timeout=120, what=f"chromium --dump-dom {url}")
        parser = _Links()
        parser.feed(dom)
        assert parser.title.strip().endswith("tfdist"), f"{url}: title {parser.title!r}"
        assert 'class="md-nav' in dom and "Resume after a crash" in dom, f"{url}: no navigation rendered"
        assert expected in dom, f"{url}: {expected!r} not rendered"
        shot = os.path.join(shots, f"{name}.png")
        _run(flags + [f"--screenshot={shot}", url], cwd=tmp_path, timeout=120, what=f"chromium --screenshot {url}")
        assert os.path.getsize(shot) > 20_000, f"{shot}: {os.path.getsize(shot)} bytes, an empty page?"
    print(f"screenshots in {shots}")
