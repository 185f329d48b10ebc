# How a kernel splits a tensor into tasks for the thread team (_tasks.pxd runs them), and
# each task into segments: contiguous runs of elements whose scale and zero point are
# either one value or a contiguous run of values. Shared by the quantize and dequantize
# kernels.
#
# A task is a flat range of element indices. Every element is computed on its own, so
# the bits never depend on where the ranges fall, on the thread count, or on which thread
# takes which task. A cursor walks a task segment by segment with additions only, so that
# short segments (blocks of 32, rows of a few channels) do not pay a division each.

cdef enum:
    # Elements per task: from MIN_TASK to MAX_TASK, aiming at 4 tasks per thread (see
    # set_task_size). Long tasks keep each thread streaming through one contiguous run
    # (512 KB of float32 at most; shorter ones interleaved between two threads ran slower);
    # several per thread bound what a preempted thread can hold up. Multiples of
    # 4096, so that tasks start on whole bytes of every packed layout (2 codes per byte,
    # 4 per byte, 4 codes in 3 bytes) and on whole pack/unpack buffers.
    MIN_TASK = 16384
    MAX_TASK = 131072

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
    Py_ssize_t task_size   # elements per task
    int granularity


cdef struct Segment:
    Py_ssize_t start        # first element
    Py_ssize_t length
    Py_ssize_t param_index  # index of the first scale / zero point
    bint params_vary        # scale[param_index + i] for element start + i, else one value


cdef struct Cursor:
    # Position of element `pos` as (outer index o, axis index j, inner index r), with
    # j = block * block_size + in_block.
    Py_ssize_t pos
    Py_ssize_t end
    Py_ssize_t o
    Py_ssize_t j
    Py_ssize_t r
    Py_ssize_t block
    Py_ssize_t in_block
    Py_ssize_t row_block    # o * n_blocks + block: the parameter of a last-axis block


cdef inline Layout make_layout(Py_ssize_t size, Py_ssize_t outer, Py_ssize_t axis_len,
                               Py_ssize_t inner, int granularity, Py_ssize_t block_size) noexcept nogil:
    cdef Layout L
    L.size = size
    L.outer = outer
    L.axis_len = axis_len
    L.inner = inner
    L.granularity = granularity
    L.block_size = block_size if block_size > 0 else 1
    # Rounded up without forming axis_len + block_size, which could overflow.
    L.n_blocks = axis_len // L.block_size + (axis_len % L.block_size != 0)
    L.task_size = MIN_TASK
    return L


cdef inline int check_layout(const Layout* L) except -1:
    # What every index the kernels form relies on, checked once per call, so that no
    # caller (the Python layer clamps and validates first) can make a kernel read outside
    # its arrays. With size = outer * axis_len * inner and 1 <= block_size <= axis_len,
    # every element index, parameter index (< outer * n_blocks * inner <= size) and task
    # bound (< size + MAX_TASK) is below 2**63: numpy caps an array's byte size at
    # PY_SSIZE_T_MAX, and a packed byte offset (index * bits / 8, bits <= 8) stays below
    # the index times 8, itself below 2**60 because no machine addresses 2**60 bytes.
    cdef Py_ssize_t rows
    if L.size < 0 or L.outer < 0 or L.axis_len < 0 or L.inner < 0:
        raise ValueError("layout: negative extent")
    if L.granularity == PER_TENSOR:
        return 0
    if L.inner == 0 or L.axis_len == 0 or L.outer == 0:
        if L.size != 0:
            raise ValueError("layout: extents do not multiply to the size")
        return 0
    rows = L.size // L.inner
    if rows * L.inner != L.size or rows % L.axis_len != 0 or rows // L.axis_len != L.outer:
        raise ValueError("layout: extents do not multiply to the size")
    if L.granularity == BLOCKED and not (1 <= L.block_size <= L.axis_len):
        raise ValueError(f"layout: block_size {L.block_size} outside [1, {L.axis_len}]")
    if L.size > (<Py_ssize_t>1 << 60):
        raise ValueError("layout: more than 2**60 elements")
    return 0


