"""The plugin contract (`hooks.Backend`): options declared once, as `OPTIONS` and
`EXAMPLE`, checked by `Backend.__init__` into `settings`; the names of earlier lox
releases refused where a class defines them, each with what to implement instead."""

import re

import pytest

from lox_backends import hooks
from lox_backends.parquet import ParquetBackend
from lox_backends.plugin.config import Option


class Every(hooks.Backend):
    OPTIONS = {
        "every": Option("write every n-th batch", "int", 1, minimum=1),
        "mode": Option("how to write", "choice", "append", choices=("append", "replace")),
        "label": Option("a label for the files"),
    }
    EXAMPLE = "every:runs?every=10"


def refused(exception, message):
    """`pytest.raises` of exactly `message`."""
    return pytest.raises(exception, match=f"^{re.escape(message)}$")


# --- OPTIONS, EXAMPLE and settings ----------------------------------------------------------------
def test_settings_hold_the_typed_values_and_the_defaults_of_the_options_not_given():
    backend = Every("runs", {"every": "10", "mode": "REPLACE"})
    assert backend.settings == {"every": 10, "mode": "replace", "label": None}
    assert backend.options == {"every": "10", "mode": "REPLACE"}  # as given, as strings
    assert backend.target == "runs"
    assert Every().settings == {"every": 1, "mode": "append", "label": None}


def test_an_unknown_option_is_refused_naming_the_close_one_and_the_example():
    listed = ("every (write every n-th batch: an integer >= 1; default 1); mode (how to write: one of append, "
              "replace; default append); label (a label for the files)")
    with refused(ValueError, f"the every backend has no option 'evry'; did you mean 'every'? Its options are: "
                             f"{listed}. E.g. 'every:runs?every=10'."):
        Every("runs", {"evry": "10"})
    with refused(ValueError, f"the every backend has no option 'colour'; its options are: {listed}. "
                             "E.g. 'every:runs?every=10'."):
        Every("runs", {"colour": "red"})


def test_a_value_of_the_wrong_type_or_range_is_refused_saying_what_is_allowed():
    with refused(ValueError, "the every backend's option every='ten' is refused: it must be an integer >= 1 "
                             "(write every n-th batch). E.g. 'every:runs?every=10'."):
        Every("runs", {"every": "ten"})
    with refused(ValueError, "the every backend's option every='0' is refused: it must be an integer >= 1 "
                             "(write every n-th batch). E.g. 'every:runs?every=10'."):
        Every("runs", {"every": "0"})
    with refused(ValueError, "the every backend's option mode='both' is refused: it must be one of append, replace "
                             "(how to write). E.g. 'every:runs?every=10'."):
        Every("runs", {"mode": "both"})


def test_a_backend_without_options_refuses_any_and_one_without_example_is_named_by_its_class():
    class Quiet(hooks.Backend):
        EXAMPLE = "quiet:out"

    assert Quiet("out").settings == {}
    with refused(ValueError, "the quiet backend has no options (got 'verbose'). E.g. 'quiet:out'."):
        Quiet("out", {"verbose": "1"})

    class Plain(hooks.Backend):
        pass

    with pytest.raises(ValueError, match=r"^the Plain backend has no options \(got 'x'\)\. \(To the author of "):
        Plain(None, {"x": "1"})


def test_a_subclass_adds_options_to_its_parents():
    class Tagged(Every):
        OPTIONS = {"tag": Option("a tag"), **Every.OPTIONS}
        EXAMPLE = "tagged:runs?tag=a&every=2"

    assert Tagged("runs", {"tag": "a", "every": "2"}).settings == {"tag": "a", "every": 2, "mode": "append",
                                                                   "label": None}
    with pytest.raises(ValueError, match=r"^the tagged backend has no option 'tga'; did you mean 'tag'\?"):
        Tagged("runs", {"tga": "a"})
    assert Every("runs", {"every": "2"}).settings["every"] == 2  # the parent's own stay as they were


def test_the_builtin_backends_declare_their_options_so():
    backend = ParquetBackend(None, {"compression": "zstd"})  # not created on disk before the first write
    assert backend.settings["compression"] == "zstd" and backend.settings["rows_per_file"] == 262144
    with pytest.raises(ValueError, match=r"^the parquet backend has no option 'compresion'; did you mean "
                                         r"'compression'\? Its options are: compression \("):
        ParquetBackend(None, {"compresion": "zstd"})


def test_options_and_example_are_checked_where_the_class_is_defined():
    with refused(TypeError, "lox backend Texts's OPTIONS maps each option's name to a lox_backends.plugin.config."
                            "Option, got {'every': 'write every n-th batch'}; e.g. OPTIONS = {'every': Option('write "
                            "every n-th batch', 'int', 1, minimum=1)}."):

        class Texts(hooks.Backend):
            OPTIONS = {"every": "write every n-th batch"}  # options_help's shape

    with refused(TypeError, "lox backend Stale's EXAMPLE 'stale?evry=2' uses 'evry', which its OPTIONS does not "
                            "declare."):

        class Stale(hooks.Backend):
            OPTIONS = {"every": Option("write every n-th batch", "int", 1)}
            EXAMPLE = "stale?evry=2"

    with refused(TypeError, "lox backend Two's EXAMPLE 'two,console' names 2 backends, not one."):

        class Two(hooks.Backend):
            EXAMPLE = "two,console"

    with refused(TypeError, "lox backend Digit's EXAMPLE is not a config string: invalid lox config: a backend name "
                            "must start with a letter, at character 1:\n    9lives\n    ^"):

        class Digit(hooks.Backend):
            EXAMPLE = "9lives"


