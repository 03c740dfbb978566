"""Starting and supervising processes: local clusters on loopback, their free
ports, children that die with their parent, and which Docker Compose to run."""
