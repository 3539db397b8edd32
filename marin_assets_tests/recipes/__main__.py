"""``python -m marin_assets_tests.recipes [CATALOG]``: the recipe status table with fixture coverage.

The product's ``marin-assets status --recipes`` cannot know which sources the test suite covers (it
never imports the tests); this prints the same table with the fixture registry's answer.
"""

from __future__ import annotations

import sys

from marin_assets.core.ingest.recipes import format_status
from marin_assets_tests.recipes import covered_sources


def main(argv: list[str]) -> int:
    print(format_status(argv[0] if argv else None, covered=covered_sources()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
