"""Haystack components over care-retriever. Requires ``pip install care-retriever[haystack]``."""
