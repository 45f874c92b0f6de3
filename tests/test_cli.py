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
