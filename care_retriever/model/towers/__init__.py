"""Tower construction: sentence-transformers modules, presets, offline tokenizers."""
