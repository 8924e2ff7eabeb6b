"""Config strings: the grammar, the errors that point at the offending character, secrets."""

import re

import pytest

from lox_backends.plugin.config import BackendConfig, ConfigError, Option, mask_secrets, parse


def test_specs_with_targets_and_options():
    configs = parse("console,parquet:runs, mlflow:http://127.0.0.1:5000?experiment=demo,wandb?project=demo&mode=offline")
    assert configs == [
        BackendConfig("console"),
        BackendConfig("parquet", "runs"),
        BackendConfig("mlflow", "http://127.0.0.1:5000", {"experiment": "demo"}),
        BackendConfig("wandb", None, {"project": "demo", "mode": "offline"}),
    ]


def test_option_values_are_url_decoded_and_round_trip():
    (config,) = parse("neptune:team/proj?name=my%20run&tags=a%2Cb&empty=")
    assert config.target == "team/proj"
    assert config.options == {"name": "my run", "tags": "a,b", "empty": ""}
    assert parse(str(config)) == [config]


@pytest.mark.parametrize(
    "text, reason, column",
    [
        ("console,,parquet:runs", "an empty backend spec", 8),
        ("console,", "an empty backend spec", 8),
        ("parquet:", "has ':' but no target", 8),
        ("9lives", "must start with a letter", 0),
        ("console x", "unexpected ' ' after backend name 'console'", 7),
        ("wandb?project", "option 'project' of backend 'wandb' is not key=value", 6),
        ("wandb?", "has '?' but no options", 6),
        ("wandb?a=1&a=2", "option 'a' of backend 'wandb' is given twice", 10),
        ("wandb?a=1&=2", "option '=2' of backend 'wandb' is not key=value", 10),
    ],
)
def test_malformed_specs_point_at_the_offending_character(text, reason, column):
    with pytest.raises(ConfigError, match=re.escape(reason)) as info:
        parse(text)
    message = str(info.value)
    assert f"at character {column + 1}" in message
    shown, caret = message.splitlines()[-2:]
    assert shown == "    " + text
    assert caret == "    " + " " * column + "^"


def test_secrets_never_appear_in_reprs_or_errors():
    text = "mlflow:https://bob:hunter2@tracking.example/?experiment=x&token=abc123&api_key=zzz"
    (config,) = parse(text)
    assert config.options["token"] == "abc123"  # the backend gets the real value
    for shown in (repr(config), mask_secrets(text)):
        assert "hunter2" not in shown and "abc123" not in shown and "zzz" not in shown
        assert "bob" in shown and "experiment=x" in shown
    with pytest.raises(ConfigError) as info:
        parse(text + ",,")
    assert "hunter2" not in str(info.value) and "abc123" not in str(info.value)


def test_more_secret_spellings_and_passwords_containing_at_signs():
    text = "x:https://bob:p@ss@host/?key=k1&pwd=p2&access_key=k3&bearer=b4&project=visible"
    shown = mask_secrets(text)
    for secret in ("p@ss", "k1", "p2", "k3", "b4"):
        assert secret not in shown
    assert "bob:****@host" in shown and "project=visible" in shown


def test_config_must_be_a_string():
    with pytest.raises(TypeError, match="must be a str, got list"):
        parse(["console"])


@pytest.mark.parametrize("declared, message", [
    (dict(kind="integer", default=1),
     "an Option's kind is one of text, int, float, flag, choice; got 'integer' (for 'h')."),
    (dict(kind="choice"), "an Option of kind 'choice' takes its `choices`, and only such an Option does (for 'h': "
                          "kind 'choice', choices ())."),
    (dict(kind="int", choices=("a",)), "an Option of kind 'choice' takes its `choices`, and only such an Option "
                                       "does (for 'h': kind 'int', choices ('a',))."),
    (dict(kind="int", default="x"), "the default 'x' of an Option of kind 'int' is not an integer (for 'h')."),
    (dict(kind="flag", default=1), "the default 1 of an Option of kind 'flag' is not 1, true, yes, on or 0, false, "
                                   "no, off (for 'h')."),
    (dict(kind="choice", choices=("a", "b"), default="c"), "the default 'c' of an Option of kind 'choice' is not "
                                                           "one of a, b (for 'h')."),
])
def test_an_option_declared_wrongly_is_refused_where_it_is_declared(declared, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        Option("h", **declared)


def test_options_declared_rightly_are_taken():
    assert Option("h", "float", 1).default == 1 and Option("h", "int", None).default is None
    assert Option("h", "choice", "A", choices=("a", "b")).default == "A"
