"""`evq serve`: the HTTP API (/v1), the operators' page (/ops), /metrics and /healthz in one process."""
