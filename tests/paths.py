"""Where the tests find the repository's files, wherever in tests/ they sit."""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STACKS = REPO / "stacks"
DATA = REPO / "tests" / "data"  # test fixtures: upstream descriptors, schemas, stability fixtures, pickles
SHARED = REPO.parent / "shared"  # beside the checkout, here and in CI: third_party, charts, seeds
