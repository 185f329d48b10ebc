# How a kernel splits a tensor into tasks for the thread team, and each task into segments:
# contiguous runs of elements whose scale and zero point are either one value or a
# contiguous run of values. Shared by the quantize and dequantize kernels.

cdef enum:
    # Elements per task where the work is a flat run: large enough to amortise the
    # scheduling, small enough to balance up to sixteen threads on megabyte tensors.
    RUN_CHUNK = 16384

cdef enum Granularity:
    PER_TENSOR = 0
    PER_AXIS = 1
    BLOCKED = 2


cdef struct Layout:
    Py_ssize_t size
    Py_ssize_t outer       # product of the dimensions before the axis
    Py_ssize_t axis_len
    Py_ssize_t inner       # product of the dimensions after the axis
    Py_ssize_t block_size
    Py_ssize_t n_blocks
    Py_ssize_t axis_chunks # RUN_CHUNK pieces of a row when the axis is innermost
    int granularity


cdef struct Segment:
    Py_ssize_t start        # first element
    Py_ssize_t length
    Py_ssize_t param_index  # index of the first scale / zero point
    bint params_vary        # scale[param_index + i] for element start + i, else one value


cdef inline Layout make_layout(Py_ssize_t size, Py_ssize_t outer, Py_ssize_t axis_len,
                               Py_ssize_t inner, int granularity, Py_ssize_t block_size) noexcept nogil:
    cdef Layout L
    L.size = size
    L.outer = outer
    L.axis_len = axis_len
    L.inner = inner
    L.granularity = granularity
    L.block_size = block_size if block_size > 0 else 1
    L.n_blocks = (axis_len + L.block_size - 1) // L.block_size
    L.axis_chunks = (axis_len + RUN_CHUNK - 1) // RUN_CHUNK
    return L


cdef inline Py_ssize_t layout_tasks(const Layout* L) noexcept nogil:
    if L.size == 0:
        return 0
    if L.granularity == PER_TENSOR:
        return (L.size + RUN_CHUNK - 1) // RUN_CHUNK
    if L.inner > 1:
        return L.outer * L.axis_len
    return L.outer * L.axis_chunks


cdef inline bint next_segment(const Layout* L, Py_ssize_t task, Py_ssize_t k, Segment* s) noexcept nogil:
    # Fills the k-th segment of `task`; False when the task has no more.
    cdef Py_ssize_t o, j, chunk_end, b
    if L.granularity == PER_TENSOR:
        if k > 0:
            return False
        s.start = task * RUN_CHUNK
        s.length = min(<Py_ssize_t>RUN_CHUNK, L.size - s.start)
        s.param_index = 0
        s.params_vary = False
        return True
    if L.inner > 1:
        # One task per (outer, axis) row of `inner` contiguous elements.
        if k > 0:
            return False
        o = task // L.axis_len
        j = task - o * L.axis_len
        s.start = task * L.inner
        s.length = L.inner
        if L.granularity == PER_AXIS:
            s.param_index = j
            s.params_vary = False
        else:
            s.param_index = (o * L.n_blocks + j // L.block_size) * L.inner
            s.params_vary = True
        return True
    # The axis is innermost: a task is a RUN_CHUNK piece of one row.
    o = task // L.axis_chunks
    j = (task - o * L.axis_chunks) * RUN_CHUNK
    chunk_end = min(j + <Py_ssize_t>RUN_CHUNK, L.axis_len)
    if L.granularity == PER_AXIS:
        if k > 0:
            return False
        s.start = o * L.axis_len + j
        s.length = chunk_end - j
        s.param_index = j
        s.params_vary = True
        return True
    # Blocked along the innermost axis: one segment per block met by the chunk, the first
    # and last clipped to it (RUN_CHUNK need not be a multiple of the block size).
    b = j // L.block_size + k
    if b * L.block_size >= chunk_end:
        return False
    s.start = max(b * L.block_size, j)
    s.length = min((b + 1) * L.block_size, chunk_end) - s.start
    s.start += o * L.axis_len
    s.param_index = o * L.n_blocks + b
    s.params_vary = False
    return True
