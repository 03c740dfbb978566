"""The one load generator: an app's workload sent to a cluster's nodes (`generator.LoadGenerator`).

Every app, the bank included, is loaded the same way: its `workload` draws
commands, `SubmitBatch` carries them, each under a request id of its own.
`background.BackgroundLoad` runs it on a thread for synchronous callers.
"""
