"""The HTTP entry point: the console's API, its web UI and /metrics (``fabricscope serve``)."""
