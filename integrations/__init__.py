"""Framework integrations: Haystack components and LangChain adapters over the core (``care_retriever``)."""
