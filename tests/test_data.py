"""The data path: batch arithmetic, per-epoch order, O(1) resume position, pipeline slices."""

import numpy as np
import pytest

from tfdist import data
from tfdist.data.order import ORDER_VERSION, epoch_permutation
from tfdist.errors import BatchSizeError, DataError


class _Context:
    def __init__(self, pipelines, pipeline_id):
        self.num_input_pipelines, self.input_pipeline_id = pipelines, pipeline_id


def _source(n=100, features=3):
    x = np.arange(n * features, dtype=np.float32).reshape(n, features)
    return data.ArraySource(x, np.arange(n, dtype=np.int64))


def _labels(ds):
    return [y.tolist() for _, y in ds.as_numpy_iterator()]


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        (dict(num_replicas=2), (64, 32, 1)),
        (dict(num_replicas=2, batch_size=20), (20, 10, 1)),
        (dict(num_replicas=4, per_replica_batch_size=8), (32, 8, 1)),
        (dict(num_replicas=1, batch_size=10, grad_accum_steps=2), (10, 5, 2)),
        (dict(num_replicas=2, per_replica_batch_size=5, grad_accum_steps=3), (30, 5, 3)),
    ],
)
def test_batch_arithmetic(kwargs, expected):
    sizes = data.BatchSizes.resolve(**kwargs)
    assert (sizes.global_batch_size, sizes.micro_batch_size, sizes.grad_accum_steps) == expected
    assert sizes.global_batch_size == sizes.grad_accum_steps * sizes.num_replicas * sizes.micro_batch_size


@pytest.mark.parametrize(
    "kwargs, text",
    [
        (dict(num_replicas=3, batch_size=100), "batch_size=100 is not divisible by replicas x grad_accum_steps = 3 x 1 = 3"),
        (dict(num_replicas=2, batch_size=10, grad_accum_steps=4), "multiple of 8"),
        (dict(num_replicas=2, batch_size=20, per_replica_batch_size=4), "disagree"),
        (dict(num_replicas=1, batch_size=0), "received batch_size=0"),
        (dict(num_replicas=1, per_replica_batch_size=-3), "per_replica_batch_size=-3"),
        (dict(num_replicas=1, grad_accum_steps=0), "grad_accum_steps=0"),
    ],
)
def test_batch_errors_name_the_values_and_the_fix(kwargs, text):
    with pytest.raises(BatchSizeError) as info:
        data.BatchSizes.resolve(**kwargs)
    assert text in str(info.value) and "Fix:" in str(info.value)


def test_steps_per_epoch_drops_the_remainder_and_checks_size():
    sizes = data.BatchSizes.resolve(num_replicas=1, batch_size=30)
    assert data.steps_per_epoch_for(_source(100), sizes, None) == 3
    assert data.steps_per_epoch_for(_source(100), sizes, 2) == 2
    with pytest.raises(BatchSizeError, match="larger than the data"):
        data.steps_per_epoch_for(_source(10), sizes, None)
    with pytest.raises(BatchSizeError, match=r"steps_per_epoch=7 exceeds the 3 whole global batches.*Fix: pass steps_per_epoch <= 3"):
        data.steps_per_epoch_for(_source(100), sizes, 7)


def _plan(global_batch=8, replicas=2, spe=5, epochs=3, seed=7, accum=1):
    sizes = data.BatchSizes.resolve(num_replicas=replicas, batch_size=global_batch, grad_accum_steps=accum)
    return data.DataPlan(sizes=sizes, steps_per_epoch=spe, epochs=epochs, seed=seed)


def test_each_epoch_is_a_fresh_permutation_and_pipelines_recompose_the_global_batch():
    source, plan = _source(40), _plan(global_batch=8, replicas=2, spe=5, epochs=2)
    one = _labels(data.dataset_fn(source, plan, start_step=0, stop_step=plan.total_steps)(_Context(1, 0)))
    # one pipeline, two replicas: two per-replica batches of 4 per step
    assert len(one) == plan.total_steps * 2 and all(len(b) == 4 for b in one)
    epoch0 = sum(one[:10], [])
    epoch1 = sum(one[10:], [])
    assert sorted(epoch0) == list(range(40)) and sorted(epoch1) == list(range(40))
    assert epoch0 != epoch1
    # two pipelines (workers) with one replica each: worker w gets replica w's slice
    w0 = _labels(data.dataset_fn(source, plan, start_step=0, stop_step=plan.total_steps)(_Context(2, 0)))
    w1 = _labels(data.dataset_fn(source, plan, start_step=0, stop_step=plan.total_steps)(_Context(2, 1)))
    assert w0 == one[0::2] and w1 == one[1::2]


