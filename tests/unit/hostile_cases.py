"""Every hostile-input case, for ``hostile_harness`` and the tests: TrainJob inputs, patches, component options, CLI.

``CASES`` run through render, the launcher, the component and the CLI; ``COMPONENT_CASES``
through the component only; ``CLI_CASES`` are command lines of their own.
"""

from __future__ import annotations

from hostile_common import AWS_ID, AWS_KEY, BASE, CANARIES, HF, Case, CliCase
from hostile_entry_cases import CLI_CASES, COMPONENT_CASES
from hostile_input_cases import INPUT_CASES
from hostile_malformed_cases import MALFORMED_CASES, MALFORMED_CLI_CASES, MALFORMED_COMPONENT_CASES
from hostile_patch_cases import PATCH_CASES

CASES: list[Case] = INPUT_CASES + PATCH_CASES + MALFORMED_CASES
CLI_CASES = CLI_CASES + MALFORMED_CLI_CASES
COMPONENT_CASES = COMPONENT_CASES + MALFORMED_COMPONENT_CASES

__all__ = ["AWS_ID", "AWS_KEY", "BASE", "CANARIES", "CASES", "CLI_CASES", "COMPONENT_CASES", "HF", "Case", "CliCase"]
