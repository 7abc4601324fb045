"""Emulation lab: namespaces, software switches, traffic and measurement for dpu-limiter."""
