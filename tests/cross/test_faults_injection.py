"""Fault injection over every write point of a store's transaction, in the manner of SQLite's I/O-error and
crash tests (tests/support/fault_injection.py numbers the points).

For a FAISS bulk write through the staging folder, a FAISS in-place transaction (with and without a fold) and
Qdrant Edge (optimized at finalize, and optimized at each commit too, mid-write, as ``index --max-segment-size``
does): each point is made to fail in turn with ENOSPC, then with EIO, and (in a subprocess) to die there.
After each: the error is one line naming a file (a :class:`WriteError`), ``verify`` passes, the store holds
exactly the old version or exactly the new one (Qdrant Edge: every point whole, each document old or new, and
the count ``info`` gives is what ``verify`` finds), and running the write again completes with every document,
leaving no staging folder. The suite is red when a point is skipped: the failures injected must equal the points
a clean run passes, and every injected failure must surface as a WriteError.
"""

from __future__ import annotations

import errno
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from care_retriever.errors import WriteError
from care_retriever.stores.faiss import files
from tests.support.fault_injection import (
    KILLED,
    Injector,
    armed,
    contents,
    expected_new,
    expected_old,
    is_qdrant,
    prepare_modules,
    seed,
    write,
)

WORKER = Path(__file__).resolve().parents[1] / "support" / "fault_injection.py"
ROOT = Path(__file__).resolve().parents[2]
# subprocesses per scenario (each ~1 s of imports): every point where there are fewer, an even sample otherwise
# (qdrant-segments: besides the sample, every point of its commit-time optimize and the point after it)
MAX_KILLS = {"staged": 12, "in-place": 18, "fold": 12, "qdrant": 6, "qdrant-segments": 4}
INJECTED: dict[str, int] = {}  # scenario -> failures injected (printed at the end of each test)

SCENARIOS = ("staged", "in-place", "fold", "qdrant", "qdrant-segments")


def backend(scenario: str) -> str:
    """The seeded old version a scenario starts from: FAISS's, or its own Qdrant collection's (its settings)."""
    return scenario if is_qdrant(scenario) else "faiss"


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each backend's old version, built once and copied for every injected run."""
    out = {}
    for kind in ("faiss", "qdrant", "qdrant-segments"):
        folder = tmp_path_factory.mktemp(f"seed-{kind}") / "store"
        if is_qdrant(kind):
            pytest.importorskip("qdrant_client")
        seed(kind if is_qdrant(kind) else "staged", folder)
        out[kind] = folder
    return out


def fresh(seeded: dict[str, Path], scenario: str, where: Path) -> Path:
    if where.exists():
        shutil.rmtree(where)
    where.mkdir(parents=True)
    folder = where / "store"
    shutil.copytree(seeded[backend(scenario)], folder)
    return folder


def clean_run(seeded: dict[str, Path], scenario: str, where: Path) -> list[str]:
    """The write points a clean run passes, in order ("label path")."""
    folder = fresh(seeded, scenario, where)
    with armed(Injector()) as injector:
        write(scenario, folder)
    assert contents(scenario, folder)[0] == expected_new()
    assert injector.count > 0
    if scenario == "qdrant-segments":  # the scenario's point: an optimize at a commit, before the write's last upsert
        labels = [label.split()[1] for label in injector.labels]
        assert "optimize" in labels[: len(labels) - labels[::-1].index("upsert")], injector.labels
    return injector.labels


def clean_points(seeded: dict[str, Path], scenario: str, where: Path) -> int:
    return len(clean_run(seeded, scenario, where))


def commit_time_optimize(labels: list[str]) -> list[int]:
    """The points (1-based) of the first optimize of a write (a commit's, in qdrant-segments): the point before the
    engine runs it, the one after it returned, and the flush after that."""
    first = next(i for i, label in enumerate(labels) if label.startswith("edge optimize "))
    return [first + 1, first + 2, first + 3]


