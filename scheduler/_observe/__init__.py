"""Observability: OpenTelemetry traces (``tracing``) and Prometheus metrics (``metrics``), each
used only when its extra is installed and configured."""
