"""The one registry form: register (call or decorator), get, names; duplicates refused in one
line; an unknown name lists the valid ones; built-in modules imported on the first look-up."""

import sys
import types

import pytest

from mgrpo.registry import Registry


def test_register_get_names_and_decorator():
    reg: Registry[object] = Registry("widget")
    one = reg.register("one", 1)

    @reg.register("fn")
    def fn():
        return "x"

    assert one == 1 and reg.get("one") == 1 and reg.get("fn") is fn
    assert reg.names() == ["fn", "one"] and "fn" in reg and "two" not in reg


def test_a_different_entry_under_a_taken_name_is_refused_and_the_same_one_is_not():
    reg: Registry[object] = Registry("widget")

    def a():
        pass

    def b():
        pass

    reg.register("a", a)
    reg.register("a", a)  # a module imported twice
    with pytest.raises(ValueError) as err:
        reg.register("a", b)
    message = str(err.value)
    assert "\n" not in message and "widget 'a' is already registered" in message
    assert reg.get("a") is a


def test_unknown_name_lists_the_valid_ones_and_the_hint():
    reg: Registry[int] = Registry("widget", hint="register_widget in a plug-in")
    reg.register("b", 2)
    reg.register("a", 1)
    with pytest.raises(ValueError, match=r"unknown widget 'c'; valid: a, b \(register_widget"):
        reg.get("c")
    with pytest.raises(ValueError, match="non-empty name"):
        reg.register("", 3)


def test_builtins_are_imported_on_first_lookup_only(monkeypatch):
    reg: Registry[int] = Registry("widget", builtins=("fake_widgets_mod",))
    module = types.ModuleType("fake_widgets_mod")
    loaded = []

    def load(name):
        loaded.append(name)
        reg.register("builtin", 7)
        return module

    monkeypatch.setattr("importlib.import_module", load)
    assert loaded == []
    assert reg.get("builtin") == 7 and reg.names() == ["builtin"]
    assert loaded == ["fake_widgets_mod"]
    assert "fake_widgets_mod" not in sys.modules
