"""The ``care-retriever`` command line. Each command group lives in its own module with ``register(app)``."""
