"""Module paths of earlier releases keep working for one release: the same module objects, with a warning.

The folders along the data path (``model/``, ``indexing/``, ``search/``) moved modules that users import
(``care_retriever.embedder``, ``care_retriever.writer``, ``care_retriever.backends``, ...). An old path must give
the module the package itself uses (one copy: a class imported by its old path is the class the package checks
against) and say where it went; ``python -m care_retriever.index`` (what torchrun starts) is unchanged.
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from care_retriever import old_paths

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("old", sorted(old_paths.MOVED))
def test_an_old_path_is_the_new_module_and_warns(old: str) -> None:
    new = old_paths.MOVED[old]
    expected = importlib.import_module(new)
    sys.modules.pop(old, None)  # as a process that never imported it
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    assert module is expected
    assert module.__spec__ is not None and module.__spec__.name == new  # the module keeps its own identity
    said = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    assert said == [f"{old} moved to {new}; the old path goes in release {old_paths.MOVED_MODULES[old][1]}"]


@pytest.mark.slow
def test_a_module_under_an_old_package_path_is_not_loaded_twice() -> None:
    # a fresh process, as a user's: the path finder would load model/towers/release.py a second time under its old
    # name if the old-path finder did not come first
    code = (
        "import warnings; warnings.simplefilter('ignore', DeprecationWarning)\n"
        "from care_retriever.model.embedder import AsymmetricEmbedder\n"
        "from care_retriever.model.towers import release\n"
        "import care_retriever.towers.release as old\n"
        "from care_retriever.embedder import AsymmetricEmbedder as OldEmbedder\n"
        "assert old is release, 'two copies of the release module'\n"
        "assert OldEmbedder is AsymmetricEmbedder\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_old_names_of_the_index_module_warn_and_its_entry_runs() -> None:
    import care_retriever.index as entry
    from care_retriever.indexing.distributed import IndexSettings

    with pytest.warns(DeprecationWarning, match="care_retriever.indexing.distributed.IndexSettings"):
        assert entry.IndexSettings is IndexSettings
    with pytest.raises(AttributeError):
        entry.no_such_name  # noqa: B018
    done = subprocess.run(
        [sys.executable, "-m", "care_retriever.index", "--help"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "--max-batch-tokens" in done.stdout


@pytest.mark.slow
def test_new_paths_import_without_a_warning() -> None:
    code = (
        "import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
        "import care_retriever.model.embedder, care_retriever.indexing.writer, care_retriever.search.retriever\n"
        "import care_retriever.search.backends, care_retriever.cli.main\n"
        "from care_retriever import AsymmetricEmbedder, CareRetriever, DocumentStoreWriter, read_corpus\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


# ---------------------------------------------------------------------------------------------------- their end
def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def test_the_package_version_is_read_from_one_place() -> None:
    import care_retriever

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text("utf-8"))["project"]["version"]
    assert care_retriever.__version__ == pyproject


def expired(version: str) -> list[str]:
    """Every alias whose removal release ``version`` has reached."""
    aliases = {**old_paths.MOVED_MODULES, **old_paths.MOVED_NAMES}
    return sorted(old for old, (_, removed_in) in aliases.items() if _version(version) >= _version(removed_in))


def test_expired_finds_an_alias_at_its_removal_release() -> None:
    assert "care_retriever.embedder" in expired("0.2.0")
    assert "care_retriever.indexing.corpus:Document" not in expired("0.2.5")
    assert "care_retriever.indexing.corpus:Document" in expired("0.3.0")
    assert expired("0.0.9") == []


def test_no_alias_outlives_its_release() -> None:
    """An alias is deleted in the release it names: this fails once the package's version reaches it."""
    import care_retriever

    gone = expired(care_retriever.__version__)
    assert not gone, f"remove these aliases (care_retriever/old_paths.py), release {care_retriever.__version__}: {gone}"


@pytest.mark.parametrize("old", sorted(old_paths.MOVED_NAMES))
def test_an_old_name_is_the_object_at_its_new_place(old: str) -> None:
    new, _ = old_paths.MOVED_NAMES[old]
    old_module, _, old_name = old.partition(":")
    new_module, _, new_name = new.partition(":")
    moved = importlib.import_module(new_module)
    if old_name == "*":  # a module that forwards every name of another (with a warning)
        with pytest.warns(DeprecationWarning, match=new_module):
            assert importlib.import_module(old_module).run_index is moved.run_index
        return
    assert getattr(importlib.import_module(old_module), old_name) is getattr(moved, new_name)
