"""The compose recipes: schema-valid, wired together, and configuring real gateway settings."""

from __future__ import annotations

import json
import math
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from deploy_recipes import (
    CHECKPOINT_REVISION,
    COMPOSE_ENV,
    DEPLOY,
    ROOT,
    STACKS,
    Dockerfile,
    MissingVariable,
    load_compose,
    service_environment,
)
from pydantic import BaseModel

from service.settings import AUDIO_TOKENS_PER_SECOND, GatewaySettings

PREFIX = "MOSS_GATEWAY_"
#: MOSS_GATEWAY_* variables that are not settings fields, and the file that reads each.
NOT_SETTINGS = {
    "MOSS_GATEWAY_GIT_REVISION": ROOT / "service" / "identity.py",
    "MOSS_GATEWAY_SERVER__ADMIN_TOKEN_FILE": DEPLOY / "common" / "entrypoint.sh",
}
#: Prompt tokens per audio second (12.5 audio tokens + time markers + template; moss-contract facts).
PROMPT_TOKENS_PER_SECOND = 13.25


def settings_field(env_name: str) -> Any:
    """The GatewaySettings field an environment variable sets (prefix, `__` nesting, any case)."""
    assert env_name.upper().startswith(PREFIX)
    model: type[BaseModel] = GatewaySettings
    parts = env_name[len(PREFIX):].lower().split("__")
    found: Any = None
    for i, part in enumerate(parts):
        fields = {name.lower(): info for name, info in model.model_fields.items()}
        if part not in fields:
            return None
        found = fields[part]
        annotation = found.annotation
        if i < len(parts) - 1:
            if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
                return None
            model = annotation
    return found


def image_env(df: Dockerfile) -> dict[str, str]:
    """The runtime stage's ENV, with build-arg defaults (and the compose GIT_REVISION) substituted."""
    values = {"GIT_REVISION": COMPOSE_ENV["GIT_REVISION"]}
    env: dict[str, str] = {}
    for stage in df.stages:
        values.update({k: v for k, v in stage.args().items() if v is not None})
    for ins in [i for s in df.stages for i in s.all("ENV")]:
        for token in shlex.split(ins.args):
            key, _, value = token.partition("=")
            env[key] = re.sub(r"\$\{(\w+)\}", lambda m: values.get(m.group(1), env.get(m.group(1), "")), value)
    return env


def effective_env(stack: str, dockerfiles: dict[str, Dockerfile], compose: dict[str, Any]) -> dict[str, str]:
    env = image_env(dockerfiles[stack])
    env.update(service_environment(compose["services"]["gateway"]))
    return env


def gateway_settings(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> GatewaySettings:
    import os

    for key in list(os.environ):
        if key.upper().startswith(PREFIX):
            monkeypatch.delenv(key)
    for key, value in env.items():
        if key.startswith(PREFIX):
            monkeypatch.setenv(key, value)
    return GatewaySettings()


@pytest.fixture(scope="module")
def schema_validator() -> Any:
    import jsonschema

    schema = json.loads((DEPLOY / "schemas" / "compose-spec.json").read_text())
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())


@pytest.mark.parametrize("stack", STACKS)
def test_compose_validates_against_the_compose_spec(stack: str, composes: dict, schema_validator: Any) -> None:
    errors = sorted(schema_validator.iter_errors(composes[stack]), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors[:10])


def test_schema_validation_can_fail(schema_validator: Any) -> None:
    bad = load_compose("cuda")
    bad["services"]["gateway"]["restart"] = ["always"]
    bad["services"]["gateway"]["no_such_key"] = 1
    assert list(schema_validator.iter_errors(bad))


@pytest.mark.parametrize(
    ("stack", "required"),
    [(s, v) for s in STACKS for v in ("GIT_REVISION", "MOSS_MODELS_DIR")]
    + [("cuda", "CUDA_BASE_DIGEST"), ("rocm", "ROCM_BASE_DIGEST"), ("rocm", "RENDER_GID")],
)
def test_required_variables_stop_compose(stack: str, required: str) -> None:
    env = {k: v for k, v in COMPOSE_ENV.items() if k != required}
    with pytest.raises(MissingVariable, match=required):
        load_compose(stack, env)


