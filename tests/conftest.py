import pathlib

import pytest
from hypothesis import settings

# Every hypothesis test draws the same examples on every run (a CI failure reproduces), and
# keeps no example database between runs.
settings.register_profile("qemu_q", derandomize=True, database=None, print_blob=True)
settings.load_profile("qemu_q")

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


@pytest.fixture(scope="session")
def golden_suite():
    """Every case of the default golden suite, built once per session."""
    from qemu_q import golden

    return [golden.build_case(config) for config in golden.iter_configs()]


@pytest.fixture(scope="session")
def golden_peer_runs(golden_suite):
    """What onnx.reference and onnxruntime give on every case of the default suite, run
    once per session (tests/golden_peers.py, run_peers): shared by tests/test_golden.py
    and tests/test_profiles.py."""
    pytest.importorskip("onnx", reason="the golden peers need the onnx extra")
    pytest.importorskip("onnxruntime", reason="onnxruntime is in the test extra")
    import golden_peers

    return golden_peers.run_peers(golden_suite)
