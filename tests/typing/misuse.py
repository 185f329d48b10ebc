"""Calls the public signatures must refuse (tests/test_typing.py expects one error per line
marked "error"): the hints are real, not Any."""

import numpy as np

import qemu_q

x = np.zeros(4, dtype=np.float32)
qemu_q.quantize_linear(x, x, axis="1")  # error
qemu_q.quantize_linear(x, x, nan="quiet")  # error
text: str = qemu_q.dequantize_linear(x, x)  # error
qemu_q.choose_qparams(x, "int8", 1)  # error
count: str = qemu_q.get_num_threads()  # error
