"""Test support: the pytest plugin (emulator and mock-server fixtures)."""
