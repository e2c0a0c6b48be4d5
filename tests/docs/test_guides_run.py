"""Every guide's code runs: its ```bash and ```python blocks, in order per page, in a folder holding the shipped
sample and tiny towers built offline; where a page shows output (a ```text block), that output is shown.

A block that cannot run here is marked in its page by an HTML comment right above it
(``<!-- not run: the reason -->``); at most ``MAX_NOT_RUN`` blocks of the site are.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import tomllib

from care_retriever.cli.main import main
from tests.support.data import REPO, SAMPLE_DIR
from tests.support.models import indexed_store
from tests.support.serve_process import ServeProcess, start_serve

DOCS = REPO / "docs"
GUIDES = [
    "getting-started/quickstart.md",
    "index-on-gpu.md",
    "serving.md",
    "haystack.md",
    "langchain.md",
    "training.md",
    "many-machines.md",
    "move-stores.md",
    "compressed-stores.md",
    "filters.md",
]
MAX_NOT_RUN = 4

# What a guide's words stand for here: hub ids become tiny towers built offline, GPU settings run on the CPU, the
# service's address is the port the test's server got. Applied to commands and to the output a page shows.
STAND_INS = {
    "--device cuda": "--device cpu",
    "--nproc-per-node 8": "--nproc-per-node 2",
    "over 8 processes": "over 2 processes",
    "localhost:8000": "{server}",
}

# Hub models a guide names, and the fixture (tests/conftest.py) that builds the tiny model standing in for each.
HUB_MODELS = {"PhilipGAQ/CARE-0.3B-4B": "tiny_model_dir"}

# Commands that install (checked, not run: each extra they name must be declared).
INSTALLS = ("pip install", "python3 -m venv", ".venv/bin/pip install")

FENCE = re.compile(r"(?:<!--\s*not run:\s*(?P<why>.*?)-->\s*\n)?^```(?P<lang>\w*)\n(?P<code>.*?)^```", re.M | re.S)


@dataclass
class Block:
    lang: str
    code: str
    not_run: str | None


def page_blocks(page: str) -> list[Block]:
    text = (DOCS / page).read_text("utf-8")
    return [Block(m["lang"], m["code"], m["why"]) for m in FENCE.finditer(text)]


def shell_commands(code: str) -> Iterator[str]:
    """The commands of a bash block: continuation lines joined, a heredoc kept with its command."""
    lines = code.splitlines()
    while lines:
        line = lines.pop(0)
        while line.endswith("\\") and lines:
            line = line[:-1] + " " + lines.pop(0).strip()
        heredoc = re.search(r"<<\s*'?(\w+)'?", line)
        if heredoc:
            body = []
            while lines and lines[0] != heredoc.group(1):
                body.append(lines.pop(0))
            lines.pop(0)
            line = "\n".join([line, *body, heredoc.group(1)])
        if line.strip() and not line.lstrip().startswith("#"):
            yield line


def shown(output: str, expected: str) -> str | None:
    """The first line of ``expected`` the output does not show, in order (``...`` stands for any text)."""
    lines = output.replace("\r", "\n").splitlines()
    at = 0
    for want in (line.strip() for line in expected.splitlines()):
        if not want:
            continue
        pattern = re.compile(".*?".join(re.escape(part) for part in want.split("...")))
        while at < len(lines) and not pattern.search(lines[at]):
            at += 1
        if at == len(lines):
            return want
        at += 1
    return None


def declared_extras() -> set[str]:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text("utf-8"))
    return set(pyproject["project"]["optional-dependencies"])


class PageRun:
    """One page's blocks run in ``folder``: the CLI in this process, the service and torchrun as processes."""

    def __init__(self, folder: Path, capfd: pytest.CaptureFixture[str], stand_ins: dict[str, str]) -> None:
        self.folder, self.capfd, self.stand_ins = folder, capfd, stand_ins
        self.namespace: dict[str, object] = {}
        self.server: ServeProcess | None = None

    def substitute(self, text: str) -> str:
        for words, stand_in in self.stand_ins.items():
            text = text.replace(words, stand_in)
        return text

    def run(self, block: Block) -> str:
        self.capfd.readouterr()
        if block.lang == "python":
            exec(compile(block.code, "guide", "exec"), self.namespace)  # the guide's own code
            captured = self.capfd.readouterr()
            return captured.out + captured.err
        return "".join(self.command(self.substitute(command)) for command in shell_commands(block.code))

    def command(self, line: str) -> str:
        if line.startswith(INSTALLS):
            extras = {e for group in re.findall(r"\[([\w,-]+)\]", line) for e in group.split(",")}
            assert extras <= declared_extras(), f"{line}: extras {extras - declared_extras()} not declared"
            return ""
        words = shlex.split(line, comments=True)
        if words[0] == "care-retriever" and words[1] == "serve":
            return self.serve(words[2:])
        if words[0] == "care-retriever":
            code = main(words[1:])
            captured = self.capfd.readouterr()
            assert code == 0, f"{line}\n{captured.err[-3000:]}"
            return captured.out + captured.err
        if words[0] == "torchrun":
            words = [sys.executable, "-m", "torch.distributed.run", *words[1:]]
            done = subprocess.run(words, cwd=self.folder, capture_output=True, text=True, timeout=300)
        else:
            done = subprocess.run(["bash", "-c", line], cwd=self.folder, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"{line}\n{done.stderr[-3000:]}"
        return done.stdout + done.stderr

    def serve(self, words: list[str]) -> str:
        options = dict(zip(words[::2], words[1::2], strict=True))
        model, store = options.pop("--model"), options.pop("--store")
        self.server = start_serve(Path(model), store, *[w for pair in options.items() for w in pair])
        self.stand_ins["{server}"] = f"{self.server.host}:{self.server.port}"
        return self.server.text()

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()


@pytest.fixture(scope="module")
def sample_store(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """The shipped sample indexed with the tiny model, once for every page (each page gets a copy)."""
    folder = tmp_path_factory.mktemp("guide-store")
    indexed_store(folder, tiny_model_dir, SAMPLE_DIR / "corpus.jsonl")
    return folder / "store"


def earlier_release_store(folder: Path, source: Path) -> None:
    """``source``'s documents written as the earlier release wrote ``qdrant:PATH``: qdrant-client's local mode."""
    from qdrant_client import QdrantClient

    from care_retriever.stores import open_store
    from care_retriever.stores.qdrant import QdrantStore

    client = QdrantClient(path=str(folder))
    store = QdrantStore(str(folder), client=client)
    with open_store(f"faiss:{source}") as faiss:
        manifest = faiss.require_manifest()
        store.prepare(manifest.dim, manifest.space_fingerprint, manifest.model_name)
        for batch in faiss.iter_stored(100):
            store.upsert(batch.documents, batch.vectors)
    store.enable_sparse()
    store.commit()
    client.close()


def test_every_guide_in_the_nav_is_run_and_few_blocks_are_marked_not_run() -> None:
    nav = (REPO / "mkdocs.yml").read_text("utf-8").split("nav:", 1)[1]
    guides = nav.split("- Guides:", 1)[1].split("- Reference:", 1)[0]
    assert set(re.findall(r":\s*(\S+\.md)", guides)) <= set(GUIDES)
    marked = [(page, b.not_run) for page in GUIDES for b in page_blocks(page) if b.not_run is not None]
    assert len(marked) <= MAX_NOT_RUN, marked


@pytest.mark.parametrize("page", GUIDES)
def test_the_guide_runs_and_shows_what_it_says(
    page: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    tiny_model_dir: Path,
    sample_store: Path,
    request: pytest.FixtureRequest,
) -> None:
    text = (DOCS / page).read_text("utf-8")
    # What a guide takes as given, put in its folder when the page names it.
    given: dict[str, Callable[[Path], object]] = {
        "corpus.jsonl": lambda to: shutil.copyfile(SAMPLE_DIR / "corpus.jsonl", to),
        "models/care": lambda to: shutil.copytree(tiny_model_dir, to),
        "stores/sample": lambda to: shutil.copytree(sample_store, to),
        "stores/old-qdrant": lambda to: earlier_release_store(to, sample_store),
    }
    for name, make in given.items():
        if name in text:
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            make(tmp_path / name)
    runnable = "".join(block.code for block in page_blocks(page) if block.not_run is None)
    stand_ins = {hub: str(request.getfixturevalue(fixture)) for hub, fixture in HUB_MODELS.items() if hub in runnable}
    stand_ins.update(STAND_INS)
    monkeypatch.chdir(tmp_path)
    run = PageRun(tmp_path, capfd, stand_ins)
    output = ""
    try:
        for block in page_blocks(page):
            if block.not_run is not None:
                continue
            if block.lang in ("bash", "python"):
                output = run.run(block)
            elif block.lang == "text":
                missing = shown(output, run.substitute(block.code))
                assert missing is None, f"{page}: the output does not show {missing!r}:\n{output[-3000:]}"
    finally:
        run.close()


def test_the_store_formats_page_names_every_manifest_field_and_store_file() -> None:
    from care_retriever.stores.faiss import DELTA, DOCSTORE, INDEX, MANIFEST, NEXT_INDEX, VECTORS
    from care_retriever.stores.manifest import MANIFEST_DIGEST, READABLE_FORMAT_VERSION, Manifest

    page = (DOCS / "reference" / "store-formats.md").read_text("utf-8")
    manifest = page.split("## The manifest", 1)[1].split("\n## ", 1)[0]
    for field in [*Manifest.__dataclass_fields__, MANIFEST_DIGEST]:
        assert f"`{field}`" in manifest, field
    for name in (MANIFEST, INDEX, DOCSTORE, DELTA, VECTORS, NEXT_INDEX):
        assert f"`DIR/{name}`" in page, name
    assert f"| FAISS {READABLE_FORMAT_VERSION} |" in page
