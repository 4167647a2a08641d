"""models: the chapter's MLP and CNN, and user models from package.module:function."""

import keras
import numpy as np
import pytest

from mirrorfit.errors import ConfigError
from mirrorfit.models import model_factory


def test_mlp_layers_as_in_the_chapter():
    m = model_factory("mlp")()
    assert [type(l).__name__ for l in m.layers] == ["Flatten", "Dense", "Dense"]
    assert m.layers[1].units == 100 and m.count_params() == 784 * 100 + 100 + 100 * 10 + 10


def test_cnn_layers_as_in_the_chapter():
    m = model_factory("cnn")()
    convs = [l for l in m.layers if isinstance(l, keras.layers.Conv2D)]
    assert [(c.filters, c.kernel_size) for c in convs] == [(64, (7, 7)), (128, (3, 3)),
                                                           (128, (3, 3))]
    assert any(isinstance(l, keras.layers.Dropout) and l.rate == 0.5 for l in m.layers)
    out = m(np.zeros((2, 28, 28), np.float32))
    np.testing.assert_allclose(np.sum(out, axis=1), 1.0, rtol=1e-5)


def test_user_model_from_module_function():
    m = model_factory("user_models:tiny")()
    assert m.name == "tiny"


@pytest.mark.parametrize("spec,match", [
    ("resnet", "unknown model 'resnet'"),
    ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'"),
    ("user_models:missing", "has no function 'missing'"),
])
def test_bad_model_specs(spec, match):
    with pytest.raises(ConfigError, match=match):
        model_factory(spec)


def test_user_function_must_return_a_model():
    with pytest.raises(ConfigError, match="not a keras.Model"):
        model_factory("user_models:not_a_model")()


def test_config_knows_the_reference_models_by_name():
    # config refuses an unknown --model before Keras loads, from its own list of names
    from mirrorfit.config import MODELS
    from mirrorfit.models import REFERENCE_MODELS

    assert tuple(REFERENCE_MODELS) == MODELS
