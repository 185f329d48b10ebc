"""The golden suite's peers: run a golden case's single-node (or dequantize-graph) model in
onnx.reference and onnxruntime, and the session's record of what each peer gave on every
case of the default suite (tests/conftest.py, `golden_peer_runs`), which tests/test_golden.py
(agreement outside the divergence table) and tests/test_profiles.py (the peer profiles)
share so that the peers run once per test session."""

import ctypes
import warnings

import numpy as np

import qemu_q
from qemu_q import golden
from qemu_q.golden import writers

REFERENCE, ONNXRUNTIME = golden.REFERENCE, golden.ONNXRUNTIME


def run_reference(case, model_bytes):
    import onnx
    from onnx.reference import ReferenceEvaluator

    model = onnx.load_from_string(model_bytes)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return ReferenceEvaluator(model).run(None, dict(case.inputs))


_ORT_SESSION_OPTIONS = None


def run_onnxruntime(case, model_bytes):
    """Through IOBinding and raw buffers: ORT's numpy API cannot pass int4 / int2 / most
    float8 tensors, OrtValues over packed bytes can."""
    import onnxruntime as ort

    global _ORT_SESSION_OPTIONS
    if _ORT_SESSION_OPTIONS is None:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.log_severity_level = 3
        options.intra_op_num_threads = 1
        _ORT_SESSION_OPTIONS = options
    session = ort.InferenceSession(model_bytes, _ORT_SESSION_OPTIONS,
                                   providers=["CPUExecutionProvider"])
    binding = session.io_binding()
    keep = []
    for name, array in case.inputs:
        etype = qemu_q.element_type(array.dtype)
        value = ort.OrtValue.ortvalue_from_shape_and_type(list(array.shape), etype.onnx_id)
        data = np.ascontiguousarray(qemu_q.pack(array))
        assert value.tensor_size_in_bytes() == data.nbytes
        if data.nbytes:
            ctypes.memmove(value.data_ptr(), data.ctypes.data, data.nbytes)
        keep.append((value, data))
        binding.bind_ortvalue_input(name, value)
    outputs = []
    for name, expected in case.outputs:
        etype = qemu_q.element_type(expected.dtype)
        value = ort.OrtValue.ortvalue_from_shape_and_type(list(expected.shape), etype.onnx_id)
        binding.bind_ortvalue_output(name, value)
        outputs.append((value, etype, expected.shape))
    session.run_with_iobinding(binding)
    results = []
    for value, etype, shape in outputs:
        size = value.tensor_size_in_bytes()
        raw = bytes((ctypes.c_uint8 * size).from_address(value.data_ptr())) if size else b""
        results.append(qemu_q.unpack(raw, etype.name, shape))
    return results


RUNTIMES = {REFERENCE: run_reference, ONNXRUNTIME: run_onnxruntime}


def run_peers(suite) -> dict:
    """(runtime, case name) -> ("cannot", reason) | ("error", text) | ("ran", [outputs]):
    every case of the suite through both peers, the divergent ones too."""
    results = {}
    for case in suite:
        model_bytes = writers.model_bytes(case)
        for runtime, run in RUNTIMES.items():
            reason = golden.cannot_run(runtime, case.config)
            if reason:
                results[(runtime, case.name)] = ("cannot", reason)
                continue
            try:
                outputs = [np.asarray(r) for r in run(case, model_bytes)]
            except Exception as error:  # noqa: BLE001 - reported per case by the tests
                results[(runtime, case.name)] = ("error", f"{type(error).__name__}: {error}")
                continue
            results[(runtime, case.name)] = ("ran", outputs)
    return results
