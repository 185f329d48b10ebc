# The one task runner of every kernel module: n_tasks independent tasks, on the calling
# thread or on an OpenMP team, each thread in the default floating-point environment
# (_fpenv.pxd) for its share.
#
# The team takes tasks from a TaskQueue: the tasks are split into one contiguous range per
# thread, each with an atomic counter. A thread takes the tasks of its own range in order,
# so that it streams through one contiguous run of memory as a static split would (two
# threads taking interleaved tasks ran slower on large tensors); once its range
# is drained it takes what is left of the others, so that a thread the OS preempts holds
# up the call by one task at most (a static split, or OpenMP's 'guided' whose first grab is
# half the work, made a 2-thread call wait out a 10 ms scheduler slice).

from cython.parallel cimport parallel, threadid

from _fpenv cimport fp_state, fp_enter, fp_leave

cdef enum:
    # Threads the task queue splits the tasks for; larger teams share the last ranges.
    MAX_RANGES = 64

# A kernel's task: `work` is the kernel's own description of the call (its arrays and
# plan), `task` the index of the task to run.
ctypedef void (*task_function)(const void* work, Py_ssize_t task) noexcept nogil

cdef extern from *:
    """
    #if defined(_MSC_VER)
    #include <intrin.h>
    static inline Py_ssize_t qemu_q_claim(Py_ssize_t *counter) {
        return (Py_ssize_t)_InterlockedExchangeAdd64((volatile __int64 *)counter, 1);
    }
    static inline Py_ssize_t qemu_q_peek(Py_ssize_t *counter) {
        return *(volatile Py_ssize_t *)counter;
    }
    #else
    static inline Py_ssize_t qemu_q_claim(Py_ssize_t *counter) {
        return __atomic_fetch_add(counter, 1, __ATOMIC_RELAXED);
    }
    /* Other threads add to the counter meanwhile: an atomic read, relaxed (the claim
       itself decides; this only skips ranges that look drained). */
    static inline Py_ssize_t qemu_q_peek(Py_ssize_t *counter) {
        return __atomic_load_n(counter, __ATOMIC_RELAXED);
    }
    #endif
    """
    Py_ssize_t atomic_claim "qemu_q_claim" (Py_ssize_t* counter) noexcept nogil
    Py_ssize_t atomic_peek "qemu_q_peek" (Py_ssize_t* counter) noexcept nogil


cdef struct TaskQueue:
    int n_ranges
    Py_ssize_t next[MAX_RANGES]   # the next task of each range (claimed atomically)
    Py_ssize_t stop[MAX_RANGES]   # one past its last task


cdef inline void task_queue_init(TaskQueue* q, Py_ssize_t n_tasks, int n_threads) noexcept nogil:
    cdef int r
    q.n_ranges = max(1, min(n_threads, <int>MAX_RANGES))
    for r in range(q.n_ranges):
        q.next[r] = n_tasks * r // q.n_ranges
        q.stop[r] = n_tasks * (r + 1) // q.n_ranges


cdef inline Py_ssize_t task_queue_claim(TaskQueue* q, int home) noexcept nogil:
    # The next task for the thread whose own range is `home`, or -1 when none is left.
    # A counter may run past its range's stop: harmless, it is only compared.
    cdef int k, r
    cdef Py_ssize_t task
    for k in range(q.n_ranges):
        r = (home + k) % q.n_ranges
        if atomic_peek(&q.next[r]) < q.stop[r]:
            task = atomic_claim(&q.next[r])
            if task < q.stop[r]:
                return task
    return -1


cdef inline void run_tasks(task_function run_task, const void* work, Py_ssize_t n_tasks,
                           int n_threads) noexcept nogil:
    # Every task of a call. The team is never larger than the number of tasks, and one
    # thread (a small call, a forked child: qemu_q/_threads.py) never enters OpenMP.
    cdef TaskQueue queue
    cdef Py_ssize_t task
    cdef int home
    cdef fp_state fp
    cdef int team = <int>min(<Py_ssize_t>max(1, n_threads), n_tasks)
    if team > 1:
        task_queue_init(&queue, n_tasks, team)
        with parallel(num_threads=team):
            fp = fp_enter()
            home = threadid()
            task = task_queue_claim(&queue, home)
            while task >= 0:
                run_task(work, task)
                task = task_queue_claim(&queue, home)
            fp_leave(fp)
    else:
        fp = fp_enter()
        for task in range(n_tasks):
            run_task(work, task)
        fp_leave(fp)
