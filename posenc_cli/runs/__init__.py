"""Run plumbing that every task shares, below the tasks and above the models: the run directory
and its metrics log, checkpoints, the device, the progress bar, the process group under
torchrun, the one-writer lock, SIGTERM as an interrupt, and the one training loop every task
runs (``loop``, with ``cadence``, ``schedule``, ``resume`` and the pieces in ``epochs``): a task
hands it hooks for what differs. Nothing here knows a task: the tasks import it, never one
another, and nothing here imports a task."""