@pytest.mark.parametrize("stack", STACKS)
def test_services_are_wired(stack: str, composes: dict) -> None:
    compose = composes[stack]
    services = compose["services"]
    assert {"gateway", "qualify", "prometheus"} <= set(services)
    gateway, qualify = services["gateway"], services["qualify"]
    build = gateway["build"]
    base = DEPLOY / stack
    assert (base / build["context"]).resolve() == ROOT
    assert (ROOT / build["dockerfile"]).resolve() == (base / "Dockerfile").resolve()
    assert gateway["image"] == qualify["image"] and stack in gateway["image"]
    assert COMPOSE_ENV["GIT_REVISION"] in gateway["image"]
    # The qualify job: a profile, the CLI against the gateway, the admin token.
    assert qualify["profiles"] == ["qualify"]
    command = " ".join(qualify["command"])
    assert "moss-gateway qualify --url http://gateway:8000" in command
    assert "probe.py wait-engine --url http://gateway:8000" in command
    assert qualify["depends_on"]["gateway"]["condition"] == "service_started", (
        "not service_healthy: the gateway is unhealthy until qualified, which is what this job does"
    )
    for service in (gateway, qualify):
        secret_file = service_environment(service)["MOSS_GATEWAY_SERVER__ADMIN_TOKEN_FILE"]
        name = Path(secret_file).name
        assert secret_file == f"/run/secrets/{name}" and name in service["secrets"] and name in compose["secrets"]
    # Mounts: the weights read-only at the engine's model path, the state in a named volume.
    env = service_environment(gateway)
    volumes = {v["target"]: v for v in gateway["volumes"]}
    model = volumes[env["MOSS_GATEWAY_ENGINE__MODEL"]]
    assert model["type"] == "bind" and model["read_only"] is True
    assert model["source"].endswith("/MOSS-Transcribe-Diarize")
    assert volumes["/state"]["type"] == "volume" and volumes["/state"]["source"] in compose["volumes"]
    assert env["MOSS_GATEWAY_ENGINE__REVISION"] == CHECKPOINT_REVISION == build["args"]["MOSS_CHECKPOINT_REVISION"]
    assert env["HF_HUB_OFFLINE"] == "1"
    assert any(p.endswith(":8000") for p in gateway["ports"])
    # Files the services mount exist.
    for service in services.values():
        for volume in service.get("volumes", []):
            if volume["type"] == "bind" and not volume["source"].startswith("/"):
                assert (base / volume["source"]).exists(), f"{volume['source']} does not exist"
    if "grafana" in services:
        assert services["grafana"]["profiles"] == ["grafana"]


@pytest.mark.parametrize("stack", STACKS)
def test_build_args_match_the_dockerfile(stack: str, composes: dict, dockerfiles: dict) -> None:
    """Compose passes declared build args only, and never silently changes a pin's default."""
    import yaml

    df = dockerfiles[stack]
    declared = set(df.global_args) | {name for s in df.stages for name in s.args()}
    raw = yaml.safe_load((DEPLOY / stack / "compose.yaml").read_text())["services"]["gateway"]["build"]["args"]
    for name, value in composes[stack]["services"]["gateway"]["build"]["args"].items():
        assert name in declared, f"compose passes build arg {name}, which the Dockerfile does not declare"
        default = df.arg_default(name)
        if "${" in str(raw[name]):
            continue  # operator-supplied (digest, git revision, dates, job count)
        assert default, f"{name}: compose pins it but the Dockerfile has no default"
        assert str(value) == default, f"compose overrides the pin {name}: {value!r} != Dockerfile {default!r}"
    supplied = {name for name, value in raw.items() if "${" in str(value)}
    assert supplied <= {"GIT_REVISION", "CUDA_BASE_DIGEST", "ROCM_BASE_DIGEST", "BUILD_DATE", "SOURCE_URL", "MAX_JOBS"}


