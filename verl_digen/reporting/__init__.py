"""What a run leaves for people to read: per-step metrics (names in ``metric_names.py``), the console
lines and progress bar, the metrics file and curves, the streamed timeline, and the measured profile."""