def test_order_depends_on_the_seed_only():
    source = _source(40)
    a = _labels(data.dataset_fn(source, _plan(seed=1), start_step=0, stop_step=15)(None))
    b = _labels(data.dataset_fn(source, _plan(seed=1), start_step=0, stop_step=15)(None))
    c = _labels(data.dataset_fn(source, _plan(seed=2), start_step=0, stop_step=15)(None))
    assert a == b and a != c


@pytest.mark.parametrize("start", [0, 1, 4, 5, 6, 13])
def test_resuming_at_step_t_yields_exactly_the_batches_from_t(start):
    source, plan = _source(40), _plan(global_batch=8, replicas=2, spe=5, epochs=3)
    full = _labels(data.dataset_fn(source, plan, start_step=0, stop_step=plan.total_steps)(None))
    resumed = _labels(data.dataset_fn(source, plan, start_step=start, stop_step=plan.total_steps)(None))
    assert resumed == full[start * 2:]


def test_steps_per_read_takes_about_four_mib_of_whole_steps():
    from tfdist.data import pipeline

    assert pipeline.steps_per_read(1024) == pipeline.MAX_STEPS_PER_READ  # small steps: capped
    assert pipeline.steps_per_read(pipeline.READ_BYTES // 5) == 5
    assert pipeline.steps_per_read(pipeline.READ_BYTES * 3) == 1  # a step above the budget: one at a time


@pytest.mark.parametrize("start, context", [(0, None), (7, None), (3, _Context(2, 1))])
def test_reading_several_steps_at_once_yields_the_batches_of_one_step_at_a_time(monkeypatch, start, context):
    # 3 epochs of 5 steps from 40 examples (1 example unused per epoch), 2 replicas, read in
    # groups of 4 steps that straddle epochs, the run's end and a resume position.
    from tfdist.data import pipeline

    source = data.ArraySource(np.arange(41 * 6, dtype=np.float32).reshape(41, 2, 3), np.arange(41, dtype=np.int64))
    plan = _plan(global_batch=8, replicas=2, spe=5, epochs=3)

    def batches(max_steps):
        monkeypatch.setattr(pipeline, "MAX_STEPS_PER_READ", max_steps)
        ds = data.dataset_fn(source, plan, start_step=start, stop_step=plan.total_steps)(context)
        return list(ds.as_numpy_iterator())

    one, grouped = batches(1), batches(4)
    assert len(one) == len(grouped) == (plan.total_steps - start) * (1 if context else 2)
    for (x1, y1), (x4, y4) in zip(one, grouped):
        assert x4.shape == x1.shape == (4, 2, 3) and y4.shape == y1.shape == (4,)
        assert np.array_equal(x1, x4) and np.array_equal(y1, y4)
        assert np.array_equal(x4, source.x[y4])  # each example with its own label


def test_a_far_position_is_reached_without_replaying_the_epoch():
    # 200,000 steps of one example each: start at step 199,990 and read the rest.
    source = data.ArraySource(np.zeros((200_000, 1), np.float32), np.arange(200_000))
    sizes = data.BatchSizes.resolve(num_replicas=1, batch_size=1)
    plan = data.DataPlan(sizes=sizes, steps_per_epoch=200_000, epochs=1, seed=0, shuffle=False)
    ds = data.dataset_fn(source, plan, start_step=199_990, stop_step=200_000)(None)
    assert _labels(ds) == [[i] for i in range(199_990, 200_000)]


def test_parameter_server_workers_take_interleaved_whole_steps_forever():
    source, plan = _source(40), _plan(global_batch=8, replicas=1, spe=5, epochs=1)
    full = _labels(data.dataset_fn(source, _plan(global_batch=8, replicas=1, spe=5, epochs=4), start_step=0, stop_step=20)(None))
    w0 = data.dataset_fn(source, plan, start_step=3, per_worker=True)(_Context(2, 0))
    w1 = data.dataset_fn(source, plan, start_step=3, per_worker=True)(_Context(2, 1))
    got0 = _labels(w0.take(6))
    got1 = _labels(w1.take(6))
    assert got0 == full[3:15:2] and got1 == full[4:16:2]  # past the run's end it keeps cycling epochs


def test_stream_source_resumes_by_skipping_and_matches_the_full_order():
    import tensorflow as tf

    xs = np.arange(60, dtype=np.float32).reshape(30, 2)
    stream = data.StreamSource(tf.data.Dataset.from_tensor_slices((xs, np.arange(30))).filter(lambda x, y: True))
    assert stream.num_examples is None
    sizes = data.BatchSizes.resolve(num_replicas=1, batch_size=4)
    spe = data.steps_per_epoch_for(stream, sizes, None)
    assert spe == 7
    plan = data.DataPlan(sizes=sizes, steps_per_epoch=spe, epochs=2, seed=3)
    full = _labels(data.dataset_fn(stream, plan, start_step=0, stop_step=plan.total_steps)(None))
    assert len(full) == 14 and full[:7] != full[7:]
    for start in (3, 7, 9):
        assert _labels(data.dataset_fn(stream, plan, start_step=start, stop_step=plan.total_steps)(None)) == full[start:]


@pytest.mark.parametrize("length", [None, 30])  # endless; 30 examples, read on over two passes
def test_a_stream_with_steps_per_epoch_reads_on_across_epochs_as_keras_and_resumes_at_any_step(length):
    import tensorflow as tf

    # A global seed of 0 (tf.random.set_seed(0), or a run with seed=0) once made TensorFlow compare
    # a tensor seed in Python while the passes were shuffled.
    tf.random.set_seed(0)
    try:
        _check_reading_on(length)
    finally:
        tf.random.set_seed(None)


def _check_reading_on(length):
    import tensorflow as tf

    stream = tf.data.Dataset.range(10**9 if length is None else length)
    source = data.StreamSource(stream.map(lambda i: (tf.cast(tf.fill([2], i), tf.float32), i)))
    sizes = data.BatchSizes.resolve(num_replicas=1, batch_size=4)
    order = None
    for shuffle in (False, True):
        plan = data.make_plan(source, sizes, steps_per_epoch=5, epochs=3, seed=3, shuffle=shuffle)
        assert plan.continuous and plan.order_record()["stream"] == "continuous"
        full = _labels(data.dataset_fn(source, plan, start_step=0, stop_step=plan.total_steps)(None))
        flat = sum(full, [])
        assert len(full) == 15
        if not shuffle:  # step s holds elements [4s, 4s + 4) of the passes one after another, as Keras reads them
            order = list(range(60)) if length is None else list(range(30)) * 2
            assert flat == order
        else:  # each pass shuffled with its own seed; an endless stream never repeats an element
            assert flat != order
            passes = [flat] if length is None else [flat[:30], flat[30:]]
            assert all(sorted(p) == sorted(set(p)) for p in passes)
            if length is not None:
                assert sorted(passes[0]) == sorted(passes[1]) == list(range(30)) and passes[0] != passes[1]
        for start in (3, 7, 11):  # resumed mid-epoch, in the second pass
            assert _labels(data.dataset_fn(source, plan, start_step=start, stop_step=plan.total_steps)(None)) \
                == full[start:]
        ps = data.dataset_fn(source, plan, start_step=2, per_worker=True)  # worker w: steps 2 + w, + 2, ...
        assert [_labels(ps(_Context(2, w)).take(4)) for w in (0, 1)] == [full[2:10:2], full[3:11:2]]
    # A run recorded before streams were read on (no "stream" in its order) resumes as it began: an epoch per pass.
    plan = data.make_plan(source, sizes, steps_per_epoch=5, epochs=3, seed=3, shuffle=False,
                          recorded_order={"order": ORDER_VERSION, "shuffle": False})
    assert not plan.continuous and "stream" not in plan.order_record()
    assert sum(_labels(data.dataset_fn(source, plan, start_step=0, stop_step=10)(None)), []) == list(range(20)) * 2


def test_a_dataset_that_yields_other_elements_on_each_pass_is_refused_for_checkpoints_with_the_fix():
    import tensorflow as tf

    examples = tf.data.Dataset.from_tensor_slices((np.arange(200, dtype=np.float32)[:, None], np.arange(200)))
    with pytest.raises(DataError, match=r"yields other elements on each pass .* first 64 elements differ between two "
                                        r"passes\. Fix: leave shuffling to tfdist"):
        data.StreamSource(examples.shuffle(200, seed=5)).fingerprint()  # reshuffle_each_iteration=True by default
    assert data.StreamSource(examples.shuffle(200, seed=5, reshuffle_each_iteration=False)).fingerprint() \
        != data.StreamSource(examples).fingerprint()


def test_invalid_data_is_refused_with_the_fix():
    import tensorflow as tf

    with pytest.raises(DataError, match="same first dimension"):
        data.ArraySource(np.zeros((3, 2)), np.zeros(4))
    # A list of one label per example is one array, NumPy's scalars included (not 8 outputs)...
    labels = np.arange(8) % 2
    assert np.array_equal(data.ArraySource(np.zeros((8, 2)), list(labels)).y, labels)
    # ...and a message about many arrays names the first few, not every one.
    with pytest.raises(DataError, match=r"y\[4\] of shape \(2,\), \.\.\. \(9 arrays in all\)\. Fix") as raised:
        data.ArraySource(np.zeros((3, 2)), [np.zeros(2)] * 8)
    assert "y[5]" not in str(raised.value)
    with pytest.raises(DataError, match="before .batch"):
        data.StreamSource(tf.data.Dataset.from_tensor_slices((np.zeros((4, 2)), np.zeros(4))).batch(2))
    with pytest.raises(DataError, match="unknown data"):
        data.load("imagenet")
    with pytest.raises(DataError, match="unsupported `data`"):
        data.as_source(42)


def test_digits_is_bundled_and_split_the_same_way_every_time():
    train, val = data.load_digits()
    assert train.num_examples + val.num_examples == 1797
    assert train.example_shape == (8, 8, 1) and float(train.x.max()) <= 1.0
    assert data.load_digits()[1].fingerprint() == val.fingerprint()


def test_npz_data(tmp_path):
    path = tmp_path / "d.npz"
    np.savez(path, x=np.random.rand(50, 4).astype(np.float32), y=np.arange(50) % 3)
    train, val = data.load(str(path))
    assert train.num_examples + val.num_examples == 50
    # On storage that is not a local disk (ram:// stands in for gs://): the same arrays.
    import tensorflow as tf

    remote = "ram://" + str(tmp_path / "remote" / "d.npz")
    tf.io.gfile.makedirs(remote.rsplit("/", 1)[0])
    tf.io.gfile.copy(str(path), remote)
    again, _ = data.load(remote)
    assert again.fingerprint() == train.fingerprint() and np.array_equal(again.x, train.x)
    assert np.array_equal(data.load_to_predict(remote).x, np.load(path)["x"])
    with pytest.raises(DataError, match=r"cannot read the .npz file; received data='ram://.*missing.npz' "
                                        r"\(FileNotFoundError"):
        data.load("ram://" + str(tmp_path / "missing.npz"))
    bad = tmp_path / "bad.npz"
    np.savez(bad, features=np.zeros(3))
    with pytest.raises(DataError, match="arrays named x and y"):
        data.load(str(bad))
    np.savez(bad, x=np.zeros((10, 2)), y=np.zeros(7))
    with pytest.raises(DataError, match="received x with 10 rows and y with 7"):
        data.load(str(bad))


def test_tfds_that_is_not_prepared_is_never_downloaded_and_names_the_fix(tmp_path):
    pytest.importorskip("tensorflow_datasets")
    from tfdist.data import tfds as tfds_mod

    with pytest.raises(DataError, match=r"not prepared in .*Fix: run `tfds build mnist`"):
        tfds_mod.load("mnist", data_dir=str(tmp_path))
    with pytest.raises(DataError, match="unknown TensorFlow Datasets name"):
        data.load("tfds:no_such_dataset_anywhere")


def test_arrays_stay_out_of_the_graph_except_under_parameter_servers(monkeypatch):
    source = data.ArraySource(np.ones((50_000, 20), np.float32), np.arange(50_000))  # 4 MB
    plan = _plan(global_batch=8, replicas=1, spe=5, epochs=1)
    ds = data.dataset_fn(source, plan, start_step=0, stop_step=5)(None)
    assert len(ds._as_serialized_graph().numpy()) < 100_000  # gathered from the NumPy arrays in place
    assert [y.tolist() for _, y in ds.as_numpy_iterator()] == _labels(ds)
    embedded = data.dataset_fn(source, plan, start_step=0, per_worker=True)(_Context(1, 0))
    assert len(embedded._as_serialized_graph().numpy()) > 4_000_000
    monkeypatch.setattr(data.arrays, "MAX_EMBEDDED_BYTES", 1 << 20)
    with pytest.raises(DataError, match=r"4 MiB is too large to send to parameter-server workers.*TFRecordSource"):
        data.dataset_fn(source, plan, start_step=0, per_worker=True)(_Context(1, 0))


def test_the_order_is_a_seeded_permutation_computed_per_position():
    import tensorflow as tf

    order = epoch_permutation(1000, 3, 0, True).numpy()
    assert sorted(order) == list(range(1000)) and order.tolist() != list(range(1000))
    assert not np.array_equal(order, epoch_permutation(1000, 3, 1, True).numpy())
    # Neighbouring positions land far apart (one round of index_shuffle leaves them correlated).
    assert abs(np.corrcoef(order[:-1], order[1:])[0, 1]) < 0.1
    some = data.order.example_order(1000, 3, 0, True, tf.constant([5, 500, 999], tf.int64)).numpy()
    assert some.tolist() == order[[5, 500, 999]].tolist()
    source, plan = _source(40), _plan(global_batch=8, replicas=1, spe=5, epochs=1, seed=3)
    first = _labels(data.dataset_fn(source, plan, start_step=0, stop_step=5)(None))
    assert sum(first, []) == epoch_permutation(40, 3, 0, True).numpy().tolist()


def test_a_stream_warns_of_its_costs_and_names_the_file_source(caplog):
    import tensorflow as tf

    stream = data.StreamSource(tf.data.Dataset.from_tensor_slices((np.zeros((20, 2)), np.arange(20))))
    sizes = data.BatchSizes.resolve(num_replicas=1, batch_size=4)
    with caplog.at_level("WARNING", logger="tfdist"):
        plan = data.make_plan(stream, sizes, steps_per_epoch=None, epochs=1, seed=0)
    assert plan.steps_per_epoch == 5
    assert "every worker reads and decodes the whole stream" in caplog.text and "TFRecordSource" in caplog.text
    first = stream.fingerprint()
    changed = data.StreamSource(tf.data.Dataset.from_tensor_slices((np.zeros((20, 2)), np.arange(20) % 7)))
    assert changed.fingerprint() != first  # more than the first element is hashed


class _OnePipeline:
    """A strategy whose one input pipeline feeds every replica (as mirrored's does)."""

    @staticmethod
    def distribute_datasets_from_function(make):
        return make(None)


def _stateful_ops_in_functions(ds) -> set:
    from tensorflow.core.framework import graph_pb2
    from tensorflow.python.framework import op_def_registry

    graph = graph_pb2.GraphDef.FromString(ds._as_serialized_graph().numpy())
    ops = {node.op for function in graph.library.function for node in function.node_def}
    return {op for op in ops if op_def_registry.get(op) is not None and op_def_registry.get(op).is_stateful}


@pytest.mark.parametrize("replicas", [1, 2, 3])
def test_validation_gives_each_replica_its_part_and_runs_no_stateful_op(replicas):
    # A stateful op in a dataset function (Dataset.from_tensors in a flat_map did it) makes
    # tf.data's determinism rewrite turn the pipeline sequential under deterministic=True.
    sizes = data.BatchSizes.resolve(num_replicas=replicas, per_replica_batch_size=8)
    ds, steps = data.validation_input(_source(n=30), sizes, strategy=_OnePipeline())
    assert _stateful_ops_in_functions(ds) == set()
    labels = _labels(ds)
    assert len(labels) == steps * replicas
    bounds = [r * 30 // replicas for r in range(replicas + 1)]
    for r in range(replicas):  # element s * replicas + r: replica r's s-th batch of its contiguous part
        mine = [y for batch in labels[r::replicas] for y in batch]
        assert mine == list(range(bounds[r], bounds[r + 1]))
