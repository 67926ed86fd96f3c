"""The docs stay true to the code: design references resolve, commands exist, config overrides compose."""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from ahconf.entry import CONF_DIR, to_config

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
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
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", path.read_text(), flags=re.DOTALL):
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


def test_the_readme_is_a_short_guide():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 220
    links = re.findall(r"\]\((docs/[\w.-]+)\)", "\n".join(lines))
    assert links and all((ROOT / link).is_file() for link in links)


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
