"""Run plumbing that every task shares, below the tasks and above the models: the run directory
and its metrics log, checkpoints, the device, the progress bar, the process group under
torchrun, the one-writer lock, SIGTERM as an interrupt, and the epoch loops' helpers. Nothing
here knows a task: the text, image and detection loops import it, never one another."""
