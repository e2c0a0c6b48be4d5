"""Output paths of ``eval --save-run`` that cannot be written: refused in one line before any model encodes,
naming the path given (not a temporary file), and nothing half-written left beside it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.support.cli import run_cli


def _wrong_kind(tmp_path: Path, kind: str) -> tuple[Path, str]:
    out = tmp_path / "out"
    out.mkdir()
    if kind == "a folder":
        (out / "run.trec").mkdir()
        return out / "run.trec", "must be a file, but this is a folder"
    (out / "blocker").write_text("a file\n")
    return out / "blocker" / "run.trec", "must be inside a folder, but this is a file"


# several runs write siblings named after the given path (run.MODEL.TASK.trec), so a folder at that very name is in
# the way of a single run only
@pytest.mark.parametrize(("kind", "many"), [("a folder", False), ("beneath a file", False), ("beneath a file", True)])
def test_a_save_run_path_of_the_wrong_kind_is_one_line_before_any_work(
    tasks: dict[str, Path], tmp_path: Path, capsys, kind: str, many: bool
) -> None:
    path, said = _wrong_kind(tmp_path, kind)
    task_args = ["--task", tasks["retrieval"], *(["--task", tasks["rerank"]] if many else [])]
    before = sorted(p.relative_to(tmp_path) for p in (tmp_path / "out").rglob("*"))
    code, out, err = run_cli(
        capsys, "eval", "--model", "bm25", *task_args, "--save-run", path, "--json", "--no-progress"
    )
    line = err.strip()
    assert code == 2 and not out, out  # no task scored, no result printed
    assert len(line.splitlines()) == 1 and "Traceback" not in line
    assert said in line and "--save-run" in line, line
    assert sorted(p.relative_to(tmp_path) for p in (tmp_path / "out").rglob("*")) == before  # nothing left behind


def test_a_save_run_whose_parent_is_missing_is_created(tasks: dict[str, Path], tmp_path: Path, capsys) -> None:
    path = tmp_path / "new" / "sub" / "run.trec"
    code, _, _ = run_cli(capsys, "eval", "--model", "bm25", "--task", tasks["retrieval"], "--save-run", path)
    assert code == 0 and path.is_file() and "Q0" in path.read_text()
    assert sorted(p.name for p in path.parent.iterdir()) == ["run.trec"]  # no temporary file beside it


def test_two_models_of_one_folder_name_save_two_runs(
    tasks: dict[str, Path], tmp_path: Path, tiny_model_dir: Path, capsys
) -> None:
    # both were labelled by their folder's name: one run file, the second run written over the first
    other = tmp_path / "elsewhere" / tiny_model_dir.name
    shutil.copytree(tiny_model_dir, other)
    runs = tmp_path / "runs" / "r.trec"
    code, out, err = run_cli(
        capsys,
        "eval",
        "--models",
        tiny_model_dir,
        other,
        "--task",
        tasks["retrieval"],
        "--save-run",
        runs,
        "--json",
        "--no-progress",
    )
    assert code == 0, err
    labels = [json.loads(line)["model"] for line in out.splitlines()]
    assert len(labels) == 2 and len(set(labels)) == 2, labels
    assert len(list(runs.parent.glob("*.trec"))) == 2


def test_two_tasks_of_one_name_with_save_run_are_one_line_before_any_work(
    tasks: dict[str, Path], tmp_path: Path, capsys
) -> None:
    twin = tmp_path / "elsewhere" / tasks["retrieval"].name
    shutil.copytree(tasks["retrieval"], twin)
    runs = tmp_path / "runs" / "r.trec"
    code, out, err = run_cli(
        capsys,
        "eval",
        "--model",
        "bm25",
        "--task",
        tasks["retrieval"],
        twin,
        "--save-run",
        runs,
        "--json",
        "--no-progress",
    )
    line = err.strip()
    assert code == 2 and not out and len(line.splitlines()) == 1, (out, line)
    assert "--save-run" in line and "r.bm25.toy-retrieval.trec" in line, line
    assert not runs.parent.exists()
