"""Exit codes and the one error type. The handler that turns them into a one-line message is
error_handler.py (the CLI's; the plugin imports this module in every SGLang process)."""

from __future__ import annotations


class Exit:
    """Documented exit codes (README, 'Exit codes'). Never renumber: CI gates depend on them.

    Plain ``int`` constants, not an ``enum.IntEnum``: building the enum class was half of this
    module's import (0.27 ms on the CI-class machine), and the plugin imports it in every SGLang
    process (docs/plugin.md, "Cost"). Nothing here needs an enum's names or iteration.
    """

    OK = 0
    VULNERABLE = 1  # the kernel is the racy variant
    USAGE = 2  # bad flags (argparse) or a bad flag combination
    UNKNOWN = 3  # kernel not recognised, drifted from its release, or preconditions violated
    NOT_APPLICABLE = 4  # the tree has no DeepSeek-V4 planner (SGLang <= 0.5.11)
    STALE_BUILD = 5  # tree fixed, but a racy JIT build is still in the cache
    REFUSED = 6  # apply/revert/clear-cache refused to touch something; nothing changed
    NOT_FOUND = 7  # no SGLang tree or kernel where one was named
    REPRO_FAILED = 8  # the GPU harness saw a bad plan or a hazard on a fixed variant
    ENVIRONMENT = 9  # a required tool is missing (GPU, nvcc, compute-sanitizer)
    FINDINGS = 10  # scan-logs found failure signatures
    WRONG_VARIANT = 11  # fixed, but not the variant --require-variant asks for
    INTERNAL = 70  # a bug in sglang-dsv4-fix: please report it
    INTERRUPTED = 130  # Ctrl-C


class FatalError(Exception):
    """An expected failure: one line for the operator and the exit code that classifies it."""

    def __init__(self, message: str, code: int = Exit.REFUSED) -> None:
        super().__init__(message)
        self.code = code