cdef inline void set_task_size(Layout* L, int n_threads) noexcept nogil:
    # About 4 tasks per thread, within [MIN_TASK, MAX_TASK], a multiple of 4096.
    cdef Py_ssize_t t = L.size // (4 * (n_threads if n_threads > 1 else 1))
    t = (t // 4096) * 4096
    L.task_size = max(<Py_ssize_t>MIN_TASK, min(<Py_ssize_t>MAX_TASK, t))


cdef inline Py_ssize_t layout_tasks(const Layout* L) noexcept nogil:
    return (L.size + L.task_size - 1) // L.task_size


cdef inline Py_ssize_t layout_parameters(const Layout* L) noexcept nogil:
    # How many scales (and zero points) the layout reads.
    if L.granularity == PER_TENSOR:
        return 1 if L.size > 0 else 0
    if L.granularity == PER_AXIS:
        return L.axis_len
    return L.outer * L.n_blocks * L.inner


cdef inline void cursor_at(const Layout* L, Py_ssize_t start, Py_ssize_t end, Cursor* c) noexcept nogil:
    # The divisions happen once per task, here.
    cdef Py_ssize_t row
    c.pos = start
    c.end = end
    if L.granularity == PER_TENSOR:
        c.o = 0; c.j = 0; c.r = 0; c.block = 0; c.in_block = 0; c.row_block = 0
        return
    row = start // L.inner
    c.r = start - row * L.inner
    c.o = row // L.axis_len
    c.j = row - c.o * L.axis_len
    c.block = c.j // L.block_size
    c.in_block = c.j - c.block * L.block_size
    c.row_block = c.o * L.n_blocks + c.block


cdef inline void cursor_step_axis(const Layout* L, Cursor* c) noexcept nogil:
    # Move to the next axis index (the inner index is back at 0).
    c.j += 1
    c.in_block += 1
    if c.in_block == L.block_size:
        c.in_block = 0
        c.block += 1
        c.row_block += 1
    if c.j == L.axis_len:
        c.j = 0
        c.block = 0
        c.in_block = 0
        c.o += 1
        c.row_block = c.o * L.n_blocks


cdef inline bint next_segment(const Layout* L, Cursor* c, Segment* s) noexcept nogil:
    # Fills the segment at the cursor and advances past it; False at the end of the range.
    cdef Py_ssize_t left = c.end - c.pos
    cdef Py_ssize_t n
    if left <= 0:
        return False
    s.start = c.pos
    if L.granularity == PER_TENSOR:
        s.length = left
        s.param_index = 0
        s.params_vary = False
        c.pos = c.end
        return True
    if L.inner > 1:
        # Within one (outer, axis) row of `inner` contiguous elements.
        n = min(L.inner - c.r, left)
        s.length = n
        if L.granularity == PER_AXIS:
            s.param_index = c.j
            s.params_vary = False
        else:
            s.param_index = c.row_block * L.inner + c.r
            s.params_vary = True
        c.pos += n
        c.r += n
        if c.r == L.inner:
            c.r = 0
            cursor_step_axis(L, c)
        return True
    # The axis is innermost.
    if L.granularity == PER_AXIS:
        n = min(L.axis_len - c.j, left)
        s.length = n
        s.param_index = c.j
        s.params_vary = True
        c.pos += n
        c.j += n
        if c.j == L.axis_len:
            c.j = 0
            c.o += 1
        return True
    return next_block_run(L, c, s)


cdef inline bint next_block_run(const Layout* L, Cursor* c, Segment* s) noexcept nogil:
    # Blocked along the innermost axis (inner == 1): the rest of the current block, one
    # scale and zero point, and the cursor moved past it; False at the end of the range.
    # Consecutive blocks have consecutive parameters, from one row to the next too. The
    # one place that steps blocks: next_segment and the kernels' last-axis loops call it.
    cdef Py_ssize_t left = c.end - c.pos
    cdef Py_ssize_t n
    if left <= 0:
        return False
    n = min(min(L.block_size - c.in_block, L.axis_len - c.j), left)
    s.start = c.pos
    s.length = n
    s.param_index = c.row_block
    s.params_vary = False
    c.pos += n
    c.j += n
    c.in_block += n
    if c.j == L.axis_len:
        c.j = 0
        c.block = 0
        c.in_block = 0
        c.o += 1
        c.row_block += 1
    elif c.in_block == L.block_size:
        c.in_block = 0
        c.block += 1
        c.row_block += 1
    return True
