"""What a user writes, type-checked by tests/test_typing.py (never run by pytest)."""

import ml_dtypes
import numpy as np

import qemu_q

x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
scale, zero_point = qemu_q.choose_qparams(x, "int8", axis=1, block_size=2, symmetric=True)
y: np.ndarray = qemu_q.quantize_linear(x, scale, zero_point, axis=1, block_size=2, saturate=True)
raw: np.ndarray = qemu_q.quantize_linear(x, np.float32(0.01), output_dtype="int4", packed=True)
back: np.ndarray = qemu_q.dequantize_linear(raw, np.float32(0.01), packed=True, dtype="int4", shape=(3, 4))
codes, y_scale, y_zero_point = qemu_q.dynamic_quantize_linear(x, opset=11)
outputs: list[np.ndarray] = qemu_q.run_op("QuantizeLinear", [x, scale], {"axis": 1}, 21)
data: np.ndarray = qemu_q.unpack(qemu_q.pack(codes).tobytes(), ml_dtypes.uint4, 12)
etype: qemu_q.ElementType = qemu_q.element_type(17)
spec: qemu_q.OpSpec = qemu_q.get_spec("QuantizeLinear", 25)
qemu_q.set_num_threads(None)
threads: int = qemu_q.get_num_threads()
parallel: bool = qemu_q.openmp_enabled()
