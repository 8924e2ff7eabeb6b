"""Where things are, for tests at any depth of tests/."""

import pathlib

REPO = pathlib.Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "support" / "data"  # files written by earlier lox releases
