"""Keras 3 models written the way keras.io's examples write them, their data, and a driver that
trains them through ``tfdist.fit``, killing itself once per model (tests/test_keras_patterns.py).

* ``gan``: keras.io's DCGAN form: ``train_step`` and no ``call()``, an overridden ``compile``
  holding two optimizers built at their first step, a seed generator, images without labels.
* ``vae``: keras.io's VAE: its own loss trackers, a sampling layer drawing from a seed
  generator, no compiled loss, images without labels.
* ``autoencoder``: a compiled loss on images without labels, its steps taking ``x`` as the target.
* ``counter``: a model holding a variable its ``train_step`` counts examples in.
* ``strings``: a string column as a NumPy object array (what pandas gives) into a ``StringLookup``.

Run as a script: ``python keras_patterns.py STRATEGY ROOT ITEM[,ITEM...] KILL_AT``. An item is
``PATTERN`` (trained under ``STRATEGY`` into ``ROOT/PATTERN``) or ``STRATEGY:PATTERN`` (trained
into ``ROOT/STRATEGY-PATTERN``). The first run of each item (no ``ROOT/NAME.killed`` yet) kills
itself with SIGKILL after global step ``KILL_AT``. A run that completes an item writes
``ROOT/NAME.json``, and later runs skip that item: repeating one command meets one kill per item.
With ``KILL_AT`` 0 only a ``TFDIST_FAULT`` of the environment applies (a ``tfdist launch``
cluster's), and no item is skipped. It prints ``RESULT {...}`` once every item is complete.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

LATENT = 4
PATTERNS = ("gan", "vae", "autoencoder", "counter", "strings")
EPOCHS, BATCH = 2, 16


def images(n: int = 96, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((n, 8, 8, 1), dtype=np.float32)


def _keras():
    import keras

    return keras


def gan():
    keras = _keras()
    from keras import layers, ops

    class GAN(keras.Model):
        def __init__(self, discriminator, generator, latent_dim, **kwargs):
            super().__init__(**kwargs)
            self.discriminator, self.generator, self.latent_dim = discriminator, generator, latent_dim
            self.seed_generator = keras.random.SeedGenerator(1337)

        def compile(self, d_optimizer, g_optimizer, loss_fn):
            super().compile()
            self.d_optimizer, self.g_optimizer, self.loss_fn = d_optimizer, g_optimizer, loss_fn
            self.d_loss_metric = keras.metrics.Mean(name="d_loss")
            self.g_loss_metric = keras.metrics.Mean(name="g_loss")

        @property
        def metrics(self):
            return [self.d_loss_metric, self.g_loss_metric]

        def train_step(self, real_images):
            import tensorflow as tf

            batch_size = ops.shape(real_images)[0]
            z = keras.random.normal((batch_size, self.latent_dim), seed=self.seed_generator)
            combined = ops.concatenate([self.generator(z), real_images], axis=0)
            labels = ops.concatenate([ops.ones((batch_size, 1)), ops.zeros((batch_size, 1))], axis=0)
            labels += 0.05 * keras.random.uniform(ops.shape(labels), seed=self.seed_generator)
            with tf.GradientTape() as tape:
                d_loss = self.loss_fn(labels, self.discriminator(combined))
            grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
            self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))
            z = keras.random.normal((batch_size, self.latent_dim), seed=self.seed_generator)
            with tf.GradientTape() as tape:
                g_loss = self.loss_fn(ops.zeros((batch_size, 1)), self.discriminator(self.generator(z)))
            grads = tape.gradient(g_loss, self.generator.trainable_weights)
            self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))
            self.d_loss_metric.update_state(d_loss)
            self.g_loss_metric.update_state(g_loss)
            return {"d_loss": self.d_loss_metric.result(), "g_loss": self.g_loss_metric.result()}

    discriminator = keras.Sequential([keras.Input((8, 8, 1)), layers.Flatten(), layers.Dense(16, activation="relu"),
                                      layers.Dense(1)], name="discriminator")
    generator = keras.Sequential([keras.Input((LATENT,)), layers.Dense(64, activation="sigmoid"),
                                  layers.Reshape((8, 8, 1))], name="generator")
    model = GAN(discriminator, generator, LATENT)
    model.compile(d_optimizer=keras.optimizers.Adam(1e-3), g_optimizer=keras.optimizers.Adam(1e-3),
                  loss_fn=keras.losses.BinaryCrossentropy(from_logits=True))
    return model


def vae():
    keras = _keras()
    from keras import layers, ops

    class Sampling(layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.seed_generator = keras.random.SeedGenerator(1337)

        def call(self, inputs):
            z_mean, z_log_var = inputs
            epsilon = keras.random.normal(ops.shape(z_mean), seed=self.seed_generator)
            return z_mean + ops.exp(0.5 * z_log_var) * epsilon

    class VAE(keras.Model):
        def __init__(self, encoder, decoder, **kwargs):
            super().__init__(**kwargs)
            self.encoder, self.decoder = encoder, decoder
            self.total_loss_tracker = keras.metrics.Mean(name="total_loss")
            self.reconstruction_loss_tracker = keras.metrics.Mean(name="reconstruction_loss")
            self.kl_loss_tracker = keras.metrics.Mean(name="kl_loss")

        @property
        def metrics(self):
            return [self.total_loss_tracker, self.reconstruction_loss_tracker, self.kl_loss_tracker]

        def train_step(self, data):
            import tensorflow as tf

            with tf.GradientTape() as tape:
                z_mean, z_log_var, z = self.encoder(data)
                reconstruction = self.decoder(z)
                reconstruction_loss = ops.mean(ops.sum(keras.losses.binary_crossentropy(data, reconstruction), axis=(1, 2)))
                kl_loss = ops.mean(ops.sum(-0.5 * (1 + z_log_var - ops.square(z_mean) - ops.exp(z_log_var)), axis=1))
                total_loss = reconstruction_loss + kl_loss
            grads = tape.gradient(total_loss, self.trainable_weights)
            self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
            self.total_loss_tracker.update_state(total_loss)
            self.reconstruction_loss_tracker.update_state(reconstruction_loss)
            self.kl_loss_tracker.update_state(kl_loss)
            return {m.name: m.result() for m in self.metrics}

    inputs = keras.Input((8, 8, 1))
    hidden = layers.Dense(16, activation="relu")(layers.Flatten()(inputs))
    z_mean, z_log_var = layers.Dense(2)(hidden), layers.Dense(2)(hidden)
    encoder = keras.Model(inputs, [z_mean, z_log_var, Sampling()([z_mean, z_log_var])], name="encoder")
    latent = keras.Input((2,))
    decoder = keras.Model(latent, layers.Reshape((8, 8, 1))(layers.Dense(64, activation="sigmoid")(latent)),
                          name="decoder")
    model = VAE(encoder, decoder)
    model.compile(optimizer=keras.optimizers.Adam(1e-3))
    return model


def autoencoder():
    keras = _keras()
    from keras import layers

    class Autoencoder(keras.Model):
        def train_step(self, x):
            return super().train_step((x, x))

        def test_step(self, x):
            return super().test_step((x, x))

    inputs = keras.Input((8, 8, 1))
    noisy = layers.GaussianNoise(0.1)(inputs)
    code = layers.Dense(8, activation="relu")(layers.Flatten()(noisy))
    outputs = layers.Reshape((8, 8, 1))(layers.Dense(64, activation="sigmoid")(code))
    model = Autoencoder(inputs, outputs)
    model.compile(keras.optimizers.Adam(1e-3), "mse")
    return model


def counter():
    keras = _keras()
    from keras import layers, ops

    class Counter(keras.Model):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.flatten, self.dense = layers.Flatten(), layers.Dense(3)
            self.seen = self.add_weight(shape=(), initializer="zeros", trainable=False, dtype="int64", name="seen")

        def call(self, x):
            return self.dense(self.flatten(x))

        def train_step(self, data):
            self.seen.assign_add(ops.cast(ops.shape(data[0])[0], "int64"))
            return super().train_step(data)

    model = Counter()
    model.compile(keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


CITIES = ["Lyon", "Oslo", "Quito", "Perth", "Accra"]


def strings():
    keras = _keras()
    from keras import layers

    city = keras.Input((1,), dtype="string", name="city")
    size = keras.Input((1,), name="size")
    lookup = layers.StringLookup(vocabulary=CITIES, output_mode="one_hot")(city)
    hidden = layers.Dense(8, activation="relu")(layers.Concatenate()([lookup, size]))
    model = keras.Model({"city": city, "size": size}, layers.Dense(3)(hidden))
    model.compile(keras.optimizers.Adam(1e-2), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def data(pattern: str):
    """The training data of ``pattern``, in the form its keras.io example passes to ``fit``."""
    x = images()
    if pattern in ("gan", "vae", "autoencoder"):
        return x  # no labels
    labels = (x.reshape(len(x), -1).sum(1) * 3).astype(np.int64) % 3
    if pattern == "counter":
        return x, labels
    rng = np.random.default_rng(1)
    column = np.array([CITIES[i] for i in rng.integers(0, len(CITIES), len(x))], dtype=object)  # a pandas column
    return {"city": column.reshape(-1, 1), "size": rng.random((len(x), 1), dtype=np.float32)}, labels


BUILDERS = {"gan": gan, "vae": vae, "autoencoder": autoencoder, "counter": counter, "strings": strings}


def fit(pattern: str, strategy: str, checkpoint_dir: str | None, **options):
    import tfdist

    arguments = dict(epochs=EPOCHS, batch_size=BATCH, seed=0, deterministic=True, strategy=strategy, verbose=0,
                     checkpoint_dir=checkpoint_dir, save_every_steps=2)
    arguments.update(options)
    return tfdist.fit(BUILDERS[pattern], data(pattern), **arguments)


def main(strategy: str, root: str, items: str, kill_at: str) -> None:
    import tensorflow as tf

    import tfdist

    # Grappler rewrites graphs under time budgets: on a loaded machine, two uninterrupted runs of
    # the VAE differed in the last bit of their total_loss metric (never in a weight). Without it,
    # every run is the same, and a difference can only come from the resume.
    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})

    plan = []  # (name, strategy, pattern)
    for item in items.split(","):
        named, _, pattern = item.rpartition(":")
        plan.append((f"{named}-{pattern}" if named else pattern, named or strategy, pattern))
    if any(name in ("mirrored", "central_storage") for _, name, _ in plan):
        tfdist.split_cpu(2)
    result = {}
    for name, item_strategy, pattern in plan:
        done = os.path.join(root, f"{name}.json")
        if int(kill_at) and os.path.exists(done):
            continue
        _keras().backend.clear_session()  # each item as in a process of its own (layer names, graphs)
        marker = os.path.join(root, f"{name}.killed")
        if int(kill_at):  # else a TFDIST_FAULT from the environment (a launched cluster's) applies
            os.environ.pop("TFDIST_FAULT", None)
            if not os.path.exists(marker):
                os.makedirs(root, exist_ok=True)
                open(marker, "w").close()
                os.environ["TFDIST_FAULT"] = f"kill_at_step:{kill_at}"
        history = fit(pattern, item_strategy, os.path.join(root, name))
        result[name] = {"from": history.tfdist.start_step, "history": history.history}
        if int(kill_at):
            with open(done, "w") as f:
                json.dump(result[name], f)
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
