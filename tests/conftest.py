import os
import pathlib

import pytest

SHARED = pathlib.Path(__file__).resolve().parents[1].parent / "shared"


@pytest.fixture(scope="session")
def shared_dir():
    if not SHARED.is_dir():
        pytest.fail(f"../shared is missing (looked for {SHARED}): CI clones the project beside it")
    return SHARED