@pytest.mark.parametrize("stack", STACKS)
def test_every_moss_gateway_variable_is_a_setting(stack: str, composes: dict, dockerfiles: dict) -> None:
    names = set(image_env(dockerfiles[stack]))
    for service in composes[stack]["services"].values():
        names |= set(service_environment(service))
    names = {n for n in names if n.upper().startswith(PREFIX)}
    assert names, "no MOSS_GATEWAY_ variables found"
    for name in sorted(names):
        if name in NOT_SETTINGS:
            assert name in NOT_SETTINGS[name].read_text(), f"{name} is not read by {NOT_SETTINGS[name]}"
            continue
        assert settings_field(name) is not None, f"{name} is not a field of service.settings.GatewaySettings"


def test_settings_lookup_can_fail() -> None:
    assert settings_field("MOSS_GATEWAY_ENGINE__MAX_MODEL_LEN") is not None
    assert settings_field("moss_gateway_engine__max_model_len") is not None
    assert settings_field("MOSS_GATEWAY_ENGINE__MAX_MODEL_LENGTH") is None
    assert settings_field("MOSS_GATEWAY_STATE_DIR__X") is None
    assert settings_field("MOSS_GATEWAY_ENGINE") is not None


@pytest.mark.parametrize("stack", STACKS)
def test_gateway_env_makes_valid_settings(stack: str, composes: dict, dockerfiles: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    env = effective_env(stack, dockerfiles, composes[stack])
    settings = gateway_settings(monkeypatch, env)
    engine = settings.engine
    assert engine.model == "/models/MOSS-Transcribe-Diarize" and engine.revision == CHECKPOINT_REVISION
    assert engine.dtype == "bfloat16"
    assert str(settings.state_dir) == "/state"
    assert (settings.server.host, settings.server.port) == ("0.0.0.0", 8000)
    # The encoder budget holds the longest accepted input (the settings validator enforces it too).
    assert engine.max_num_batched_tokens >= math.ceil(settings.max_duration_s * AUDIO_TOKENS_PER_SECOND)
    if stack == "cuda":
        assert engine.max_model_len == 131072
        assert engine.max_num_batched_tokens == 67500 == math.ceil(90 * 60 * AUDIO_TOKENS_PER_SECOND)
        assert settings.max_duration_s == 90 * 60
    else:
        # Shared-memory iGPU: a lower memory share, eager mode, and a context that holds the prompt
        # of the longest accepted input plus the default (conservative) output budget.
        assert engine.gpu_memory_utilization <= 0.7
        assert engine.enforce_eager is True
        needed = settings.max_duration_s * (PROMPT_TOKENS_PER_SECOND + settings.budget.conservative_tokens_per_second)
        assert engine.max_model_len >= needed, f"{engine.max_model_len} < {needed:.0f}"
        kv_gib = engine.max_model_len * 114_688 / 2**30  # BF16 decoder KV bytes per token
        assert kv_gib < 0.6 * 32 / 2, f"one full-length sequence takes {kv_gib:.1f} GiB of KV"


def test_settings_check_can_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        gateway_settings(
            monkeypatch,
            {"MOSS_GATEWAY_ENGINE__MODEL": "/m", "MOSS_GATEWAY_ENGINE__MAX_NUM_BATCHED_TOKENS": "16384"},
        )


def test_accelerator_access(composes: dict) -> None:
    cuda = composes["cuda"]["services"]["gateway"]
    devices = cuda["deploy"]["resources"]["reservations"]["devices"]
    assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices)
    rocm = composes["rocm"]["services"]["gateway"]
    assert set(rocm["devices"]) == {"/dev/kfd", "/dev/dri"}
    assert [str(g) for g in rocm["group_add"]] == ["44", COMPOSE_ENV["RENDER_GID"]]
    for gateway in (cuda, rocm):
        assert gateway.get("ipc") == "host" or re.fullmatch(r"\d+gb", str(gateway.get("shm_size", ""))), "vLLM needs shared memory"
        assert "HSA_OVERRIDE_GFX_VERSION" not in service_environment(gateway)
