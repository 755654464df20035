"""TFRecordSource: every example once per epoch, disjoint streams, exact O(1) resume, topology changes, index cache."""

import functools
import json
import os

import numpy as np
import pytest

from tfdist import data
from tfdist.data.order import epoch_permutation
from tfdist.data import files as files_mod
from tfdist.data import records as records_mod
from tfdist.errors import BatchSizeError, DataError


class _Context:
    def __init__(self, pipelines, pipeline_id):
        self.num_input_pipelines, self.input_pipeline_id = pipelines, pipeline_id


def write_records(directory, counts, *, width=4, prefix="part", start=0, compression=None) -> list:
    """TFRecord files of examples {"x": float32[width], "id": int64}; ids number the records from ``start``."""
    import tensorflow as tf

    tf.io.gfile.makedirs(str(directory))
    paths, k = [], start
    options = tf.io.TFRecordOptions(compression_type=compression) if compression else None
    for f, n in enumerate(counts):
        path = f"{directory}/{prefix}-{f:03d}.tfrecord"
        with tf.io.TFRecordWriter(path, options) as w:
            for _ in range(n):
                feature = {
                    "x": tf.train.Feature(float_list=tf.train.FloatList(value=[k + j / 10 for j in range(width)])),
                    "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[k])),
                }
                w.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
                k += 1
        paths.append(path)
    return paths


def parse_ids(serialized):
    import tensorflow as tf

    parsed = tf.io.parse_example(serialized, {"x": tf.io.FixedLenFeature([4], tf.float32),
                                              "id": tf.io.FixedLenFeature([], tf.int64)})
    return parsed["x"], parsed["id"]


def _ids(ds):
    return [y.tolist() for _, y in ds.as_numpy_iterator()]


def _plan(source, *, replicas, batch, epochs=2, seed=5, accum=1, recorded_order=None, shuffle=True, **kwargs):
    sizes = data.BatchSizes.resolve(num_replicas=replicas, batch_size=batch, grad_accum_steps=accum)
    return data.make_plan(source, sizes, steps_per_epoch=None, epochs=epochs, seed=seed, shuffle=shuffle,
                          recorded_order=recorded_order, **kwargs)


def _read(source, plan, start=0, context=None):
    return _ids(data.dataset_fn(source, plan, start_step=start, stop_step=plan.total_steps)(context))


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    # Uneven files, one of them empty and one of a single record: blocks span files.
    directory = tmp_path_factory.mktemp("shards")
    write_records(directory, [300, 257, 1, 0, 442])
    return directory


@pytest.fixture(scope="module")
def source(shards):
    return data.TFRecordSource(f"{shards}/*.tfrecord", parse_ids)


@pytest.fixture(scope="module")
def two_replicas(source):
    """The plan of 2 replicas, global batch 16, 2 epochs, and everything it reads (per-replica batches)."""
    plan = _plan(source, replicas=2, batch=16)
    return plan, _read(source, plan)


def test_every_example_once_per_epoch_and_each_epoch_differs(source, two_replicas):
    plan, batches = two_replicas
    layout = plan.layout
    assert layout.streams == 2 and source.num_examples == 1000
    assert plan.steps_per_epoch == layout.min_stream_records() // 8
    spe = plan.steps_per_epoch
    assert len(batches) == 2 * 2 * spe and all(len(b) == 8 for b in batches)
    epochs = [sum(batches[:2 * spe], []), sum(batches[2 * spe:], [])]
    for seen in epochs:
        assert len(seen) == len(set(seen)) == spe * 16 and set(seen) <= set(range(1000))
    assert epochs[0] != epochs[1] and set(epochs[0]) != set(epochs[1])  # the left-out tail differs too
    assert _read(source, _plan(source, replicas=2, batch=16, seed=6)) != batches


