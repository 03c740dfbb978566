"""The test lanes, one folder each under tests/ (docs/tests.md): what a test needs decides its lane."""

LANES = ("protocol", "checking", "shells", "cluster", "spark", "deploy", "hosts")
PURE = ("protocol", "checking")  # `make test-pure`: no process, socket or Spark
