"""Fixtures of the deploy-recipe checks (helpers live in deploy_recipes.py)."""

from __future__ import annotations

from typing import Any

import pytest
from deploy_recipes import DEPLOY, STACKS, Dockerfile, load_compose, parse_dockerfile


@pytest.fixture(scope="session")
def dockerfiles() -> dict[str, Dockerfile]:
    return {stack: parse_dockerfile(DEPLOY / stack / "Dockerfile") for stack in STACKS}


@pytest.fixture(scope="session")
def composes() -> dict[str, dict[str, Any]]:
    return {stack: load_compose(stack) for stack in STACKS}
