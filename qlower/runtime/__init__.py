"""Executing compiled programs."""
