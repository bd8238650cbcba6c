"""Pure helpers: MPLBACKEND classification, tool-span rule, checkpoint_dir."""

from __future__ import annotations

from pathlib import Path

import pytest

import stallwatch_runner as sw


@pytest.mark.parametrize(
    "value,interactive",
    [
        (None, False),
        ("", False),
        ("Agg", False),
        ("agg", False),
        ("pdf", False),
        ("SVG", False),
        ("ps", False),
        ("cairo", False),
        ("template", False),
        ("module://matplotlib_inline.backend_inline", False),
        ("module://ipykernel.pylab.backend_inline", False),
        ("TkAgg", True),
        ("QtAgg", True),
        ("MacOSX", True),
        ("WebAgg", True),
        ("module://some.gui_backend", True),
    ],
)
def test_mpl_backend_classification(value, interactive):
    assert sw.mpl_backend_is_interactive(value) is interactive


def test_check_mpl_backend_warns(monkeypatch):
    monkeypatch.setenv("MPLBACKEND", "GTK4Agg")
    with pytest.warns(sw.InteractiveBackendWarning, match="GTK4Agg"):
        assert sw.check_mpl_backend() is True
    monkeypatch.setenv("MPLBACKEND", "Agg")
    assert sw.check_mpl_backend() is False


@pytest.mark.parametrize(
    "attrs,expected",
    [
        ({"gen_ai.operation.name": "execute_tool"}, True),
        ({"mcp.method.name": "tools/call"}, True),
        ({"gen_ai.operation.name": "chat"}, False),
        ({"mcp.method.name": "tools/list"}, False),
        ({}, False),
        (None, False),
    ],
)
def test_tool_span_rule(attrs, expected):
    assert sw.is_tool_span(attrs) is expected


def test_checkpoint_dir(monkeypatch, tmp_path):
    monkeypatch.delenv("STALLWATCH_CHECKPOINT_DIR", raising=False)
    assert sw.checkpoint_dir() is None
    monkeypatch.setenv("STALLWATCH_CHECKPOINT_DIR", "")
    assert sw.checkpoint_dir() is None
    monkeypatch.setenv("STALLWATCH_CHECKPOINT_DIR", str(tmp_path))
    assert sw.checkpoint_dir() == Path(tmp_path)