# --- names of earlier releases ---------------------------------------------------------------------
WRITE_TABLES = ("implement `write(self, run, table)`, which receives spooled batches and tapped events alike as "
                "Arrow tables (`lox.logdict.from_arrow(table)` gives a logdict back). See plugins.md.")
DECLARE = ("declare `OPTIONS = {{name: Option(help, ...){inherited}}}` (lox_backends.plugin.config.Option) and "
           "`EXAMPLE`, a config string that uses them: `Backend.__init__` checks the options given and keeps their "
           "values in `self.settings`. See plugins.md.")


def test_write_batch_is_refused_naming_write():
    with refused(TypeError, "lox backend Old defines `write_batch`, which lox no longer uses: implement "
                            "`write(self, run, table)` (the same arguments). See plugins.md."):

        class Old(hooks.Backend):
            def write_batch(self, run, table):
                pass


def test_a_subclass_of_a_builtin_backend_written_for_write_batch_is_refused():
    with refused(TypeError, "lox backend Tagged defines `write_batch`, which lox no longer uses: implement "
                            "`write(self, run, table)` (the same arguments). See plugins.md."):

        class Tagged(ParquetBackend):  # as written for lox 0.1
            def write_batch(self, run, table):
                super().write_batch(run, table)


@pytest.mark.parametrize("old", ["write_event", "write_events"])
def test_backends_of_logdict_events_are_refused_naming_write(old):
    def method(self, run, events):
        pass

    with refused(TypeError, f"lox backend EventsOnly defines `{old}`, which lox no longer uses: {WRITE_TABLES}"):
        type("EventsOnly", (hooks.Backend,), {old: method})


@pytest.mark.parametrize("old", ["options_help", "option_specs"])
def test_options_declared_the_old_way_are_refused_naming_options_and_example(old):
    with refused(TypeError, f"lox backend Mine defines `{old}`, which lox no longer uses: "
                            + DECLARE.format(inherited="")):
        type("Mine", (hooks.Backend,), {old: {"every": "write every n-th batch"}})
    # Below a class with options (a tracker below TrackerBackend), the message shows how to keep its parent's.
    with refused(TypeError, f"lox backend Mine defines `{old}`, which lox no longer uses: "
                            + DECLARE.format(inherited=", **Every.OPTIONS")):
        type("Mine", (Every,), {old: {"project": "the project runs go to"}})


def test_example_in_lower_case_is_refused_naming_example():
    with refused(TypeError, "lox backend Mine defines `example`, which lox no longer uses: name it `EXAMPLE` (a "
                            "config string that uses the backend's options). See plugins.md."):

        class Mine(hooks.Backend):
            example = "mine:runs"


def test_a_backend_calling_check_options_learns_what_replaced_it():
    class Mine(hooks.Backend):  # as plugins.md taught before: the call fails when the backend is made
        def __init__(self, target=None, options=None):
            super().__init__(target, options)
            self.check_options("mine", {"every": "write every n-th batch"}, "mine:runs?every=10")

    with refused(AttributeError, "lox backend Mine uses `check_options`, which lox no longer has: "
                                 + DECLARE.format(inherited="")):
        Mine("runs")
    with refused(TypeError, "lox backend Override defines `check_options`, which lox no longer uses: "
                            + DECLARE.format(inherited="")):

        class Override(hooks.Backend):
            def check_options(self, *args):
                pass

    assert not hasattr(hooks.Backend, "check_options") and not hasattr(Every(), "check_options")
    with refused(AttributeError, "'Every' object has no attribute 'colour'"):
        Every().colour  # noqa: B018 - other missing attributes fail as usual


def test_a_backend_that_also_keeps_the_old_name_for_older_lox_releases_works():
    class Both(hooks.Backend):  # a plugin that supports lox 0.1 and this lox
        OPTIONS = {"every": Option("write every n-th batch", "int", 1)}
        options_help = {"every": "write every n-th batch"}

        def write(self, run, table):
            self.rows = table.num_rows

        write_batch = write

    assert Both(None, {"every": "3"}).settings == {"every": 3}


# --- the contract's public module name ------------------------------------------------------------
def test_a_plugin_written_as_import_lox_backends_hooks_still_loads():
    """`lox_backends.hooks` is the module earlier releases documented (its own docstring
    said ``import lox_backends.hooks as hooks``): importing it by that name still works,
    and gives the contract itself, in a fresh interpreter as a plugin module sees it."""
    import subprocess
    import sys

    code = ("import lox_backends.hooks as old\n"
            "from lox_backends.hooks import Backend, BackendSpec, hookimpl\n"
            "from lox_backends.plugin import hooks\n"
            "assert old is hooks and Backend is hooks.Backend and BackendSpec is hooks.BackendSpec\n"
            "assert hookimpl is hooks.hookimpl\n"
            "print('ok')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr


def test_a_plugin_that_reads_its_options_itself_learns_to_declare_them():
    class Free(hooks.Backend):  # lox 0.2 let a backend read self.options as it liked
        def write(self, run, table):
            self.every = int(self.options.get("n", 1))

    told = (r"^the Free backend has no options \(got 'n'\)\. \(To the author of .*Free: a backend declares the "
            r"options it takes as OPTIONS = \{name: Option\(\.\.\.\)\} and reads them from self\.settings; "
            r"see plugins\.md\.\)$")
    with pytest.raises(ValueError, match=told):
        Free("x", {"n": "3"})
    from lox_backends.memory import MemoryBackend

    with pytest.raises(ValueError, match=r"^the memory backend has no options \(got 'n'\)\. E\.g\. 'memory'\.$"):
        MemoryBackend(None, {"n": "3"})  # lox's own: no word to an author
