"""The one writer of the benchmarks' marked sections: it replaces a section's text between its markers and nothing
else, the reader gets back what it wrote, and a missing section is one clear error (or, where the benchmark asks,
added after its neighbour or at the end)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.marked_sections import marked, write_marked

LOG = """# Benchmarks

intro

<!-- scale:start -->
old table
<!-- scale:end -->

<!-- speed:begin -->
old speed
<!-- speed:end -->

tail
"""


def test_a_section_is_replaced_between_its_markers_and_read_back(tmp_path: Path) -> None:
    log = tmp_path / "log.md"
    log.write_text(LOG, encoding="utf-8")
    write_marked(log, "scale", "| n | q/s |\n|---|---|\n| 10 | 5 |\n\n")
    write_marked(log, "speed", "new speed")
    assert log.read_text(encoding="utf-8") == LOG.replace("old table", "| n | q/s |\n|---|---|\n| 10 | 5 |").replace(
        "old speed", "new speed"
    )  # each section's own marker spelling kept, the rest untouched
    assert marked(log, "scale") == "| n | q/s |\n|---|---|\n| 10 | 5 |\n"
    write_marked(log, "scale", "again")  # a re-run replaces what the last one wrote
    assert marked(log, "scale") == "again\n" and marked(log, "speed") == "new speed\n"


def test_a_missing_section_is_one_clear_error_and_the_file_is_left_as_it_was(tmp_path: Path) -> None:
    log = tmp_path / "log.md"
    log.write_text(LOG, encoding="utf-8")
    with pytest.raises(SystemExit, match=r"log\.md: no section marked 'edge' \(<!-- edge:start --> \.\.\. "):
        write_marked(log, "edge", "text")
    with pytest.raises(SystemExit, match="no section marked 'scal'"):  # a prefix of a section's name is not it
        write_marked(log, "scal", "text")
    assert log.read_text(encoding="utf-8") == LOG
    with pytest.raises(SystemExit, match="no such file"):
        write_marked(tmp_path / "missing.md", "scale", "text")
    assert not (tmp_path / "missing.md").exists()


def test_a_section_asked_for_is_added_after_its_neighbour_or_at_the_end(tmp_path: Path) -> None:
    log = tmp_path / "log.md"
    log.write_text(LOG, encoding="utf-8")
    write_marked(log, "scale:edge", "edge table", add=True, after="scale")
    write_marked(log, "extra", "extra text", add=True, after="absent")
    text = log.read_text(encoding="utf-8")
    assert "<!-- scale:end -->\n\n<!-- scale:edge:begin -->\nedge table\n<!-- scale:edge:end -->\n\n<!-- speed" in text
    assert text.endswith("tail\n\n<!-- extra:begin -->\nextra text\n<!-- extra:end -->\n")
    assert marked(log, "scale") == "old table\n"  # the neighbour is kept as it was
    new = tmp_path / "new.md"
    write_marked(new, "gpu:cpu", "cpu table", add=True, title="# GPUs\n\n")
    assert new.read_text(encoding="utf-8") == "# GPUs\n\n<!-- gpu:cpu:begin -->\ncpu table\n<!-- gpu:cpu:end -->\n"
