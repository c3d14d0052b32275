import pathlib

import numpy as np
import pytest

import frugal

REPO = pathlib.Path(__file__).resolve().parents[2]

# The digits MLP of examples/ (Adam); the tests train it for a few steps only.
MLP = REPO / "examples" / "digits-mlp.toml"


@pytest.fixture(scope="session")
def digits():
    return frugal.digits()


@pytest.fixture
def mlp_path():
    return str(MLP)

FLOWER_APP = REPO / "examples" / "flower"


def require(what: str, env: str):
    """Skips a test whose tool is missing (reported as skipped) unless ``env`` is set, which makes it
    a failure (`cargo xtask test` sets it where it installed the tool)."""
    import os

    if os.environ.get(env):
        pytest.fail(f"{what} is required ({env} is set) but not available")
    pytest.skip(f"{what} is not available (set {env}=1 to make this a failure)")


@pytest.fixture
def flower():
    """The Flower example's package, importable (skipped without Flower)."""
    import sys

    try:
        import flwr  # noqa: F401
        import ray  # noqa: F401
    except ImportError:
        require("Flower with its simulation engine (pip install 'flwr[simulation]')", "FRUGAL_REQUIRE_FLOWER")
    if str(FLOWER_APP) not in sys.path:
        sys.path.insert(0, str(FLOWER_APP))
    import frugal_flower.task

    return frugal_flower
