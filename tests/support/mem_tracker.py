"""torch's own count of a module's memory: MemTracker's peak of every storage live while it
runs (parameters, buffers and inputs included; CPU), what tdag.memory's prediction is
checked against."""
from __future__ import annotations

import torch
from torch.distributed._tools.mem_tracker import MemTracker


def measured_peak(module, args) -> int:
    """MemTracker's peak total: every storage live while ``module(*args)`` runs."""
    tracker = MemTracker()
    tracker.track_external(module, *args)
    with tracker, torch.no_grad():
        module(*args)
    return tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
