"""The document side's runtime: how a tower runs fast on a corpus (packed batches, compiled layers, FP8,
fused norms, prefetching, batch sizing), and where it runs (device, dtype, attention). It imports nothing of the
model: the towers and the embedder call it."""
