"""One module per task; each exposes a `TASK` object implementing `pytest_mlxgate.capability.base.Task`."""
