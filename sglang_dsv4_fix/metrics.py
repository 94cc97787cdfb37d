"""The planner kernel as a Prometheus gauge on SGLang's own ``/metrics`` (``--enable-metrics``).

SGLang serves ``/metrics`` from prometheus_client's multiprocess registry over
``PROMETHEUS_MULTIPROC_DIR`` (``sglang/srt/utils/common.py``: ``add_prometheus_middleware``), so a
gauge any process writes there shows on it. Each process writes one series,
``sglang_dsv4_fix_planner_kernel{variant, verdict, sha256, release, process, rank, action, pid} 1``
(``action``: ``ok``, ``warned`` or ``healed``, as in the report record; ``pid`` is added by
prometheus_client's ``liveall`` mode). Imported by the plugin only when
``PROMETHEUS_MULTIPROC_DIR`` is set; the folder is never created here.
"""

from __future__ import annotations

import os
from typing import Any

NAME = "sglang_dsv4_fix_planner_kernel"
LABELS = ("variant", "verdict", "sha256", "release", "process", "rank", "action")
_gauge: Any = None


def export(**labels: str) -> bool:
    """Set this process's series to 1; False (nothing written) without a multiprocess folder
    or without prometheus_client."""
    folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not folder or not os.path.isdir(folder):
        return False
    try:
        from prometheus_client import Gauge
    except ImportError:
        return False
    global _gauge
    if _gauge is None:
        _gauge = Gauge(
            NAME,
            "The DeepSeek-V4 planner kernel this SGLang process runs (sgl-project/sglang#32467)",
            LABELS,
            multiprocess_mode="liveall",
        )
    _gauge.labels(**{k: labels.get(k, "") for k in LABELS}).set(1)
    return True
