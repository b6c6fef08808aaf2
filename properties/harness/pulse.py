"""The run's pulse: a thread that beats the heartbeat while the run advances between its beats.

``normcert certify`` ends a run whose heartbeat file goes untouched for ``STALLED`` kernel timeouts
(``cli._wait``): a run stuck in kernel code outside the watchdog (a finalizer, an exception's
``__str__``, an import).  The run beats as a test starts and as a kernel call returns
(``Session.beat``), and a watched call beats while its interpreted launches advance
(``sandbox.Worker.run``).  Two kinds of progress went unseen between those beats, and on a loaded
machine they outlast the silence allowed (a held-out FP4 Triton kernel's run was ended as "made no
progress for 360 s" while it advanced):

* Triton's interpreter running programs where no watchdog thread looks: a call on the kernel's
  importer thread (``Context.thread`` "importer"), a launch from a thread of the kernel's own;
* normcert's oracle computing exact values: mpmath over a large case (one FP4 case in float64
  took 46 s on an idle machine, minutes on a loaded one).

Every ``period`` seconds the pulse looks at every thread and beats where one of them advanced: the
interpreter's count of programs started (``interpreter.programs_so_far``, per thread: read, never
imported, since the pulse runs beside the run's own imports of triton) changed since its last look, or a thread is inside the oracle (its stack holds a frame of normcert's ``oracle``
package, which calls numpy, mpmath and the standard library alone: it ends).  A process stuck in
kernel code does neither, and its heartbeat stops as before.

The threads' frames are read with the collector off (``frames``): CPython before 3.11.9 and 3.12.3
deadlocks where a collection starts inside ``sys._current_frames()`` (which holds the runtime's
lock of thread states while it makes frame objects) and frees a ``threading.local``, whose
clearing takes that lock again (gh-106883).  Hypothesis's engine holds such locals, so the pulse
stopped a whole run on Python 3.11.7: both xdist workers of a quick tier waited forever.
"""
from __future__ import annotations

import gc
import os
import sys
import threading
import time

from ... import oracle
from . import interpreter

ORACLE = os.path.dirname(os.path.abspath(oracle.__file__)) + os.sep
"""The oracle package's folder: a frame whose code lies under it is the oracle at work."""


def in_oracle(frame) -> bool:
    """Does the stack ending in ``frame`` hold a frame of the oracle package's code?"""
    while frame is not None:
        if os.path.abspath(frame.f_code.co_filename).startswith(ORACLE):
            return True
        frame = frame.f_back
    return False


def frames() -> dict:
    """``sys._current_frames()`` with no collection inside it (the module docstring; CPython's own
    fix does the same): the collector is off for the call where it was on, and on again after."""
    on = gc.isenabled()
    gc.disable()
    try:
        return sys._current_frames()
    finally:
        if on:
            gc.enable()


def advancing(seen: dict) -> bool:
    """Did any thread advance since ``seen`` was taken (updated in place to now)?  A thread advances
    where the interpreter started a program in it since the last look, or where it is inside the
    oracle.  A thread first seen now is no news whatever its count: CPython hands an ended thread's
    ident to the next thread it starts, and the count kept under that ident is the ended thread's."""
    frames_now = frames()
    now = {ident: interpreter.programs_so_far(ident) for ident in frames_now}  # never imports triton
    moved = any(ident in seen and count != seen[ident] for ident, count in now.items())
    seen.clear()
    seen.update(now)
    return moved or any(in_oracle(frame) for frame in frames_now.values())


def start(heartbeat: str, period: float = 1.0) -> threading.Thread:
    """A daemon thread that touches ``heartbeat`` every ``period`` seconds where the run advanced
    (``advancing``); it lives as long as the process, and holds nothing of the run but the path."""
    def loop():
        seen: dict = {}
        advancing(seen)  # the counts as the pulse starts: programs before it are no news
        while True:
            time.sleep(period)
            if advancing(seen):
                try:
                    os.utime(heartbeat)
                except OSError:
                    pass  # the parent's folder is gone: the parent is gone too

    thread = threading.Thread(target=loop, name="normcert-pulse", daemon=True)
    thread.start()
    return thread
