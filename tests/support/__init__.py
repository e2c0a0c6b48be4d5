"""What the tests share as plain code (not fixtures): paths, texts, tiny-model builders, CLI runners, workers.

Test modules import from here; no test module imports another, and nothing imports a conftest.
"""
