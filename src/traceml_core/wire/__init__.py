"""The telemetry wire: frame codec and protocol (protocol.py), and the rank-side client."""