def check_after_fault(scenario: str, folder: Path) -> str:
    """verify passes and the store holds the old or the new version; returns which ("old", "new", "mixed")."""
    found, verified = contents(scenario, folder)
    assert verified == len(found)
    old, new = expected_old(), expected_new()
    if found == old:
        return "old"
    if found == new:
        return "new"
    # Qdrant Edge keeps each update the engine ran (its log is replayed): each document whole, old or new
    assert is_qdrant(scenario), f"{scenario}: the store holds neither the old nor the new version: {found}"
    for doc_id, content in found.items():
        assert content in (old.get(doc_id), new.get(doc_id)), doc_id
    return "mixed"


def check_rerun(scenario: str, folder: Path) -> None:
    write(scenario, folder)
    found, verified = contents(scenario, folder)
    assert found == expected_new() and verified == len(found)
    assert not files.staging_path(folder).exists(), "a staging folder was left behind"
    assert not files.old_path(folder).exists()
    leftovers = [p.name for p in folder.rglob("*.tmp")] + [p.name for p in folder.rglob("*.next")]
    # Qdrant Edge: no half-built segment of an optimize left in temp_segments/
    leftovers += [p.name for p in folder.rglob("segment_builder_*")]
    assert not leftovers, leftovers


@pytest.mark.slow
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_write_point_fails_in_one_line_and_loses_nothing(
    scenario: str, seeded: dict[str, Path], tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    if is_qdrant(scenario):
        pytest.importorskip("qdrant_client")
    prepare_modules(scenario)
    points = clean_points(seeded, scenario, tmp_path / "clean")
    injected = 0
    outcomes: dict[str, int] = {}
    for code in (errno.ENOSPC, errno.EIO):
        for at in range(1, points + 1):
            folder = fresh(seeded, scenario, tmp_path / "run")
            injector = Injector(fail_at=at, code=code)
            with armed(injector), pytest.raises(WriteError) as caught:
                write(scenario, folder)
            assert injector.fired, f"point {at} of {points} was never reached"
            message = str(caught.value)
            assert "\n" not in message and str(folder.parent) in message, message
            assert caught.value.reason in message
            # a staging folder is left only to be resumed, and the line says so; without a checkpoint it is removed
            staging = files.staging_path(folder)
            assert staging.exists() == (f"resumes from the last checkpoint in {staging}" in message), message
            assert not list(staging.glob("*.tmp")) if staging.exists() else True
            outcome = check_after_fault(scenario, folder)
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            if outcome == "new" and not is_qdrant(scenario):  # the line says what the store holds: never "unchanged"
                assert "unchanged" not in message, message
            check_rerun(scenario, folder)
            injected += 1
    INJECTED[scenario] = injected
    counted = f"{points} write points, {injected} failures injected (ENOSPC, EIO): {outcomes}"
    print(f"\n{scenario}: {counted}")
    assert injected == 2 * points
    record_property("fault_injection", counted)  # named in the run's summary (tests/conftest.py)
    # both outcomes occur: a point before the commit point keeps the old version, one after it gives the new
    assert outcomes.get("old", 0) + outcomes.get("mixed", 0) > 0


@pytest.mark.slow
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_a_writer_killed_at_each_write_point_leaves_old_or_new(
    scenario: str, seeded: dict[str, Path], tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    if is_qdrant(scenario):
        pytest.importorskip("qdrant_client")
    prepare_modules(scenario)
    labels = clean_run(seeded, scenario, tmp_path / "clean")
    points = len(labels)
    sample = list(range(1, points + 1))
    most = MAX_KILLS[scenario]
    if len(sample) > most:
        step = len(sample) / most
        sample = sorted({sample[int(i * step)] for i in range(most)} | {points})
    if scenario == "qdrant-segments":
        sample = sorted(set(sample) | set(commit_time_optimize(labels)))
    for at in sample:
        folder = fresh(seeded, scenario, tmp_path / "run")
        run = subprocess.run(
            [sys.executable, str(WORKER), scenario, str(folder), str(at)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=120,
        )
        assert run.returncode == KILLED, f"point {at}: exit {run.returncode}: {run.stdout} {run.stderr[-2000:]}"
        check_after_fault(scenario, folder)
        check_rerun(scenario, folder)
    print(f"\n{scenario}: killed at {len(sample)} of {points} write points")
    record_property("fault_injection", f"killed at {len(sample)} of {points} write points")
