"""The SavedModel serving_support.model_root writes as models/multi: signatures for every API
(two-input predict, classify and regress on tf.Examples). Imported only by that fixture, when
it runs: importing this module loads TensorFlow."""

import tensorflow as tf


class Multi(tf.Module):
    """Signatures for every API: two-input predict, classify and regress on tf.Examples."""

    def __init__(self):
        self.w = tf.Variable([1.0, 2.0, 3.0])

    @tf.function(
        input_signature=[
            tf.TensorSpec([None, 2], tf.float32, name="a"),
            tf.TensorSpec([None, 2], tf.float32, name="b"),
        ]
    )
    def multi(self, a, b):
        return {"sum": a + b, "product": a * b}

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.int32, name="ids")])
    def ints(self, ids):
        return {"doubled": ids * 2}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
    def classify(self, examples):
        x = tf.io.parse_example(examples, {"x": tf.io.FixedLenFeature([2], tf.float32)})["x"]
        scores = tf.nn.softmax(tf.stack([x[:, 0], x[:, 1], x[:, 0] + x[:, 1]], axis=1))
        classes = tf.tile(tf.constant([["left", "right", "both"]]), [tf.shape(x)[0], 1])
        return {"scores": scores, "classes": classes}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
    def regress(self, examples):
        f = tf.io.parse_example(examples, {"x": tf.io.FixedLenFeature([2], tf.float32)})["x"]
        return {"outputs": tf.reduce_sum(f * self.w[:2], axis=1)}


def save(path):
    m = Multi()
    tf.saved_model.save(
        m,
        path,
        signatures={
            "serving_default": m.multi,
            "multi": m.multi,
            "ints": m.ints,
            "classify_x": m.classify,
            "regress_x": m.regress,
        },
    )
