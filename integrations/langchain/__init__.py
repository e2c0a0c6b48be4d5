"""LangChain adapters over care-retriever. Requires ``pip install care-retriever[langchain]``."""
