"""The towers as their own libraries read them: sentence-transformers modules, the authors' release, presets,
offline tokenizers. This layer imports nothing of the model above it."""

# Tokens a tower reads at most unless its model says otherwise.
DEFAULT_MAX_LENGTH = 512
