"""One exception type for every bad input, so entry points can print one clear line and exit."""

from __future__ import annotations

from os import PathLike


class ElmolabError(Exception):
    """A problem with the user's input: names the file (and line) and what is wrong.

    ``str(error)`` is the line a user sees, e.g. ``data/x.conllu:12: expected 10 columns, got 9``.
    """

    def __init__(
        self, problem: str, path: str | PathLike[str] | None = None, line: int | None = None
    ) -> None:
        self.problem = problem
        self.path = None if path is None else str(path)
        self.line = line
        where = ""
        if self.path is not None:
            where = self.path if line is None else f"{self.path}:{line}"
            where += ": "
        super().__init__(where + problem)

    def __reduce__(self) -> tuple:
        # Rebuilt with its fields when it crosses a process boundary (probe workers).
        return (type(self), (self.problem, self.path, self.line))
