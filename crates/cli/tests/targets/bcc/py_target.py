# The Python target of the BCC tests (tests/bcc.rs: ucalls, uflow, ustat), run by a copy of
# Debian's python3 (its USDT probes: python:function__entry, function__return, ...).
#
# Protocol (bt_target.c's): prints "ready PID", waits for a line on stdin, runs the workload,
# prints "done", and waits for stdin to close. The workload: outer() once, middle() and leaf()
# CALLS times each, with a pause between iterations (the tools read their perf buffers in
# Python, slower than the events would come without one; and uflow's whole run, about 130
# events of 192 bytes, fits in its 32 KiB buffer even if its reader is held up).
#
# CPython 3.11 reaches its function__entry/function__return probes only on its tracing path,
# taken while a trace or profile function is set (or the line probe is on), whatever the
# probes' semaphores say: a no-op profile function is set around the workload.
import os
import sys
import time

CALLS = 12


def leaf(i):
    return i * 2


def middle(i):
    return leaf(i) + 1


def outer(n):
    s = 0
    for i in range(n):
        s += middle(i)
        time.sleep(0.002)
    return s


print("ready", os.getpid(), flush=True)
sys.stdin.readline()
sys.setprofile(lambda *a: None)
total = outer(CALLS)
sys.setprofile(None)
print("done", total, flush=True)
sys.stdin.readline()
