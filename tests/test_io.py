"""_io: files written whole or not at all; JSON that strict readers accept."""

import json
import math

from mirrorfit import _io


def test_json_is_written_whole_and_without_bare_nan(tmp_path):
    path = tmp_path / "m.json"
    _io.write_json_atomic(
        path,
        {"loss": math.nan, "history": [{"acc": math.inf}, 0.5], "pair": (1.0, -math.inf), "n": 3},
    )
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text, parse_constant=lambda c: 1 / 0) == {
        "loss": None,
        "history": [{"acc": None}, 0.5],
        "pair": [1.0, None],
        "n": 3,
    }
    assert [p.name for p in tmp_path.iterdir()] == ["m.json"]  # no temporary file left
