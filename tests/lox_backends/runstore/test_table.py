"""The table of runs (lox_backends/runstore/table.py): its columns, and the names a summary value may not take."""

import pytest

from lox_backends.runstore.table import check_summary_name, flatten


def test_metadata_is_flattened_with_dots_and_leaves_lists_and_empty_dicts_whole():
    metadata = {"lr": 0.1, "config": {"model": {"width": 64, "depth": 2}, "opt": "adam"}, "tags": ["a"], "e": {}}
    assert dict(flatten(metadata)) == {"lr": 0.1, "config.model.width": 64, "config.model.depth": 2,
                                       "config.opt": "adam", "tags": ["a"], "e": {}}


@pytest.mark.parametrize(("name", "words"), [
    ("status", "a column of every run"),
    ("config.lr", "a metadata key of a run of this logger"),
    ("loss.min", "the column of a key's min"),
    ("train/acc.count", "the column of a key's count"),
])
def test_a_summary_name_that_clashes_with_a_column_is_refused_naming_it(name, words):
    with pytest.raises(ValueError) as raised:
        check_summary_name(name, {"config.lr"})
    assert f"the name {name!r}" in str(raised.value) and words in str(raised.value)


@pytest.mark.parametrize("name", ["best_acc", "loss.best", "final", "lr.min_seen"])
def test_other_names_are_summary_values(name):
    check_summary_name(name, {"config.lr"})


@pytest.mark.parametrize("name", ["", 3, None])
def test_a_name_that_is_no_string_is_refused(name):
    with pytest.raises(TypeError, match="non-empty strings"):
        check_summary_name(name, set())
