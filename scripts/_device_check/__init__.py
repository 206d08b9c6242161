"""Pieces of ``scripts/device_check.py`` (the one-shot GPU check) kept out of its main file."""
