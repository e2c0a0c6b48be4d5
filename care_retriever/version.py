"""The package's version, on the ground floor: read by the manifests and model configs that record it."""

__version__ = "0.1.0"
