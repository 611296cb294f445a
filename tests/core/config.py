"""The worker's configuration, under the name the core gives it once the settings are split
(worker/config.py's WorkerConfig); the tests here use only the fields both have."""

from __future__ import annotations

try:
    from evq.worker.config import WorkerConfig  # type: ignore[import-not-found]
except ImportError:  # before the split: drop this branch once it is merged
    from evq.worker.settings import Settings as WorkerConfig

__all__ = ["WorkerConfig"]
