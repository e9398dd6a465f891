"""Unit tests: pure-Python control-plane modules, no sockets and no router process."""
