"""Speed, memory and quality measurements of the shipped product; each module runs as ``python -m benchmarks.NAME``
from the repository root (README.md here: which script writes which doc). Not installed with the wheel."""
