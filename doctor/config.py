"""`[tool.torchdoctor]` in pyproject.toml: the project's settings for `torchdoctor check`.

    [tool.torchdoctor]
    select = ["TD"]                      # codes or prefixes; "ALL" = every rule
    ignore = ["TD206"]
    per-file-ignores = { "tests/**" = ["TD1"], "scripts/legacy.py" = ["TD000"] }
    exclude = ["third_party/", "notebooks/scratch/*.ipynb"]   # gitignore-style, from this file's folder
    fail-on = "warning"                  # error | warning | info | never
    severity = { TD703 = "warning" }     # a rule's level (codes or prefixes; the longest prefix wins)
    torch-version = "2.4"                # the torch the code targets (default: the installed one)
    respect-gitignore = true
    include-tests = false                # tests/, test_*.py, conftest.py, benchmarks/ are skipped by default
    max-file-bytes = 2097152

The nearest pyproject.toml with a [tool.torchdoctor] table, searched upwards
from the first path checked (or the current folder), applies; `--config`
names one explicitly (a pyproject.toml, or a TOML file with these keys at the
top level). Command-line options override it: `--select` replaces `select`,
`--ignore` adds to `ignore`, `--fail-on` replaces `fail-on`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FAIL_ON = ("error", "warning", "info", "never")
DEFAULT_MAX_BYTES = 2 * 2**20
KEYS = ("select", "ignore", "per-file-ignores", "exclude", "fail-on", "severity", "torch-version", "respect-gitignore",
        "include-tests", "max-file-bytes")
LEVELS = ("error", "warning", "info")


class ConfigError(Exception):
    """A bad config file or value: a usage error (exit 2) with a one-line message."""


@dataclass
class Settings:
    select: list[str] = field(default_factory=lambda: ["TD"])
    ignore: list[str] = field(default_factory=list)
    per_file_ignores: dict[str, list[str]] = field(default_factory=dict)
    exclude: list[str] = field(default_factory=list)
    fail_on: str = "warning"
    severity: dict[str, str] = field(default_factory=dict)  # code or prefix -> the level its findings get
    torch_version: tuple[int, int] | None = None
    torch_version_source: str = "unknown"
    respect_gitignore: bool = True
    include_tests: bool = False
    max_file_bytes: int = DEFAULT_MAX_BYTES
    root: str = "."  # the folder patterns are relative to: the config file's, or the current one
    config_path: str | None = None


def parse_version(text: str) -> tuple[int, int] | None:
    m = re.match(r"^\s*(\d+)\.(\d+)", str(text))
    return (int(m.group(1)), int(m.group(2))) if m else None


def installed_torch_version() -> str | None:
    """The installed torch's version string, read from package metadata: torch is not imported."""
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def find_config(start: str) -> Path | None:
    """The nearest pyproject.toml with a [tool.torchdoctor] table, from `start` upwards."""
    current = Path(start).resolve()
    if not current.is_dir():
        current = current.parent
    for folder in (current, *current.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            try:
                text = candidate.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            # A broken file that does configure torchdoctor is an error, not something to skip.
            if "tool.torchdoctor" in text and _table(candidate, explicit=True) is not None:
                return candidate
    return None


def _read_toml(path: Path) -> dict[str, Any]:
    import tomllib

    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config {path} is not valid TOML: {exc}") from None


def _table(path: Path, explicit: bool) -> dict[str, Any] | None:
    try:
        data = _read_toml(path)
    except ConfigError:
        if explicit:
            raise
        return None
    table = data.get("tool", {}).get("torchdoctor") if isinstance(data.get("tool"), dict) else None
    if table is None and explicit and path.name != "pyproject.toml":
        table = data  # a dedicated torchdoctor.toml with the keys at the top level
    if table is not None and not isinstance(table, dict):
        raise ConfigError(f"{path}: [tool.torchdoctor] must be a table")
    return table


def load(config: str | None, start: str) -> Settings:
    """Settings from `--config` or the nearest pyproject.toml, with the torch version resolved."""
    settings = Settings(root=os.getcwd())
    path: Path | None = None
    if config is not None:
        path = Path(config)
        if not path.is_file():
            raise ConfigError(f"config file not found: {config}")
        table = _table(path, explicit=True)
        if table is None:
            raise ConfigError(f"{config} has no [tool.torchdoctor] table")
    else:
        path = find_config(start)
        table = _table(path, explicit=False) if path is not None else None
    if path is not None and table is not None:
        settings.root = str(path.resolve().parent)
        settings.config_path = str(path)
        _apply(settings, table, str(path))
    if settings.torch_version is None:
        installed = installed_torch_version()
        if installed is not None:
            settings.torch_version = parse_version(installed)
            settings.torch_version_source = f"installed torch {installed}"
    return settings


def _strings(value: Any, key: str, where: str) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: `{key}` must be a list of strings")
    return list(value)


def _apply(settings: Settings, table: dict[str, Any], where: str) -> None:
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) in [tool.torchdoctor]: {', '.join(unknown)} (known: {', '.join(KEYS)})")
    if "select" in table:
        settings.select = _strings(table["select"], "select", where)
    if "ignore" in table:
        settings.ignore = _strings(table["ignore"], "ignore", where)
    if "exclude" in table:
        settings.exclude = _strings(table["exclude"], "exclude", where)
    if "per-file-ignores" in table:
        value = table["per-file-ignores"]
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: `per-file-ignores` must be a table of pattern = [codes]")
        settings.per_file_ignores = {k: _strings(v, f"per-file-ignores.{k}", where) for k, v in value.items()}
    if "fail-on" in table:
        settings.fail_on = check_fail_on(table["fail-on"], where)
    if "severity" in table:
        value = table["severity"]
        if not isinstance(value, dict) or not all(isinstance(v, str) and v in LEVELS for v in value.values()):
            raise ConfigError(f"{where}: `severity` must be a table of code = \"error\" | \"warning\" | \"info\"")
        settings.severity = {str(k).upper(): v for k, v in value.items()}
    if "torch-version" in table:
        version = parse_version(str(table["torch-version"]))
        if version is None:
            raise ConfigError(f"{where}: `torch-version` must look like \"2.4\", not {table['torch-version']!r}")
        settings.torch_version = version
        settings.torch_version_source = f"torch-version = {table['torch-version']!r} in {where}"
    if "respect-gitignore" in table:
        if not isinstance(table["respect-gitignore"], bool):
            raise ConfigError(f"{where}: `respect-gitignore` must be true or false")
        settings.respect_gitignore = table["respect-gitignore"]
    if "include-tests" in table:
        if not isinstance(table["include-tests"], bool):
            raise ConfigError(f"{where}: `include-tests` must be true or false")
        settings.include_tests = table["include-tests"]
    if "max-file-bytes" in table:
        value = table["max-file-bytes"]
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ConfigError(f"{where}: `max-file-bytes` must be a positive integer")
        settings.max_file_bytes = value


def check_fail_on(value: Any, where: str = "--fail-on") -> str:
    if value not in FAIL_ON:
        raise ConfigError(f"{where}: fail-on must be one of {', '.join(FAIL_ON)}, not {value!r}")
    return value
