"""Backends: code generators and executors for each target."""