def test_training_batches_have_a_static_batch_size_even_when_parse_fn_leaves_it_unknown(source):
    import tensorflow as tf

    def parse_reshaped(serialized):  # bytes decoded, then reshape(-1, ...): the batch size is unknown to the graph
        _, y = parse_ids(serialized)
        raw = tf.io.decode_raw(tf.strings.substr(serialized, 0, 4), tf.uint8)
        return tf.cast(tf.reshape(raw, [-1, 2, 2]), tf.float32), y

    reshaped = data.TFRecordSource(source.paths, parse_reshaped)
    plan = _plan(reshaped, replicas=2, batch=16)
    ds = data.dataset_fn(reshaped, plan, start_step=0, stop_step=plan.total_steps)(None)
    x_spec, y_spec = ds.element_spec
    assert x_spec.shape.as_list() == [8, 2, 2] and y_spec.shape.as_list() == [8]
    assert all(x.shape == (8, 2, 2) for x, _ in ds.take(3).as_numpy_iterator())


def test_validation_reads_every_record_once_in_batches_whose_count_keras_is_told(source):
    import warnings

    import keras

    ds = data.validation_dataset(source, 64)
    assert int(ds.cardinality()) == -(-1000 // 64) == 16  # 1,000 records: 15 full batches and one of 40
    assert sum(_ids(ds), []) == list(range(1000))
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    with warnings.catch_warnings():  # unknown-length data makes Keras 3 warn "ran out of data" each time
        warnings.simplefilter("error")
        model.evaluate(ds.map(lambda x, y: (x, keras.ops.cast(y, "float32"))), verbose=0)


def test_validation_is_made_in_a_traced_function_as_parameter_server_workers_make_it(shards):
    import tensorflow as tf

    fresh = data.TFRecordSource(f"{shards}/*.tfrecord", parse_ids)  # its parse_fn not yet checked

    @tf.function
    def count():
        ds = data.validation_dataset(fresh, 64)
        return ds.reduce(tf.constant(0, tf.int64), lambda n, batch: n + tf.shape(batch[1], out_type=tf.int64)[0])

    assert int(count()) == 1000


def test_each_worker_reads_only_the_blocks_dealt_to_its_streams(source, two_replicas):
    plan = _plan(source, replicas=2, batch=16, shuffle=False)
    R = plan.layout.block_records
    workers = [_read(source, plan, context=_Context(2, w)) for w in range(2)]
    for w, batches in enumerate(workers):
        blocks = {i // R for i in sum(batches, [])}
        assert blocks and all(b % 2 == w for b in blocks)  # stream w holds blocks w, w + 2, ...
    shuffled, one = two_replicas
    w0, w1 = (_read(source, shuffled, context=_Context(2, w)) for w in range(2))
    assert w0 == one[0::2] and w1 == one[1::2]
    spe = shuffled.steps_per_epoch
    for epoch in range(2):
        mine, theirs = (set(sum(w[epoch * spe:(epoch + 1) * spe], [])) for w in (w0, w1))
        assert len(mine) == len(theirs) == spe * 8 and not mine & theirs


@pytest.mark.parametrize("start", [1, 30, 62, 100])  # 62: the first step of epoch 2
def test_resuming_at_any_step_yields_exactly_the_rest(source, two_replicas, start):
    plan, full = two_replicas
    assert plan.steps_per_epoch == 62
    assert _read(source, plan, start=start) == full[2 * start:]  # a pure function of (seed, epoch, step)


def test_resume_reads_one_window_whatever_the_position(shards, monkeypatch):
    import tensorflow as tf

    source = data.TFRecordSource(f"{shards}/*.tfrecord", parse_ids, window_blocks=2)
    plan = _plan(source, replicas=2, batch=16)
    counter = tf.Variable(0, dtype=tf.int64)
    real_read = files_mod._read_segment

    def counting_read(*args):
        return real_read(*args).map(lambda r: (counter.assign_add(1), r)[1])

    monkeypatch.setattr(files_mod, "_read_segment", counting_read)
    reader = source.reader(plan)
    layout = plan.layout
    assert layout.stream_windows(0) >= 3
    length = layout.stream_records(0)
    reads = {}
    for position in (5, length // 2, length - 3):
        counter.assign(0)
        assert next(iter(reader.stream(0, 0, position, length))).dtype == tf.string
        reads[position] = int(counter.numpy())
    # The window holding the position, whether it is near or far (the last window takes 2 to 3 blocks).
    assert reads[5] == layout.window_records and reads[length // 2] == layout.window_records, reads
    assert layout.window_records < reads[length - 3] < 2 * layout.window_records, reads


def test_a_new_replica_count_keeps_the_examples_of_every_step(source, two_replicas):
    two, reference = two_replicas
    recorded = two.order_record()
    assert recorded["streams"] == 2
    per_step = [sorted(reference[2 * i] + reference[2 * i + 1]) for i in range(len(reference) // 2)]
    one = _plan(source, replicas=1, batch=16, recorded_order=recorded)  # 2 replicas -> 1
    assert one.layout == two.layout and one.steps_per_epoch == two.steps_per_epoch
    assert [sorted(b) for b in _read(source, one)] == per_step
    four = _plan(source, replicas=4, batch=16, recorded_order=recorded)  # 2 -> 4: replicas share streams
    got = _read(source, four)
    assert [sorted(sum(got[4 * i:4 * i + 4], [])) for i in range(len(got) // 4)] == per_step
    # Gradient accumulation splits a replica's batch into micro batches, same examples per step.
    accum = _plan(source, replicas=1, batch=16, accum=2, recorded_order=recorded)
    assert [sorted(b) for b in _read(source, accum)] == per_step
    # Resuming in the new topology continues the same sequence.
    assert [sorted(b) for b in _read(source, one, start=70)] == per_step[70:]


def test_steps_per_epoch_is_equal_on_every_worker_and_given_values_are_checked(source):
    plan = _plan(source, replicas=3, batch=12, epochs=1)
    layout = plan.layout
    assert plan.steps_per_epoch == min(layout.stream_records(s) for s in range(3)) // 4
    counts = [len(_read(source, plan, context=_Context(3, w))) for w in range(3)]
    assert counts == [plan.steps_per_epoch] * 3
    sizes = data.BatchSizes.resolve(num_replicas=3, batch_size=12)
    with pytest.raises(BatchSizeError, match="exceeds"):
        data.make_plan(source, sizes, steps_per_epoch=plan.steps_per_epoch + 1, epochs=1, seed=0)
    with pytest.raises(BatchSizeError, match="not divisible by the data's 4 streams"):
        data.make_plan(source, data.BatchSizes.resolve(num_replicas=1, batch_size=6), steps_per_epoch=None, epochs=1,
                       seed=0, recorded_order=dict(layout.as_dict(), streams=4))


def test_parameter_server_workers_each_read_their_own_stream(source):
    plan = _plan(source, replicas=1, batch=16, per_worker=True, num_workers=2)
    assert plan.layout.streams == 2 and plan.steps_per_epoch % 2 == 0
    single = _ids(data.dataset_fn(source, plan, start_step=0, per_worker=True)(_Context(1, 0)).take(14))
    w0 = _ids(data.dataset_fn(source, plan, start_step=3, per_worker=True)(_Context(2, 0)).take(5))
    w1 = _ids(data.dataset_fn(source, plan, start_step=3, per_worker=True)(_Context(2, 1)).take(5))
    assert w0 == single[3:13:2] and w1 == single[4:14:2]
    R = plan.layout.block_records
    unshuffled = _plan(source, replicas=1, batch=16, per_worker=True, num_workers=2, shuffle=False)
    w1 = _ids(data.dataset_fn(source, unshuffled, start_step=0, per_worker=True)(_Context(2, 1)).take(6))
    assert all((i // R) % 2 == 1 for i in sum(w1, []))  # worker 1 runs odd steps: stream 1's blocks


def test_the_index_is_cached_next_to_the_data_or_in_the_cache_dir(tmp_path, monkeypatch):
    paths = write_records(tmp_path / "d", [40, 60])
    first = data.TFRecordSource(paths, parse_ids)
    index = json.loads((tmp_path / "d" / records_mod.INDEX_NAME).read_text())
    assert sorted(index["files"]) == ["part-000.tfrecord", "part-001.tfrecord"]

    def no_scan(*args, **kwargs):
        raise AssertionError("scanned although the index was cached")

    monkeypatch.setattr(records_mod, "scan", no_scan)
    again = data.TFRecordSource(paths, parse_ids)
    assert again.counts == first.counts == [40, 60] and again.fingerprint() == first.fingerprint()
    monkeypatch.undo()

    # A file that changed is scanned again; a data directory that cannot be written uses cache_dir.
    write_records(tmp_path / "d", [40, 61])
    assert data.TFRecordSource(paths, parse_ids).counts == [40, 61]
    # A directory in the index's place makes the data directory's index unwritable, even for root.
    os.remove(tmp_path / "d" / records_mod.INDEX_NAME)
    os.mkdir(tmp_path / "d" / records_mod.INDEX_NAME)
    data.TFRecordSource(paths, parse_ids, cache_dir=str(tmp_path / "ckpt"))
    cached = list((tmp_path / "ckpt").iterdir())
    assert len(cached) == 1 and cached[0].name.startswith("tfdist-index-")
    monkeypatch.setattr(records_mod, "scan", no_scan)
    assert data.TFRecordSource(paths, parse_ids, cache_dir=str(tmp_path / "ckpt")).counts == [40, 61]


def test_a_file_rewritten_to_the_same_size_with_other_records_is_indexed_again(tmp_path):
    # The index was keyed by name and size: a rewritten file of the same size kept its old count,
    # so a resume was accepted and training then ran out of records with a TensorFlow traceback.
    import tensorflow as tf

    path = str(tmp_path / "a.tfrecord")

    def write(payloads):
        with tf.io.TFRecordWriter(path) as w:
            for payload in payloads:
                w.write(payload)

    write([b"x" * 10] * 4)  # 4 x (16 + 10) = 104 bytes
    assert data.TFRecordSource([path], parse_ids).counts == [4]
    size, mtime = os.path.getsize(path), os.stat(path).st_mtime_ns
    write([b"y" * 36] * 2)  # 2 x (16 + 36) = 104 bytes
    os.utime(path, ns=(mtime + 10**9, mtime + 10**9))  # however coarse the filesystem's clock
    assert os.path.getsize(path) == size
    assert data.TFRecordSource([path], parse_ids).counts == [2]


def test_records_are_reached_through_byte_offsets(tmp_path):
    import tensorflow as tf

    (path,) = write_records(tmp_path, [3000])
    index = records_mod.scan(path)
    assert index.records == 3000 and len(index.marks) > 8  # a mark every 1/64 of the file
    source = data.TFRecordSource([path], parse_ids)
    tables = source._tables()
    for lo, hi in ((0, 3), (1234, 1240), (2997, 3000)):
        # Inside a dataset function, as tfdist always uses it (the offset reader cannot be a top-level dataset).
        ds = tf.data.Dataset.from_tensors(0).flat_map(lambda _, lo=lo, hi=hi: files_mod._read_segment(tables, 0, lo, hi))
        got = [int(parse_ids(r[None])[1][0]) for r in ds]
        assert got == list(range(lo, hi))


def test_ram_filesystem_and_compressed_files(tmp_path):
    paths = write_records("ram://tfdist-test-data", [50, 70])
    source = data.TFRecordSource(paths, parse_ids)
    plan = _plan(source, replicas=1, batch=10, epochs=1)
    seen = sum(_read(source, plan), [])
    assert len(seen) == len(set(seen)) == plan.steps_per_epoch * 10 and set(seen) <= set(range(120))
    gz = write_records(tmp_path, [50, 70], compression="GZIP")
    zipped = data.TFRecordSource(gz, parse_ids, compression="GZIP")
    assert zipped.counts == [50, 70]
    plan = _plan(zipped, replicas=1, batch=10, epochs=1)
    full = _read(zipped, plan)
    assert len(set(sum(full, []))) == 120 and _read(zipped, plan, start=5) == full[5:]


def test_bad_files_and_parse_functions_are_refused_with_the_fix(tmp_path, shards):
    import tensorflow as tf

    with pytest.raises(DataError, match="no file matches"):
        data.TFRecordSource(f"{tmp_path}/nothing-*.tfrecord", parse_ids)
    garbage = tmp_path / "garbage.tfrecord"
    garbage.write_bytes(b"this is not a TFRecord file at all")
    with pytest.raises(DataError, match="not a valid TFRecord file.*Fix:"):
        data.TFRecordSource(str(garbage), parse_ids)
    # parse_fn is checked on first use (fit's sample), not when the source is made.
    with pytest.raises(DataError, match="must return batched tensors.*parse_example"):
        data.TFRecordSource(f"{shards}/*.tfrecord", lambda s: (tf.zeros([]), tf.zeros([]))).sample(1)
    with pytest.raises(DataError, match=r"must return x, \(x, y\) or \(x, y, sample_weight\); received tuple of length 4"):
        data.TFRecordSource(f"{shards}/*.tfrecord", lambda s: (s, s, s, s)).sample(1)
    assert set(data.TFRecordSource(f"{shards}/*.tfrecord", lambda s: {"x": s}).sample(1)) == {"x"}  # x alone
    unparsable = data.TFRecordSource(f"{shards}/*.tfrecord",
                                     lambda s: tf.io.parse_example(s, {"nope": tf.io.FixedLenFeature([], tf.int64)}))
    with pytest.raises(DataError, match="parse_fn` failed"):
        data.dataset_fn(unparsable, _plan(unparsable, replicas=1, batch=8), start_step=0)(None)
    with pytest.raises(DataError, match="streams=0"):
        data.TFRecordSource(f"{shards}/*.tfrecord", parse_ids, streams=0)
    # parse_fn runs as a graph, in the check as in training: eager-only code is refused in one line.
    eager_only = data.TFRecordSource(f"{shards}/*.tfrecord", lambda s: (parse_ids(s)[0].numpy(), parse_ids(s)[1]))
    with pytest.raises(DataError, match=r"parse_fn` failed on the first records .*AttributeError: .*numpy.*"
                                        r"runs as a graph, as in Dataset.map"):
        eager_only.sample(1)


def test_a_parse_fn_with_python_control_flow_on_tensors_runs_as_dataset_map_runs_it(shards):
    import keras
    import tensorflow as tf

    import tfdist

    def parse(serialized):
        x, ids = parse_ids(serialized)
        return x, tf.cast(ids % 10, tf.float32)

    def parse_branching(serialized):  # AutoGraph makes the `if` a graph conditional, as Dataset.map does
        x, y = parse(serialized)
        if tf.reduce_max(x) > 1e6:  # never true on these records
            x = x * 0.0
        return x, y

    def model():
        built = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        built.compile("sgd", "mse")
        return built

    def run(parse_fn):
        source = data.TFRecordSource(f"{shards}/*.tfrecord", parse_fn)
        history = tfdist.fit(model, source, validation_data=source, epochs=1, batch_size=50, steps_per_epoch=3,
                             seed=3, strategy="one_device", verbose=0)
        return history.history, tfdist.evaluate(history.model, source, verbose=0)

    branching = run(parse_branching)
    assert branching == run(parse) and np.isfinite(branching[0]["val_loss"][0])


def test_a_record_failing_its_checksum_fails_the_run_naming_its_file(tmp_path):
    import keras

    import tfdist

    digits = write_digits(tmp_path / "digits")
    source = data.load(digits["train"], features=digits["features"])[0]
    damaged, index = source.paths[2], source._index[2]
    record = index.offsets[3]  # a record's start (a marked one)
    raw = bytearray(open(damaged, "rb").read())
    raw[record + records_mod.HEADER_BYTES + 5] ^= 0xFF  # a byte of its data, as a bad copy leaves it
    with open(damaged, "wb") as f:
        f.write(bytes(raw))

    def fit(train, **kwargs):
        model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(10)])
        model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return tfdist.fit(model, train, epochs=1, batch_size=32, strategy="one_device", verbose=0, **kwargs)

    expected = rf"a record fails its checksum \(TensorFlow: corrupted record at {record + 12}\); received " \
               rf"'.*train-00002.tfrecord', its record at byte {record}, in .*Fix: copy or write the file again"
    with pytest.raises(DataError, match=expected):
        fit(data.load(digits["train"], features=digits["features"])[0])
    # The same framing offset in the undamaged files is a record too: only the failing one is named.
    assert all(records_mod.starts_record(p, record, size, ix)
               for p, size, ix in zip(source.paths, source.sizes, source._index))
    # A damaged length checksum: TensorFlow reports the record's own start; the validation data is named the same way.
    raw[record + records_mod.HEADER_BYTES + 5] ^= 0xFF
    raw[record + 9] ^= 0xFF
    with open(damaged, "wb") as f:
        f.write(bytes(raw))
    expected = rf"corrupted record at {record}\); received '.*train-00002.tfrecord', its record at byte {record}"
    with pytest.raises(DataError, match=expected):
        fit(data.load(digits["validation"], features=digits["features"])[0],
            validation_data=data.load(digits["train"], features=digits["features"])[0])


def test_a_directory_given_as_a_data_file_is_named_as_one_with_a_glob_to_pass(tmp_path):
    write_records(tmp_path / "d", [4])
    with pytest.raises(DataError, match=r"a data file is a directory; received '.*d'\. Fix: .*'.*d/\*\.tfrecord'"):
        data.TFRecordSource(str(tmp_path / "d"), parse_ids)


def test_a_data_file_deleted_while_training_fails_the_run_naming_it(tmp_path):
    # Was TensorFlow's NotFoundError with a 40-line traceback (exit 1, not a data error's 2).
    import keras

    import tfdist

    digits = write_digits(tmp_path / "digits")
    source = data.load(digits["train"], features=digits["features"])[0]
    os.remove(source.paths[1])  # after the source indexed it: as between two steps
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(10)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(DataError, match=r"a data file went away during training; received '.*train-00001.tfrecord', "
                                        r"one of .*Fix: put it back"):
        tfdist.fit(model, source, epochs=1, batch_size=32, strategy="one_device", verbose=0)


def test_fingerprint_is_names_sizes_and_counts(tmp_path):
    a = write_records(tmp_path / "a", [20, 30])
    b = write_records(tmp_path / "b", [20, 30])  # the same files elsewhere: the data moved
    c = write_records(tmp_path / "c", [20, 31])
    fa, fb, fc = (data.TFRecordSource(p, parse_ids).fingerprint() for p in (a, b, c))
    assert fa == fb != fc


@functools.lru_cache(maxsize=None)
def _tiny_builder_class():
    """A TFDS builder of 8x8 random images in 10 classes (defined once: TFDS registers builders by name)."""
    tfds = pytest.importorskip("tensorflow_datasets")

    class TinyShards(tfds.core.GeneratorBasedBuilder):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(
                builder=self,
                features=tfds.features.FeaturesDict({"image": tfds.features.Image(shape=(8, 8, 1)),
                                                     "label": tfds.features.ClassLabel(num_classes=10)}),
                supervised_keys=("image", "label"),
            )

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples(0, 240), "test": self._generate_examples(1, 40)}

        def _generate_examples(self, seed, n):
            rng = np.random.RandomState(seed)
            for i in range(n):
                yield i, {"image": rng.randint(0, 256, (8, 8, 1)).astype(np.uint8), "label": i % 10}

    return TinyShards


def _tiny_builder(tmp_path, file_format="tfrecord"):
    tfds = pytest.importorskip("tensorflow_datasets")
    builder = _tiny_builder_class()(data_dir=str(tmp_path), file_format=file_format)
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(num_shards=3))
    return builder


def test_tfds_is_a_file_source_counted_from_its_metadata(tmp_path, monkeypatch):
    builder = _tiny_builder(tmp_path)
    monkeypatch.setattr(records_mod, "scan", lambda *a, **k: pytest.fail("scanned before reading"))
    from tfdist.data import tfds as tfds_mod

    train, val = tfds_mod.load("tiny_shards", data_dir=str(tmp_path))
    assert isinstance(train, data.TFRecordSource) and len(train.paths) == 3
    assert train.num_examples == 240 and val.num_examples == 40 and train.num_classes == 10
    assert train.example_shape == (8, 8, 1)
    monkeypatch.undo()
    plan = _plan(train, replicas=1, batch=20, epochs=1)
    xs, ys = zip(*data.dataset_fn(train, plan, start_step=0, stop_step=plan.total_steps)(None).as_numpy_iterator())
    x, y = np.concatenate(xs), np.concatenate(ys)
    assert x.dtype == np.float32 and 0.0 <= x.min() and x.max() <= 1.0 and len(x) == 240
    ref = next(iter(builder.as_dataset(split="train", batch_size=240, shuffle_files=False).as_numpy_iterator()))
    expected = sorted(zip(ref["label"].tolist(), ref["image"].reshape(240, -1).astype(int).sum(1).tolist()))
    got = sorted(zip(y.tolist(), np.round(x.reshape(240, -1) * 255).astype(int).sum(1).tolist()))
    assert got == expected
    assert np.bincount(y, minlength=10).tolist() == [24] * 10


def test_tfds_array_record_is_read_by_index_in_an_exact_global_shuffle(tmp_path):
    pytest.importorskip("array_record")
    from tfdist.data import tfds as tfds_mod

    _tiny_builder(tmp_path, file_format="array_record")
    train, val = tfds_mod.load("tiny_shards", data_dir=str(tmp_path))
    assert isinstance(train, data.IndexedSource) and train.num_examples == 240 and train.example_shape == (8, 8, 1)
    sizes = data.BatchSizes.resolve(num_replicas=2, batch_size=16)
    plan = data.make_plan(train, sizes, steps_per_epoch=None, epochs=1, seed=4)
    batches = list(data.dataset_fn(train, plan, start_step=0, stop_step=plan.total_steps)(None).as_numpy_iterator())
    # The order is the permutation of all 240 examples: step t holds its positions [16 t, 16 t + 16).
    order = epoch_permutation(240, 4, 0, True).numpy()
    x_all, y_all = train.sample(240)
    got = np.concatenate([x for x, _ in batches])
    np.testing.assert_array_equal(got, x_all[order[:len(got)]])
    resumed = list(data.dataset_fn(train, plan, start_step=7, stop_step=plan.total_steps)(None).as_numpy_iterator())
    np.testing.assert_array_equal(np.concatenate([y for _, y in resumed]), y_all[order[7 * 16:len(got)]])
    with pytest.raises(DataError, match="parameter-server workers cannot run"):
        data.dataset_fn(train, plan, start_step=0, per_worker=True)(_Context(1, 0))


def test_an_indexed_source_reads_an_empty_batch_with_the_types_it_declares():
    # A replica past the end of its validation part reads empty batches (data.validation_input).
    import tensorflow as tf

    examples = [{"image": np.full((2, 2), i, np.uint8), "label": i % 3} for i in range(5)]
    source = data.IndexedSource(examples, x_key="image", y_key="label", name="five")
    read = tf.data.Dataset.from_tensors(tf.zeros([0], tf.int64)).map(source.gather_fn())
    x, y = next(read.as_numpy_iterator())
    assert (x.shape, x.dtype, y.shape, y.dtype) == ((0, 2, 2), np.float32, (0,), np.int64)


def test_feature_specs_parse_records_and_name_every_bad_field(tmp_path):
    import tensorflow as tf

    path = tmp_path / "img.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as w:
        for i in range(12):
            image = np.full((4, 4, 1), i * 20, np.uint8)
            feature = {"png": tf.train.Feature(bytes_list=tf.train.BytesList(value=[tf.io.encode_png(image).numpy()])),
                       "raw": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image.tobytes()])),
                       "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 3]))}
            w.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    base = {"y": {"key": "label", "dtype": "int64"}, "num_classes": 3}
    for x in ({"key": "png", "dtype": "string", "decode": "png", "shape": [4, 4, 1], "scale": 255},
              {"key": "raw", "dtype": "string", "decode": "raw:uint8", "shape": [4, 4, 1], "scale": 255}):
        spec_path = tmp_path / "spec.json"
        spec_path.write_text(json.dumps(dict(base, x=x)))
        train, val = data.load(str(path), features=str(spec_path))
        assert val is None and train.num_classes == 3 and train.example_shape == (4, 4, 1)
        bx, by = train.sample(12)
        np.testing.assert_allclose(bx[:, 0, 0, 0], np.arange(12) * 20 / 255, rtol=1e-6)
        assert by.tolist() == [i % 3 for i in range(12)]
    bad = [
        ({"x": {"key": "png", "dtype": "float"}}, "'x.dtype': received 'float'"),
        ({"x": {"key": "png", "dtype": "string", "decode": "gif", "shape": [4, 4, 1]}}, "'x.decode': received 'gif'"),
        ({"x": {"key": "png", "dtype": "string", "decode": "png", "shape": [4, 4]}}, "'x.shape': received [4, 4]"),
        ({"x": {"key": "raw", "dtype": "int64", "shape": [-1]}}, "'x.shape': received [-1]"),
        ({"x": {"key": "", "dtype": "int64"}}, "'x.key': received ''"),
        ({"x": {"key": "raw", "dtype": "int64", "colour": 1}}, "'x.colour'"),
        ({"x": {"key": "raw", "dtype": "float32"}, "num_classes": 0}, "'num_classes': received 0"),
        ({"x": {"key": "raw", "dtype": "float32"}, "y": {"key": "label", "dtype": "string"}}, "'y.dtype'"),
    ]
    for change, text in bad:
        spec_path.write_text(json.dumps(dict(base, **change)))
        with pytest.raises(DataError, match="Fix:") as info:
            data.load(str(path), features=str(spec_path))
        assert text in str(info.value), str(info.value)
    # A spec that is valid but does not fit the records: the spec is named (a CLI user wrote no parse_fn).
    raw = {"key": "raw", "dtype": "string", "decode": "raw:uint8", "shape": [4, 4, 1], "scale": 255}
    spec_path.write_text(json.dumps(dict(base, x=raw, y={"key": "nolabel", "dtype": "int64"})))
    train, _ = data.load(str(path), features=str(spec_path))
    with pytest.raises(DataError, match=r"do not fit the feature spec \(InvalidArgumentError: .*Feature: nolabel .*\); "
                                        r"received --features '.*spec\.json'\. Fix: give each feature"):
        train.sample(2)
    # A decoded image's shape that does not hold its values: [4, 4, 2] for 16 bytes a record.
    spec_path.write_text(json.dumps(dict(base, x=dict(raw, shape=[4, 4, 2]))))
    train, _ = data.load(str(path), features=str(spec_path))
    with pytest.raises(DataError, match=r"do not fit the feature spec \(x comes out of shape \(1, 4, 4, 2\) for 2 "
                                        r"records\); received --features '.*spec\.json'\. Fix: give each feature") as info:
        train.sample(2)
    assert "parse_fn" not in str(info.value)
    spec_path.write_text("{not json")
    with pytest.raises(DataError, match="not valid JSON"):
        data.load(str(path), features=str(spec_path))
    with pytest.raises(DataError, match="needs a feature spec"):
        data.load(str(path))
    with pytest.raises(DataError, match="--features applies to TFRecord files only"):
        data.load("digits", features=str(spec_path))


def write_digits(directory, *, files=4) -> dict:
    """The bundled digits as TFRecords (uint8 pixels, raw bytes), a validation file and a feature spec."""
    import tensorflow as tf

    train, val = data.load_digits()
    tf.io.gfile.makedirs(str(directory))

    def write(path, source, indices):
        with tf.io.TFRecordWriter(path) as w:
            for i in indices:
                image = np.round(source.x[i] * 255).astype(np.uint8)
                feature = {"image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image.tobytes()])),
                           "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(source.y[i])]))}
                w.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())

    for f, indices in enumerate(np.array_split(np.arange(train.num_examples), files)):
        write(f"{directory}/train-{f:05d}.tfrecord", train, indices)
    write(f"{directory}/val-00000.tfrecord", val, range(val.num_examples))
    spec = {"x": {"key": "image", "dtype": "string", "decode": "raw:uint8", "shape": [8, 8, 1], "scale": 255},
            "y": {"key": "label", "dtype": "int64"}, "num_classes": 10}
    with open(f"{directory}/spec.json", "w") as f:
        json.dump(spec, f)
    return {"train": f"{directory}/train-*.tfrecord", "validation": f"{directory}/val-*.tfrecord",
            "features": f"{directory}/spec.json", "num_validation": val.num_examples}
