import pathlib

import pytest

SHARED = pathlib.Path(__file__).resolve().parents[1].parent / "shared"


@pytest.fixture(scope="session")
def shared_dir():
    if not SHARED.is_dir():
        pytest.fail(f"../shared is missing (looked for {SHARED}): CI clones the project beside it")
    return SHARED


def pytest_report_header(config):
    import qemu_q

    return f"qemu_q {qemu_q.__version__} from {qemu_q.__file__}; openmp_enabled={qemu_q.openmp_enabled()}"


@pytest.fixture(scope="session")
def package_home():
    """The directory holding the qemu_q under test (site-packages, or the source tree when
    built in place): subprocesses run there so they import the same package."""
    import qemu_q

    return pathlib.Path(qemu_q.__file__).resolve().parents[1]
