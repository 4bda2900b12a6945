"""The shared input helpers (``ftplan.inputs``): YAML alias bombs, deep nesting, NaN in JSON, odd
bytes and characters (issue 16, item 10)."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftplan.errors import ConfigError, MeasurementError
from ftplan.inputs import (
    bad_characters,
    check_finite,
    check_text,
    load_json_text,
    load_yaml_text,
    nesting_depth,
    read_text_file,
)

BILLION_LAUGHS = "\n".join(["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
                           + [f"{chr(98 + i)}: &{chr(98 + i)} [" + ", ".join([f"*{chr(97 + i)}"] * 9) + "]"
                              for i in range(8)] + ["z: *i"])


def test_yaml_alias_bomb_is_refused_at_once():
    pytest.importorskip("yaml")
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match="anchors and aliases"):
        load_yaml_text(BILLION_LAUGHS, "matrix.yaml")
    assert time.perf_counter() - t0 < 10.0  # a hang guard (expanding the bomb would never finish)


@pytest.mark.parametrize("text, words", [
    ("a: [" * 200 + "]" * 200, "nested"),
    ("a: b: c", "not valid YAML"),
    ("!!python/object/apply:os.system ['id']", "not valid YAML"),
    ("jobs:\n\t- x", "not valid YAML"),
])
def test_yaml_errors_are_one_line(text, words):
    pytest.importorskip("yaml")
    with pytest.raises(ConfigError, match=words) as e:
        load_yaml_text(text, "m.yaml")
    assert "\n" not in e.value.one_line()


def test_yaml_error_class_is_the_callers():
    pytest.importorskip("yaml")
    with pytest.raises(MeasurementError):
        load_yaml_text("a: &x 1\nb: *x", "m.yaml", error=MeasurementError)
    assert load_yaml_text("jobs:\n  - {method: lora, seq_len: 512}\n", "m.yaml") == {
        "jobs": [{"method": "lora", "seq_len": 512}]}


@pytest.mark.parametrize("text, words", [
    ("[NaN]", "NaN is not a JSON number"),
    ('{"a": Infinity}', "Infinity is not a JSON number"),
    ("[" * 100_000, "nested too deeply"),
    ("[" * 100 + "]" * 100, "nested deeper than"),
    ("{", "not JSON"),
    ("1" * 5000, "not JSON"),  # beyond Python's int digit limit
])
def test_json_errors(text, words):
    with pytest.raises(ConfigError, match=words):
        load_json_text(text, "x.json")


def test_read_text_file(tmp_path):
    p = tmp_path / "f.txt"
    p.write_bytes(b"\xef\xbb\xbfhello\n")
    assert read_text_file(p, "file") == "hello\n"
    p.write_bytes(b"a\nb\x00c")
    with pytest.raises(ConfigError, match="line 2: NUL byte"):
        read_text_file(p, "file")
    p.write_bytes(b"ok\n\xff")
    with pytest.raises(ConfigError, match="line 2: not UTF-8"):
        read_text_file(p, "file")
    p.write_bytes(b"x" * 101)
    with pytest.raises(ConfigError, match="at most"):
        read_text_file(p, "file", max_bytes=100)
    with pytest.raises(ConfigError, match="no such file"):
        read_text_file(tmp_path / "missing", "file")
    with pytest.raises(ConfigError, match="not a file"):
        read_text_file(tmp_path, "file")
    with pytest.raises(ConfigError):
        read_text_file(str(tmp_path / "a\x00b"), "file")
    with pytest.raises(ConfigError):
        read_text_file(str(tmp_path / ("n" * 300)), "file")


@pytest.mark.parametrize("value, ok", [
    ("trl-lib/Capybara", True), ("données €", True), ("a b", True), ("", False), ("a\tb", False),
    ("a\rb", False), ("a\x85b", False), ("a\u2028b", False), ("a\u202eb", False), ("a\ufeffb", False),
    ("\ud800", False), ("x" * 5000, False), (5, False), (None, False),
])
def test_check_text(value, ok):
    if ok:
        assert check_text(value, "name") == value
    else:
        with pytest.raises(ConfigError):
            check_text(value, "name")


@pytest.mark.parametrize("value, kw, ok", [
    (1.5, {}, True), (float("nan"), {}, False), (float("inf"), {}, False), (True, {}, False), ("1", {}, False),
    (10**400, {"maximum": 10}, False), (2.0, {"integer": True}, False), (0, {"minimum": 0, "exclusive_minimum": True},
                                                                          False),
])
def test_check_finite(value, kw, ok):
    problems: list[str] = []
    assert check_finite(value, "x", problems=problems, **kw) is ok
    assert (not problems) is ok
    if not ok:
        assert len(problems[0]) < 200  # a 400-digit integer is not printed whole


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.text(alphabet=st.characters(codec=None, exclude_categories=())))
def test_bad_characters_agree_with_check_text(text):
    if not text or len(text) > 4096:
        return
    if bad_characters(text):
        with pytest.raises(ConfigError):
            check_text(text, "t")
    else:
        assert check_text(text, "t") == text


def test_nesting_depth_is_iterative():
    deep: list = []
    node = deep
    for _ in range(50_000):
        node.append([])
        node = node[0]
    assert nesting_depth(deep, limit=64) == 65
    assert nesting_depth({"a": [1, {"b": 2}]}) == 3
