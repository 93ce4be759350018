"""Readers for the deploy recipes (tests/deploy): Dockerfiles, Compose files (with Compose's interpolation), locks.

Everything here runs without Docker, a GPU or the network: the recipes are checked as files.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
STACKS = ("cuda", "rocm")
#: The checkpoint revision the recipes are pinned to (issue 5).
CHECKPOINT_REVISION = "d7231bbae2587a4af278735eb765b318c4f64edd"
CHECKPOINT_REPO = "OpenMOSS-Team/MOSS-Transcribe-Diarize"
#: Values for the variables the compose files require (`${VAR:?...}`), as an operator's .env sets them.
COMPOSE_ENV = {
    "GIT_REVISION": "0123456789abcdef0123456789abcdef01234567",
    "CUDA_BASE_DIGEST": "sha256:" + "a" * 64,
    "ROCM_BASE_DIGEST": "sha256:" + "b" * 64,
    "MOSS_MODELS_DIR": "/srv/models",
    "RENDER_GID": "992",
}


def canonical(name: str) -> str:
    """PEP 503 normalised project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


# -- Dockerfiles ---------------------------------------------------------------------------------


@dataclass
class Instruction:
    keyword: str  # upper case: FROM, RUN, ...
    args: str  # the rest, continuation lines joined
    line: int  # first line (1-based)


@dataclass
class Stage:
    base: str  # the FROM argument, unexpanded
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def args(self) -> dict[str, str | None]:
        """ARG name -> default (None when declared without one)."""
        out: dict[str, str | None] = {}
        for ins in self.all("ARG"):
            name, eq, default = ins.args.partition("=")
            out[name.strip()] = unquote(default.strip()) if eq else None
        return out


@dataclass
class Dockerfile:
    path: Path
    instructions: list[Instruction]
    global_args: dict[str, str | None]
    stages: list[Stage]

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def arg_default(self, name: str) -> str | None:
        """The default of ARG `name`, wherever declared (global first)."""
        if self.global_args.get(name) is not None:
            return self.global_args[name]
        for stage in self.stages:
            value = stage.args().get(name)
            if value is not None:
                return value
        return None

    def all_arg_defaults(self, name: str) -> list[str]:
        values = [self.global_args[name]] if self.global_args.get(name) is not None else []
        values += [s.args()[name] for s in self.stages if s.args().get(name) is not None]
        return [v for v in values if v is not None]


def unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def parse_dockerfile(path: Path) -> Dockerfile:
    """A small Dockerfile reader: comments, parser directives, `\\` continuations, stages."""
    instructions: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # comment lines inside a continued instruction are dropped by Docker too
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending.append(stripped[:-1].strip())
            continue
        pending.append(stripped)
        text = " ".join(part for part in pending if part)
        pending = []
        keyword, _, rest = text.partition(" ")
        instructions.append(Instruction(keyword.upper(), rest.strip(), start))
    if pending:
        raise AssertionError(f"{path}: the file ends inside a continued instruction")
    global_args: dict[str, str | None] = {}
    stages: list[Stage] = []
    for ins in instructions:
        if ins.keyword == "FROM":
            parts = ins.args.split()
            parts = [p for p in parts if not p.startswith("--")]
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(parts[0], name))
        elif not stages:
            if ins.keyword != "ARG":
                raise AssertionError(f"{path}:{ins.line}: only ARG may precede the first FROM, not {ins.keyword}")
            name, eq, default = ins.args.partition("=")
            global_args[name.strip()] = unquote(default.strip()) if eq else None
        else:
            stages[-1].instructions.append(ins)
    return Dockerfile(path, instructions, global_args, stages)


# -- Compose -------------------------------------------------------------------------------------

_INTERPOLATION = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}"
    r"|(?P<plain>[A-Za-z_][A-Za-z0-9_]*))"
)


class MissingVariable(ValueError):
    """A `${VAR:?message}` whose variable is unset or empty."""


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's variable interpolation of one string (the forms the recipes use)."""

    def substitute(match: re.Match[str]) -> str:
        if match.group("escaped"):
            return "$"
        name = match.group("braced") or match.group("plain")
        op, arg = match.group("op"), match.group("arg") or ""
        present = name in env
        nonempty = present and env[name] != ""
        if op is None:
            return env.get(name, "")
        if op in (":-", "-"):
            return env[name] if (nonempty if op == ":-" else present) else interpolate(arg, env)
        if op in (":?", "?"):
            if nonempty if op == ":?" else present:
                return env[name]
            raise MissingVariable(f"{name}: {arg}")
        if op in (":+", "+"):
            return interpolate(arg, env) if (nonempty if op == ":+" else present) else ""
        raise AssertionError(op)

    return _INTERPOLATION.sub(substitute, value)


def interpolate_tree(node: Any, env: dict[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, list):
        return [interpolate_tree(item, env) for item in node]
    if isinstance(node, dict):
        return {key: interpolate_tree(value, env) for key, value in node.items()}
    return node


def load_compose(stack: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    raw = yaml.safe_load((DEPLOY / stack / "compose.yaml").read_text(encoding="utf-8"))
    return interpolate_tree(raw, dict(COMPOSE_ENV if env is None else env))


def service_environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


# -- locks ---------------------------------------------------------------------------------------


@dataclass
class Pin:
    name: str
    version: str
    hashes: list[str]


@cache
def read_lock(path: Path) -> dict[str, Pin]:
    """A pip requirements file with `==` pins and `--hash` options, keyed by canonical name."""
    pins: dict[str, Pin] = {}
    logical: list[str] = []
    current = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.split(" #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if not line.strip():
            if current:
                logical.append(current)
                current = ""
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        logical.append(current)
        current = ""
    if current:
        logical.append(current)
    for entry in logical:
        tokens = entry.split()
        if not tokens:
            continue
        spec = tokens[0]
        if "==" not in spec:
            raise AssertionError(f"{path}: {spec!r} is not an exact pin")
        name, version = spec.split("==", 1)
        name = name.split("[", 1)[0]
        hashes = [t.split("=", 1)[1] for t in tokens[1:] if t.startswith("--hash=")]
        pins[canonical(name)] = Pin(name, version, hashes)
    return pins


def read_cpu_lock() -> dict[str, str]:
    out: dict[str, str] = {}
    for raw in (ROOT / "requirements" / "cpu.lock").read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            out[canonical(name)] = version.strip()
        elif " @ " in line:  # name @ URL of a wheel: the version is in the file name
            name, url = line.split(" @ ", 1)
            wheel = url.rsplit("/", 1)[-1].split("#", 1)[0]
            out[canonical(name)] = wheel.split("-")[1]
    return out


def read_exceptions() -> dict[str, str]:
    """deploy/cpu-lock-exceptions.txt: canonical name -> reason."""
    out: dict[str, str] = {}
    for raw in (DEPLOY / "cpu-lock-exceptions.txt").read_text(encoding="utf-8").splitlines():
        body, _, reason = raw.partition("#")
        if body.strip():
            out[canonical(body.strip())] = reason.strip()
    return out


def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def exact_pins(requirements: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for req in requirements:
        name, sep, version = req.partition("==")
        assert sep, f"pyproject requirement {req!r} is not an exact pin"
        out[canonical(name.split("[", 1)[0].strip())] = version.strip()
    return out
