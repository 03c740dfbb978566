"""Configuration and security: the cluster file, and mutual TLS with the
control-plane token."""
