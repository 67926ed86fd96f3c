"""The docs stay true to the code: design references resolve, commands exist, config overrides compose."""

from __future__ import annotations

import fnmatch
import importlib.util
import re
import shlex
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from ahconf.entry import CONF_DIR, to_config

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "dev" / "README.md"]
PACKAGES = ("decode", "ahconf", "data_gen", "accept_heads", "benchmarks")
HYDRA_ENTRIES = ("data_gen.collect", "data_gen.regenerate", "accept_heads.train", "accept_heads.evaluate")
PLACEHOLDER = re.compile(r"\[|NAME|\boverrides\b|\.\.\.|…")


def design_sections() -> set[str]:
    """Section numbers of ``docs/design.md`` (``## 3. ...`` → ``"3"``)."""
    text = (ROOT / "docs" / "design.md").read_text()
    return set(re.findall(r"^## (\d+)\. ", text, flags=re.MULTILINE))


def design_references() -> list[tuple[str, str]]:
    """Every ``DESIGN §N`` in the code and the docs: (where, N)."""
    files = [p for package in PACKAGES for p in (ROOT / package).rglob("*.py")] + DOCS
    return [(f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, match.start()) + 1}", match.group(1))
            for path in files for text in [path.read_text()] for match in re.finditer(r"DESIGN §(\d+)", text)]


def shell_commands(path: Path) -> list[str]:
    """The commands of a Markdown file's ``bash`` blocks, continuation lines joined, comments cut."""
    return bash_commands(path.read_text())


