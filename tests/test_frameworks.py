"""mirrorfit._frameworks: what every layer may ask about the frameworks before one starts."""

from __future__ import annotations

from mirrorfit._frameworks import hidden_startup_line, install_hint, installed


def test_startup_lines_are_dropped_by_the_log_level():
    # what TensorFlow 2.21 printed here before its logging was set up
    preamble = "WARNING: All log messages before absl::InitializeLog() is called are written"
    info = "I0000 00:00:1796136414.784719    2667 port.cc:153] oneDNN custom operations are on."
    error = (
        "E0000 00:00:1796136418.752657    2667 cuda_platform.cc:52] failed call to cuInit: INTERNAL"
    )
    for line, shown_up_to in ((preamble, 1), (info, 0), (error, 2), ("a Python warning", 3)):
        assert [hidden_startup_line(line, level) for level in range(4)] == [
            level > shown_up_to for level in range(4)
        ], line


def test_installed_asks_without_importing_and_the_hint_names_the_extra():
    import sys

    assert installed("numpy") and not installed("no_such_package_here")
    assert "no_such_package_here" not in sys.modules
    assert install_hint("serve") == "pip install 'mirrorfit[serve]'"
