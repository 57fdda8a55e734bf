"""The exit status every command ends with, decided here as values the CLI only passes on.

0: no error findings; 1: error findings (a draft that will not load as trained, a refused fix, a failed
measurement, two checkpoints that differ); 2: unusable input or arguments (`errors.UserError`).
"""

from __future__ import annotations

from .findings import ERROR, WARNING

EXIT_OK, EXIT_FINDINGS, EXIT_UNUSABLE = 0, 1, 2


def status(failed: bool) -> int:
    """EXIT_FINDINGS when the command's result failed, else EXIT_OK."""
    return EXIT_FINDINGS if failed else EXIT_OK


def check_status(findings, strict: bool = False) -> int:
    """`check`'s status from its findings: an error fails; with `strict` (a CI gate) a warning does too."""
    severities = {f.severity for f in findings}
    return status(ERROR in severities or strict and WARNING in severities)