def bash_commands(text: str) -> list[str]:
    """The commands of the ``bash`` blocks in Markdown text, continuation lines joined, comments cut."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL):
        for command in block.replace("\\\n", " ").splitlines():
            command = re.sub(r"\s+#\s.*$", "", command).strip()
            if command and not command.startswith("#"):
                commands.append(command)
    return commands


def python_modules(command: str) -> list[str]:
    return re.findall(r"python -m ([\w.]+)", command)


def overrides(command: str) -> list[str] | None:
    """The Hydra overrides of a command running a Hydra entry point (multirun: each sweep's first value)."""
    modules = python_modules(command)
    if not modules or modules[0] not in HYDRA_ENTRIES or PLACEHOLDER.search(command):
        return None
    words = shlex.split(command.split(f"-m {modules[0]}", 1)[1])
    multirun = "-m" in words
    found = []
    for word in words:
        if "=" not in word or word.startswith("-"):
            continue
        key, value = word.split("=", 1)
        if multirun and "," in value and not value.startswith(("[", "{", "'", "$")):
            value = value.split(",")[0]
        found.append(f"{key}={value}")
    return found


def test_every_design_reference_resolves_to_a_section():
    sections = design_sections()
    assert {"1", "2", "3", "4", "5", "6", "7"} <= sections
    references = design_references()
    assert len(references) > 20  # the code cites the design throughout
    assert [f"{where}: DESIGN §{n}" for where, n in references if n not in sections] == []


README_SECTIONS = ("Quick start", "What `make demo` prints", "Commands", "Layout", "Documentation")
QUICK_START = [["make", "demo"], ["make", "test"]]  # the two commands a fresh clone needs, each a Makefile target


def readme_sections(text: str) -> dict[str, str]:
    """``## Title`` → the section's text up to the next ``##`` heading outside a code block."""
    found, title, in_code = {}, None, False
    for line in text.splitlines():
        in_code ^= line.startswith("```")
        if line.startswith("## ") and not in_code:
            title = line[3:].strip()
            found[title] = ""
        elif title is not None:
            found[title] += line + "\n"
    return found


def top_level_dirs(root: Path) -> set[str]:
    """The project's top-level folders: not hidden, not ignored by a folder pattern of ``.gitignore``."""
    ignored = [line.rstrip("/") for line in (root / ".gitignore").read_text().splitlines()
               if line.endswith("/") and "/" not in line.rstrip("/")]
    return {p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")
            and not any(fnmatch.fnmatch(p.name, pattern) for pattern in ignored)}


def readme_problems(root: Path, outputs: list[str]) -> list[str]:
    """What the README at ``root`` lacks as a newcomer's guide (empty: nothing): an introduction saying what the
    project does, the sections of :data:`README_SECTIONS`, a quick start of exactly the two commands of
    :data:`QUICK_START` (Makefile targets) naming where their results land (``outputs``), a layout naming every
    top-level folder and nothing else, and links to every page of ``docs/``, each of which exists."""
    text = (root / "README.md").read_text()
    problems = []
    if not re.sub(r"^# .*\n", "", text.split("\n## ", 1)[0]).strip():
        problems.append("no introduction before the first section (what the project does)")
    sections = readme_sections(text)
    problems += [f"no section '## {title}'" for title in README_SECTIONS if title not in sections]
    quick = sections.get("Quick start", "")
    commands = [command.split() for command in bash_commands(quick)]
    if commands != QUICK_START:
        problems.append(f"the quick start runs {[' '.join(c) for c in commands]}, not exactly "
                        f"{[' '.join(c) for c in QUICK_START]}")
    makefile = (root / "Makefile").read_text()
    problems += [f"the quick start's 'make {target}' is no Makefile target" for _, target in QUICK_START
                 if not re.search(rf"^{target}:", makefile, flags=re.MULTILINE)]
    problems += [f"the quick start does not say where results land ({out}/)" for out in outputs
                 if f"`{out}/`" not in quick]
    layout = re.findall(r"^(\w[\w.-]*)/ ", "".join(re.findall(r"```\n(.*?)```", sections.get("Layout", ""),
                                                                 flags=re.DOTALL)), flags=re.MULTILINE)
    problems += [f"the layout does not name {name}/" for name in sorted(top_level_dirs(root) - set(layout))]
    problems += [f"the layout names {name}/, which is no folder" for name in layout if not (root / name).is_dir()]
    links = set(re.findall(r"\]\((docs/[\w.-]+\.md)\)", text))
    problems += [f"the link {link} leads nowhere" for link in sorted(links) if not (root / link).is_file()]
    problems += [f"no link to {page.relative_to(root).as_posix()}" for page in sorted((root / "docs").glob("*.md"))
                 if page.relative_to(root).as_posix() not in links]
    return problems


def default_outputs() -> list[str]:
    """Where the default run's heads and evaluation land (``runs/tiny/heads``, ``runs/tiny/eval``)."""
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        config = to_config(compose(config_name="config"))
    return [config.paths.head_dir, config.evaluate.out_dir]


def test_the_readme_holds_what_a_newcomer_needs():
    assert readme_problems(ROOT, default_outputs()) == []


def test_the_readme_check_finds_what_is_missing(tmp_path):
    """Negative control: a README with a third quick-start command, a broken link, no layout and no introduction."""
    for name in ("Makefile", ".gitignore", "docs/design.md", "docs/zoo.md", "decode/__init__.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("demo:\ntest:\n" if name == "Makefile" else "runs/\n")
    (tmp_path / "runs").mkdir()
    (tmp_path / "README.md").write_text(
        "# x\n\n## Quick start\n\n```bash\nmake demo   # run\nmake test\nmake real\n```\n\nHeads land in `out/h/`.\n"
        "\n## What `make demo` prints\n\n## Commands\n\n## Documentation\n\n[a](docs/design.md) [b](docs/gone.md)\n")
    assert readme_problems(tmp_path, ["out/h", "out/e"]) == [
        "no introduction before the first section (what the project does)",
        "no section '## Layout'",
        "the quick start runs ['make demo', 'make test', 'make real'], not exactly ['make demo', 'make test']",
        "the quick start does not say where results land (out/e/)",
        "the layout does not name decode/",
        "the layout does not name docs/",
        "the link docs/gone.md leads nowhere",
        "no link to docs/zoo.md",
    ]


COMMANDS = [(path.relative_to(ROOT).as_posix(), command) for path in DOCS for command in shell_commands(path)]


def test_every_documented_python_module_exists():
    missing = [f"{where}: {module}" for where, command in COMMANDS for module in python_modules(command)
               if importlib.util.find_spec(module) is None]
    assert len(COMMANDS) > 20 and missing == []


HYDRA_COMMANDS = [(where, command, found) for where, command in COMMANDS
                  if (found := overrides(command)) is not None]


@pytest.mark.parametrize(("where", "command", "found"), HYDRA_COMMANDS, ids=[c for _, c, _ in HYDRA_COMMANDS])
def test_every_documented_override_composes(where, command, found):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        config = to_config(compose(config_name="config", overrides=found))
    assert config.exp_name


def test_the_override_parser_finds_a_typo():
    """Negative control: a mistyped key in a documented command fails to compose."""
    found = overrides("python -m accept_heads.train head.depht=3")
    assert found == ["head.depht=3"]
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"), pytest.raises(Exception, match="depht"):
        compose(config_name="config", overrides=found)


LOG = ROOT / "docs" / "log"
RESULTS = ROOT / "docs" / "results.md"


def heading_anchors(path: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.DOTALL)
    return {re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
            for title in re.findall(r"^#+ (.*)$", text, flags=re.MULTILINE)}


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """The relative links of a Markdown file whose file or heading anchor does not exist (code spans skipped)."""
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.DOTALL)
    text = re.sub(r"`[^`\n]*`", "", text)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        resolved = (path.parent / file).resolve() if file else path
        if not resolved.exists() or (anchor and resolved.suffix == ".md" and anchor not in heading_anchors(resolved)):
            broken.append(f"{path.relative_to(root)}: {target}")
    return broken


def test_every_relative_link_in_the_docs_resolves(tmp_path):
    pages = [*DOCS, *sorted(LOG.glob("*.md"))]
    assert len(pages) > 20 and [b for page in pages for b in broken_links(page)] == []
    # negative control: a missing file and a missing section are both reported
    (tmp_path / "page.md").write_text("# A page\n[x](page.md#a-page) [y](page.md#no-such-section) [z](gone.md)\n")
    assert [b.split(": ")[1] for b in broken_links(tmp_path / "page.md", tmp_path)] == [
        "page.md#no-such-section", "gone.md"]


def test_results_holds_current_figures_each_row_linked_to_the_log():
    """docs/results.md: at most 250 lines, and every table row links to a dated entry in docs/log/ that exists."""
    lines = RESULTS.read_text().splitlines()
    assert len(lines) <= 250
    rows = [line for i, line in enumerate(lines) if line.startswith("|") and i > 1
            and lines[i - 1].startswith("|") and not line.startswith("|---")]
    assert len(rows) > 50
    unlinked = [row[:80] for row in rows if not re.search(r"\]\(log/[\w.-]+\.md\)", row)]
    assert unlinked == []
    targets = {t for row in rows for t in re.findall(r"\]\((log/[\w.-]+\.md)\)", row)}
    assert [t for t in targets if not (RESULTS.parent / t).is_file()] == []


def test_the_log_index_lists_every_entry():
    index = (LOG / "README.md").read_text()
    entries = sorted(p.name for p in LOG.glob("*.md") if p.name != "README.md")
    assert len(entries) > 20 and [name for name in entries if f"]({name})" not in index] == []
