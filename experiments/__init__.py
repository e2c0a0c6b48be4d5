"""Research studies of training choices (scaling curves, the miniature ablations); each module runs as
``python -m experiments.NAME`` from the repository root (README.md here: which script writes which doc).
Not installed with the wheel."""
