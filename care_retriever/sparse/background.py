"""Tokenising the BM25 side in a child process while the document tower encodes.

The index writer's chunk goes to the document tower (a GPU, or torch's own threads) and its BM25
tokens are needed only when the chunk is written. jieba is pure Python: in a thread it holds the
interpreter lock and would stall the thread that launches the tower's kernels, so the tokens are
computed in a separate interpreter instead (``python -m care_retriever.sparse.background``, started
once per write), one chunk ahead of the write that inserts them. Only the tokens come back: the
postings are still inserted by the writer, in the transaction that writes the chunk's documents, so
what a killed run leaves behind is unchanged.

A child that cannot start or dies is not an error: the chunk is tokenised in this process, as it
would be without a background tokenizer, and that is said once.
"""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
import threading
from typing import Any, BinaryIO

logger = logging.getLogger("care_retriever")


class BackgroundTokenizer:
    """``submit(texts)`` starts tokenising in the child; ``result()`` returns the tokens of that submit.

    One request is in flight at a time. Use as a context manager (or call :meth:`close`): the child
    exits when its input closes.
    """

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._pending: list[str] | None = None
        self._sender: threading.Thread | None = None
        self._send_error: OSError | None = None
        self._failed = False

    @property
    def child_pid(self) -> int | None:
        """The tokenising child's process id; None before the first submit, or once tokenising here."""
        return self._proc.pid if self._proc is not None else None

    def _start(self) -> subprocess.Popen[bytes] | None:
        if self._proc is None and not self._failed:
            try:
                self._proc = subprocess.Popen(
                    [sys.executable, "-m", "care_retriever.sparse.background"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    env={**os.environ, "OMP_NUM_THREADS": "1"},  # it runs no torch; keep it off the tower's cores
                )
            except OSError as exc:
                self._fall_back(f"could not start ({exc})")
        return self._proc

    def _fall_back(self, why: str) -> None:
        if not self._failed:
            logger.warning("BM25 tokenizer process %s; tokenising in this process instead", why)
        self._failed = True
        self.close()

    def submit(self, texts: list[str]) -> None:
        """Hand ``texts`` to the child and return at once (a pipe holds 64 KiB: a chunk is written by a thread,
        which waits while the child starts, and releases the interpreter lock while it waits)."""
        if self._pending is not None:
            raise RuntimeError("BackgroundTokenizer: result() of the previous submit was not read")
        self._pending = texts
        proc = self._start()
        if proc is None:
            return
        request = pickle.dumps(texts, protocol=pickle.HIGHEST_PROTOCOL)
        self._send_error = None
        self._sender = threading.Thread(target=self._send, args=(proc, request), daemon=True)
        self._sender.start()

    def _send(self, proc: subprocess.Popen[bytes], request: bytes) -> None:
        assert proc.stdin is not None
        try:
            proc.stdin.write(request)
            proc.stdin.flush()
        except (OSError, ValueError) as exc:  # BrokenPipeError: the child died; ValueError: closed meanwhile
            self._send_error = OSError(str(exc))

    def result(self) -> list[list[str]]:
        texts, self._pending = self._pending, None
        if texts is None:
            raise RuntimeError("BackgroundTokenizer: result() without submit()")
        if self._sender is not None:
            self._sender.join()
            self._sender = None
        error, self._send_error = self._send_error, None
        if error is not None:
            self._fall_back(f"stopped ({error})")
        if self._proc is not None:
            assert self._proc.stdout is not None
            try:
                tokens: Any = pickle.load(self._proc.stdout)
            except (EOFError, OSError, pickle.UnpicklingError) as exc:
                self._fall_back(f"stopped ({type(exc).__name__})")
            else:
                if isinstance(tokens, list) and len(tokens) == len(texts):
                    return tokens
                self._fall_back("answered out of step")
        from care_retriever.sparse.tokenizer import tokenize

        return tokenize(texts)

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if self._pending is not None:  # a chunk nobody will read (the write failed): stop at once
            proc.kill()
        for stream in (proc.stdin, proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if self._sender is not None:
            self._sender.join()
            self._sender = None

    def __enter__(self) -> BackgroundTokenizer:
        self._start()  # the child starts (and loads jieba's dictionary) while the caller prepares
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _serve(requests: BinaryIO, answers: BinaryIO) -> None:
    from care_retriever.sparse.tokenizer import _jieba, tokenize

    _jieba()  # before the first chunk arrives
    while True:
        try:
            texts = pickle.load(requests)
        except EOFError:
            return
        pickle.dump(tokenize(texts), answers, protocol=pickle.HIGHEST_PROTOCOL)
        answers.flush()


if __name__ == "__main__":
    # The answers go to the original stdout; anything a library prints goes to stderr instead.
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    _serve(sys.stdin.buffer, answers)
