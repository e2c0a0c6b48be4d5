"""The query side of the data path: the retriever over a store (:mod:`.retriever`, ``CareRetriever``), the HTTP
service and its batching (:mod:`.server`, :mod:`.batching`) and the query towers exported to ONNX / OpenVINO
(:mod:`.backends`: the torch-free search path)."""
