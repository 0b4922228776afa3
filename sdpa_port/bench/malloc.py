"""A steady glibc allocator for timing runs.

By default glibc serves large blocks with fresh mmap calls and moves that threshold as blocks are freed, so how
many page faults an eager forward pays (tens of thousands at L=1024, a third of its CPU time here) depends on the
allocation history of the process: two processes running identical code differed by 15-35%. Turning mmap off and
trimming off keeps freed memory of any size in the heap for reuse, the same way in every process, so that after the
warm-up no call pays page faults (the timing then leaves out the cost of first touching fresh memory, which eager
attention pays most). Memory measurements do not use this: their child processes set the opposite (return every
large block at once, so RSS follows the live tensors).
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3
M_MMAP_MAX = -4
MMAP_THRESHOLD_MAX = 32 * 2**20  # glibc's upper limit on 64-bit systems
TRIM_THRESHOLD = 2**31 - 1
TOP_PAD = 64 * 2**20


def steady_malloc() -> bool:
    """Fix glibc's mmap and trim thresholds in this process.

    False where the C library has no mallopt.
    """
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return all(
        mallopt(option, value) == 1
        for option, value in (
            (M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX),
            (M_MMAP_MAX, 0),  # no mmap at all: blocks of any size come from the heap and stay there
            (M_TRIM_THRESHOLD, TRIM_THRESHOLD),
            (M_TOP_PAD, TOP_PAD),
        )
    )
