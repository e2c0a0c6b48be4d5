"""The document side of the data path: a corpus read (:mod:`.corpus`), encoded by the document tower with the
options of :mod:`.config`, written into a store by :mod:`.writer` (``DocumentStoreWriter``), one process or many
(:mod:`.distributed`, what ``care-retriever index`` and torchrun run)."""
