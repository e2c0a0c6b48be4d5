"""``benchmarks.store_checksums --json`` prints one JSON line per store size, with the small write's figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_store_checksums_prints_one_json_line_per_size(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.store_checksums", "--n", "600,900", "--json", "--tmp", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    rows = [json.loads(line) for line in run.stdout.splitlines()]
    assert [row["n"] for row in rows] == [600, 900]
    for row in rows:
        assert 0 < row["small_write_checksum_ms"] < row["small_write_ms"]
        assert row["verify_s"] > 0 and row["store_gb"] > 0
