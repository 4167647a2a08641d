"""--data's kind and the data flags' values (mirrorfit.data.spec), before TensorFlow loads:
an --input-shape too large for memory is one line naming the limit; an existing path with
glob characters in its name is that path, not a pattern."""

import pytest

from mirrorfit.data.spec import MAX_INPUT_ELEMENTS, parse_ints, source_kind, tfrecord_files
from mirrorfit.errors import ConfigError


def _shape(value):
    return parse_ints("--input-shape", value, lengths=(1, 2, 3, 4), example="224,224,3")


def test_input_shape_is_capped_on_the_elements_of_one_example():
    assert _shape("224,224,3") == (224, 224, 3)
    assert _shape("8192,8192") == (8192, 8192)  # 2**26: the limit itself passes
    assert _shape([1 << 20, 64]) == (1 << 20, 64)  # not every input is an image
    for value in ("1048576,1048576,3", "8192,8192,2", [1 << 20, 65]):
        with pytest.raises(ConfigError) as e:
            _shape(value)
        message = str(e.value)
        shown = value if isinstance(value, str) else ",".join(map(str, value))
        assert message.startswith(f"--input-shape {shown}: ") and "\n" not in message
        assert f"at most {MAX_INPUT_ELEMENTS:,}" in message and "--input-shape 224,224,3" in message


def test_image_size_keeps_its_own_check():
    # config.py says "at most 8192 pixels a side" for --image-size: no element cap here
    assert parse_ints("--image-size", "1048576,1048576", count=2, example="224,224") == (
        1 << 20,
        1 << 20,
    )


@pytest.mark.parametrize("name", ["imgs[1]", "what?", "a*b"])
def test_an_existing_folder_with_glob_characters_is_a_folder(tmp_path, name):
    (tmp_path / name).mkdir()
    assert source_kind(str(tmp_path / name)) == "folder"


def test_an_existing_tfrecord_file_with_glob_characters_is_that_file(tmp_path):
    (tmp_path / "a[1].tfrecord").write_bytes(b"")
    (tmp_path / "a1.tfrecord").write_bytes(b"")  # what "a[1].tfrecord" matches as a glob
    spec = str(tmp_path / "a[1].tfrecord")
    assert source_kind(spec) == "tfrecord" and tfrecord_files(spec) == [spec]


def test_a_pattern_still_matches_and_an_empty_one_is_refused(tmp_path):
    (tmp_path / "a1.tfrecord").write_bytes(b"")
    assert source_kind(str(tmp_path / "a[1].tfrecord")) == "tfrecord"
    with pytest.raises(ConfigError, match="the pattern matches no file"):
        source_kind(str(tmp_path / "b[1]"))
