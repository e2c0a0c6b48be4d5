"""A fresh process that imports a component first (as ``Pipeline.loads`` of a saved pipeline does) gets it: the
components import the filters module of ``care_retriever.integrations.haystack``, whose package named them all
eagerly, so the first import met a half-initialised module (ImportError; ``Pipeline.loads``: "not imported")."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("haystack")

FRESH = """
from haystack import Pipeline
Pipeline.loads('''components:
  retriever:
    type: haystack_integrations.components.retrievers.care_retriever.store_retriever.CareStoreRetriever
    init_parameters: {store: 'faiss:STORE'}
connections: []
''')
from haystack_integrations.document_stores.care_retriever import CareFaissDocumentStore
from care_retriever.integrations.haystack import CareStoreRetriever, CareTextEmbedder
print("imported")
"""


def test_a_fresh_process_loads_a_saved_pipeline_and_imports_each_component(tmp_path) -> None:
    code = FRESH.replace("STORE", str(tmp_path / "store"))
    env = {**os.environ, "HAYSTACK_TELEMETRY_ENABLED": "False"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert (done.returncode, done.stdout.strip()) == (0, "imported"), done.stderr[-2000:]
