"""CMedTEB-style evaluation: retrieval, rerank and STS tasks, baselines, metrics from maintained libraries."""
