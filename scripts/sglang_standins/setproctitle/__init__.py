"""Import-time stand-in for setproctitle.

Needed by: sglang/srt/managers/scheduler.py (`import setproctitle`), imported by
speculative/eagle_worker_v2.py (EagleDraftWorker, whose draft_forward the EAGLE draft
runner calls).
Why a stand-in suffices: it only renames scheduler processes.
"""
from _cgsim_standin import install

install(__name__)
