"""The command line as a whole: --version, and the help text of every command."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

from tests.conftest import cli


def test_version_names_torchdoctor_and_torch_without_importing_torch():
    proc = cli("--version")
    assert proc.returncode == 0 and proc.stderr_text == ""
    expected = f"torchdoctor {metadata.version('torchdoctor')} (torch {metadata.version('torch')})\n"
    assert proc.stdout_text == expected
    assert expected.startswith("torchdoctor 0.1.0 (torch ")
    code = (
        "import sys\nfrom torchdoctor import cli\nsys.argv = ['torchdoctor', '--version']\n"
        "try:\n    cli.main()\nexcept SystemExit as exc:\n    assert exc.code in (0, None), exc.code\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout
    assert out.splitlines() == [expected.strip(), "False"]


def test_version_is_listed_in_the_help():
    proc = cli("--help")
    assert proc.returncode == 0 and "--version" in proc.stdout_text


def _every_help() -> list[tuple[str, str, str]]:
    """(command, what, raw text) for the help of every command, argument and option of the app."""
    import typer

    from torchdoctor import cli as cli_module

    cli_module._register_optional(["torchdoctor"])  # every command, as `torchdoctor --help` sees them
    group = typer.main.get_command(cli_module.app)
    found = [("", "app", group.help or "")]
    for name, command in sorted(group.commands.items()):
        found.append((name, "command", command.help or ""))
        found += [(name, param.name, param.help) for param in command.params if getattr(param, "help", None)]
    return found


def _squeezed(text: str) -> str:
    """Text without whitespace or box-drawing characters: help is wrapped and framed differently by width."""
    return "".join(ch for ch in text if not ch.isspace() and not "\u2500" <= ch <= "\u257f")


def test_help_texts_render_every_character_of_every_command_and_option():
    """Nothing in any help text is eaten as rich markup (`[tool.torchdoctor]`) or emoji code: the rendered
    --help of each command holds each of its help strings, character for character."""
    helps = _every_help()
    assert {name for name, _, _ in helps} >= {"ask", "check", "run", "rules", "explain", "routes", "schema", "demo"}
    assert any("[tool.torchdoctor]" in text for _, _, text in helps)  # the case that was eaten
    rendered: dict[str, str] = {}
    missing = []
    for name, what, text in helps:
        if name not in rendered:
            proc = cli(*([name] if name else []), "--help", env={"COLUMNS": "100"})
            assert proc.returncode == 0, proc.stderr_text
            import re

            rendered[name] = _squeezed(re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout_text))
        if _squeezed(text) not in rendered[name]:
            missing.append(f"{name or 'torchdoctor'} {what}: {text!r}")
    assert not missing, "\n".join(missing)
