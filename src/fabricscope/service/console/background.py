"""The thread life cycle the console's supervisors share: start once, stop within a deadline."""

from __future__ import annotations

import threading


class BackgroundLoop:
    """A subclass implements ``_run`` (looping until ``self._stop`` is set); ``start`` runs
    it in a daemon thread named ``thread_name``, ``stop`` sets the event and joins."""

    thread_name = "console-loop"

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def _run(self) -> None:  # pragma: no cover - every subclass overrides it
        raise NotImplementedError

    def start(self) -> None:
        """Start the loop in the background (a second call does nothing)."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> bool:
        """Stop the loop; True when its thread ended within ``timeout_s``."""
        self._stop.set()
        t = self._thread
        if t is None:
            return True
        t.join(timeout_s)
        self._thread = None
        return not t.is_alive()
