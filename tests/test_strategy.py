"""The auto rule, strategy options, and `tfdist env` under faked environments."""

import json
import os
import signal
import sys

import pytest

from tfdist import strategy
from tfdist.cluster import ClusterSpec, parse_tf_config
from tfdist.errors import StrategyError

from conftest import base_env, free_port

PS = {"cluster": {"chief": ["c:1"], "worker": ["w:1", "w:2"], "ps": ["p:1"]}, "task": {"type": "chief", "index": 0}}
MW = {"cluster": {"worker": ["w:1", "w:2"]}, "task": {"type": "worker", "index": 0}}
ONE = {"cluster": {"worker": ["w:1"]}, "task": {"type": "worker", "index": 0}}


@pytest.mark.parametrize(
    "config, gpus, name, reason",
    [
        (PS, 0, "parameter_server", "1 ps and 2 worker"),
        (PS, 4, "parameter_server", "1 ps"),
        (MW, 0, "multi_worker_mirrored", "TF_CONFIG lists 2 workers"),
        (MW, 8, "multi_worker_mirrored", "2 workers"),
        (ONE, 2, "mirrored", "2 GPUs"),
        (None, 2, "mirrored", "2 GPUs on this machine"),
        (None, 1, "one_device", "1 GPU"),
        (None, 0, "one_device", "no GPU"),
    ],
)
def test_auto_rule_order_and_reason(config, gpus, name, reason):
    spec = parse_tf_config(config) if config else ClusterSpec()
    choice = strategy.choose(spec, num_gpus=gpus)
    assert choice.name == name
    assert reason in choice.reason


def test_auto_replicates_over_several_devices_given_unless_the_cluster_has_several_tasks():
    cpus = ("/device:CPU:0", "/device:CPU:1")
    given = strategy.choose(ClusterSpec(), num_gpus=0, devices=cpus)
    assert given.name == "mirrored" and "2 devices given (/device:CPU:0, /device:CPU:1)" == given.reason
    assert strategy.choose(ClusterSpec(), num_gpus=0, devices=cpus[:1]).name == "one_device"
    assert strategy.choose(parse_tf_config(MW), num_gpus=0, devices=cpus).name == "multi_worker_mirrored"


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"devices": "/cpu:0"}, "devices"),
        ({"devices": ()}, "devices"),
        ({"all_reduce": "magic"}, "all_reduce"),
        ({"bytes_per_pack": -1}, "bytes_per_pack"),
        ({"collective_timeout": 0}, "collective_timeout"),
        ({"startup_timeout": -5}, "startup_timeout"),
    ],
)
def test_options_validate_themselves(kwargs, field):
    with pytest.raises(StrategyError, match=f"`{field}`"):
        strategy.StrategyOptions(**kwargs)


def test_unknown_name_and_mismatched_cluster():
    with pytest.raises(StrategyError, match="received strategy='best'"):
        strategy.resolve_name("best", ClusterSpec())
    with pytest.raises(StrategyError, match="several tasks"):
        strategy.make_strategy("mirrored", cluster=parse_tf_config(MW))
    with pytest.raises(StrategyError, match="needs a cluster with ps"):
        strategy.make_strategy("parameter_server", cluster=ClusterSpec())


def test_nccl_on_a_machine_without_gpus_is_refused():
    with pytest.raises(StrategyError, match="needs GPUs"):
        strategy.make_strategy("mirrored", cluster=ClusterSpec(), all_reduce="nccl")


@pytest.mark.parametrize("name, devices", [
    ("mirrored", ["/cpu:0", "/cpu:63"]),  # a CPU split that did not happen (TensorFlow had started)
    ("mirrored", ["/gpu:62", "/gpu:63"]),  # GPU names on a machine without them: NCCL chosen, then a crash
    ("central_storage", ["/cpu:0", "/cpu:63"]),
    ("one_device", ["/gpu:63"]),
])
def test_devices_this_machine_does_not_have_are_refused_before_training(name, devices):
    with pytest.raises(StrategyError, match=r"device '/[cg]pu:6[23]' does not exist on this machine; received "
                                            r"devices=.*Fix: .*tfdist.split_cpu\(2\)"):
        strategy.make_strategy(name, cluster=ClusterSpec(), devices=devices)


def test_one_device_is_made_once_and_reused():
    import tensorflow as tf

    first = strategy.make_strategy("one_device", cluster=ClusterSpec())
    assert isinstance(first, strategy.OneDevice) and isinstance(first.tf, tf.distribute.OneDeviceStrategy)
    assert strategy.make_strategy("one_device", cluster=ClusterSpec()) is first
    assert first.name == "one_device"
    assert strategy.make_strategy(first) is first
    assert strategy.make_strategy(first.tf) is first  # the strategy tfdist made for it, not a second wrapper
    ready = tf.distribute.OneDeviceStrategy("/cpu:0")
    wrapped = strategy.make_strategy(ready)
    assert wrapped.tf is ready and wrapped.name == "one_device" and wrapped.all_reduce is None


# --- the strategy object -------------------------------------------------------------------


@pytest.mark.parametrize("name, coordinated, per_worker, replica_variables, aggregating, concurrent, merge_call", [
    ("one_device", False, False, True, False, False, False),
    ("mirrored", False, False, True, False, False, True),
    ("multi_worker_mirrored", False, False, True, False, False, True),
    ("central_storage", False, False, False, True, False, True),
    ("parameter_server", True, True, False, False, True, False),
])
def test_each_kind_answers_what_it_means_for_training(name, coordinated, per_worker, replica_variables, aggregating,
                                                      concurrent, merge_call):
    kind = strategy.KINDS[name]
    assert kind.name == name
    assert (kind.coordinated, kind.per_worker_input, kind.replica_variables, kind.aggregating_variables,
            kind.concurrent_updates, kind.merge_call_in_step) == (
        coordinated, per_worker, replica_variables, aggregating, concurrent, merge_call)


@pytest.mark.parametrize("name, config, traits, trains_on_worker", [
    ("one_device", None, (False, 1, False), True),
    ("mirrored", ONE, (False, 1, False), True),
    ("multi_worker_mirrored", MW, (False, 2, True), True),
    ("multi_worker_mirrored", ONE, (False, 1, False), True),
    ("parameter_server", PS, (True, 2, False), False),
])
def test_traits_follow_the_kind_and_the_cluster(name, config, traits, trains_on_worker):
    cluster = parse_tf_config(config) if config else ClusterSpec()
    made = strategy.KINDS[name](object(), cluster=cluster)  # the traits need no TensorFlow strategy
    got = made.traits
    assert got.name == name and (got.coordinated, got.step_tasks, got.multi_process) == traits
    assert got.synchronous is not got.coordinated
    worker = parse_tf_config({**(config or MW), "task": {"type": "worker", "index": 0}})
    assert strategy.KINDS[name].trains_on(worker) is trains_on_worker
    assert strategy.trains_here(name, worker) is trains_on_worker if name != "one_device" else True


def test_xla_is_refused_where_the_kind_cannot_compile_the_step():
    ring = strategy.MultiWorkerMirrored(object(), cluster=ClusterSpec(), all_reduce="ring")
    assert "ring all-reduce" in ring.xla_unavailable()
    assert strategy.MultiWorkerMirrored(object(), cluster=ClusterSpec(), all_reduce="nccl").xla_unavailable() is None


def test_a_users_own_tensorflow_strategy_is_wrapped_by_its_class():
    import tensorflow as tf

    for tf_strategy, kind in ((tf.distribute.OneDeviceStrategy("/cpu:0"), strategy.OneDevice),
                              (tf.distribute.MirroredStrategy(["/cpu:0"]), strategy.Mirrored),
                              (tf.distribute.get_strategy(), strategy.OneDevice)):  # the default: no scope entered
        wrapped = strategy.wrap(tf_strategy, cluster=ClusterSpec())
        assert type(wrapped) is kind and wrapped.tf is tf_strategy and wrapped.all_reduce is None
        assert strategy.wrap(wrapped) is wrapped
        assert strategy.traits(tf_strategy, ClusterSpec()).name == kind.name


def test_the_object_hands_tensorflows_api_to_its_strategy():
    import tensorflow as tf

    made = strategy.make_strategy("one_device", cluster=ClusterSpec())
    with made.scope():
        assert tf.distribute.get_strategy() is made.tf
    assert made.num_replicas_in_sync == made.tf.num_replicas_in_sync == 1
    result = made.run(lambda x: x * 2, args=(tf.constant(3),))
    assert int(made.reduce(tf.distribute.ReduceOp.SUM, result, axis=None)) == 6
    assert made.sum_over_workers([1, 0, 5]) == [1, 0, 5]  # one worker: its own values
    assert made.coordinator is None and made.call_as_step(lambda x: x + 1, tf.constant(1)) == 2
    assert "OneDevice(OneDeviceStrategy, 1 replica(s))" == repr(made)


def test_central_storage_gives_keras_variables_an_aggregation_in_its_building_scope():
    import tensorflow as tf

    made = strategy.make_strategy("central_storage", cluster=ClusterSpec())
    with made.building_scope():
        statistic = tf.Variable(1.0, trainable=False, dtype=tf.float32)  # Keras names the dtype
        seed = tf.Variable(1, trainable=False, dtype=tf.int64)
    with made.scope():
        plain = tf.Variable(1.0, trainable=False)
    assert statistic.aggregation == tf.VariableAggregation.MEAN
    assert seed.aggregation == tf.VariableAggregation.ONLY_FIRST_REPLICA
    assert plain.aggregation == tf.VariableAggregation.NONE


def test_fit_trains_under_a_name_the_strategy_object_or_a_users_own_tensorflow_strategy():
    import keras
    import numpy as np
    import tensorflow as tf

    import tfdist

    x = np.random.default_rng(0).normal(size=(32, 3)).astype("float32")
    y = (x[:, 0] > 0).astype("int64")

    def build():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    made = strategy.make_strategy("one_device", cluster=ClusterSpec())
    users = tf.distribute.MirroredStrategy(["/cpu:0"])
    for given, tf_strategy, name, all_reduce in (("one_device", made.tf, "one_device", None),
                                                 (made, made.tf, "one_device", None),
                                                 (users, users, "mirrored", None)):  # TensorFlow chose its all-reduce
        history = tfdist.fit(build, x, y, epochs=1, batch_size=8, strategy=given, seed=0, verbose=0)
        assert history.model.distribute_strategy is tf_strategy
        assert (history.tfdist.strategy, history.tfdist.all_reduce) == (name, all_reduce)


class _NotAStrategy:
    pass


@pytest.mark.parametrize("given, message", [
    (42, "Invalid `strategy`; received int. Fix: "),
    (_NotAStrategy(), "Invalid `strategy`; received _NotAStrategy. Fix: "),
])
def test_bad_strategies_are_refused_in_one_line(given, message):
    for call in (strategy.wrap, strategy.make_strategy):
        with pytest.raises(StrategyError) as error:
            call(given)
        assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_a_tensorflow_strategy_of_an_unknown_class_is_refused_in_one_line():
    import tensorflow as tf

    class OwnStrategy(tf.distribute.Strategy):
        def __init__(self):  # no extended: only its class matters here
            pass

    with pytest.raises(StrategyError, match=r"^tfdist runs under tf.distribute's OneDeviceStrategy, .*; received a "
                                            r"OwnStrategy\. Fix: ") as error:
        strategy.wrap(OwnStrategy())
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    "config, expected",
    [
        (None, {"strategy": "one_device", "task_type": None, "num_workers": 1, "num_ps": 0}),
        (MW, {"strategy": "multi_worker_mirrored", "task_type": "worker", "task_index": 0, "num_workers": 2}),
        (PS, {"strategy": "parameter_server", "task_type": "chief", "num_workers": 3, "num_ps": 1}),
        (
            {"cluster": {"master": ["m:1"], "worker": ["w:1"]}, "task": {"type": "worker", "index": 0}, "environment": "cloud"},
            {"strategy": "multi_worker_mirrored", "task_type": "worker", "num_workers": 2, "environment": "cloud"},
        ),
    ],
)
def test_env_json_reports_the_auto_choice(monkeypatch, capsys, config, expected):
    from tfdist.cli import main

    if config is None:
        monkeypatch.delenv("TF_CONFIG", raising=False)
    else:
        monkeypatch.setenv("TF_CONFIG", json.dumps(config))
    assert main(["env", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    for key in ("strategy", "reason", "task_type", "task_index", "num_workers", "num_ps", "devices"):
        assert key in info
    for key, value in expected.items():
        assert info[key] == value, key


def test_env_with_invalid_tf_config_exits_nonzero_with_one_line(procs):
    code, out = procs.run([sys.executable, "-m", "tfdist", "env", "--json"], timeout=60,
                          env=base_env(TF_CONFIG='{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 5}}'))
    assert code == 2
    assert "Traceback" not in out
    errors = [line for line in out.splitlines() if line.startswith("tfdist: error:")]
    assert len(errors) == 1 and "task.index; received 5" in errors[0]


def test_mirrored_and_central_storage_replicate_over_every_logical_cpu_by_default(procs):
    script = (
        "import json, logging, tfdist\n"
        "logging.basicConfig(level=logging.INFO, format='%(name)s: %(message)s')\n"
        "tfdist.split_cpu(2)\n"
        "print(json.dumps({name: tfdist.make_strategy(name).num_replicas_in_sync\n"
        "                  for name in ('mirrored', 'central_storage')}))\n"
    )
    code, out = procs.run([sys.executable, "-c", script], timeout=120, env=base_env())
    assert code == 0, out[-3000:]
    assert json.loads(out.strip().splitlines()[-1]) == {"mirrored": 2, "central_storage": 2}
    # The all-reduce's reason counts those replicas (it said "one replica" for them).
    assert "tfdist: all-reduce reduce_to_one: 2 of 2 replicas on CPU devices" in out, out[-3000:]


def test_help_does_not_import_tensorflow(procs):
    code, out = procs.run(
        [sys.executable, "-c", "import sys; from tfdist.cli import main\n"
         "for c in ([], ['train'], ['env'], ['ckpt'], ['launch'], ['cluster'], ['plan']):\n"
         "    try: main([*c, '--help'])\n"
         "    except SystemExit: pass\n"
         "assert 'tensorflow' not in sys.modules, 'tensorflow imported'\nprint('ok')"],
        timeout=60,
    )
    assert code == 0 and out.strip().endswith("ok"), out[-2000:]


_STUCK = """
import sys, time
from tfdist.cluster import parse_tf_config
from tfdist.startup import startup_watchdog
cluster = parse_tf_config('{"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, "task": {"type": "worker", "index": 0}}')
with startup_watchdog(cluster, float(sys.argv[1])):
    time.sleep(float(sys.argv[2]))
print("left the block")
"""


@pytest.mark.parametrize("timeout, stuck_for, killed", [(1.0, 60.0, True), (30.0, 0.1, False)])
def test_the_startup_watchdog_kills_a_process_stuck_past_its_timeout(procs, timeout, stuck_for, killed):
    code, out = procs.run([sys.executable, "-c", _STUCK, str(timeout), str(stuck_for)], timeout=50, env=base_env())
    if killed:
        assert code == -9 and "the cluster did not form within 1 s: a peer (worker:1) answered but never joined" in out, out
    else:
        assert code == 0 and "left the block" in out and "error" not in out, out


@pytest.mark.timeout(120)
def test_a_serving_ps_task_stops_at_ctrl_c_and_says_a_fault_aimed_at_it_never_fires(procs, tmp_path, ctrl_c):
    # A ps or parameter-server worker task serves until stopped; Ctrl-C in its terminal stops it
    # (TensorFlow's server.join() waits where Python's SIGINT handler never runs).
    ports = [free_port() for _ in range(3)]
    config = {"cluster": {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"],
                          "ps": [f"127.0.0.1:{ports[2]}"]}, "task": {"type": "ps", "index": 0}}
    task = procs.start([sys.executable, "-m", "tfdist", "train", "--output-dir", str(tmp_path)],
                       env=base_env(TF_CONFIG=json.dumps(config), TFDIST_FAULT="ps:0/kill_at_step:3"))
    lines = []
    for line in task.stdout:  # until it serves (the test's timeout bounds the wait)
        lines.append(line)
        if "serving as ps:0" in line:
            break
    assert task.poll() is None, "".join(lines)[-3000:]
    # A fault drill aimed at a task without a training loop would test nothing: said.
    assert next(task.stdout).startswith("tfdist: TFDIST_FAULT names ps:0, which serves the parameter servers' chief "
                                        "and runs no training loop: its faults never fire; name chief:0")
    os.killpg(task.pid, signal.SIGINT)
    out, _ = task.communicate(timeout=30)
    assert task.returncode == 130, "".join(lines)[-2000:] + out[-2000:]
    assert "tfdist: interrupted by Ctrl-C: ps:0 stopped serving" in out and "Traceback" not in out, out[-3000:]


def test_a_serving_task_ends_after_a_new_complete_checkpoint_once_the_chief_is_gone(tmp_path):
    import socket as socket_mod

    from tfdist import startup
    from tfdist.checkpoint import layout
    from tfdist.cluster import ClusterSpec

    def save(step: int, *, complete: bool) -> None:
        run = layout.RunMetadata(global_batch_size=8, data_fingerprint="d", model_fingerprint="m", seed=0)
        prefix = layout.prefix_for(str(tmp_path), step)
        layout.write_metadata(prefix, layout.Metadata.of(run, global_step=step, epoch=0, step_in_epoch=step,
                                                         complete=complete, history=[]))
        layout.write_state(str(tmp_path), [prefix])
        for suffix in (".index", ".data-00000-of-00001"):
            open(prefix + suffix, "wb").close()

    chief = socket_mod.socket()
    chief.bind(("127.0.0.1", 0))
    chief.listen()
    address = f"127.0.0.1:{chief.getsockname()[1]}"
    cluster = ClusterSpec(jobs={"chief": [address], "worker": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"]},
                          task_type="ps", task_index=0)
    save(4, complete=True)  # a finished run, started again for more epochs: not the end of this one
    end = startup._RunEnd(cluster, str(tmp_path))
    save(8, complete=False)
    assert not end.over() and not end.over()
    save(12, complete=True)
    assert not end.over() and not end.over()  # the chief still listens: it exports the model from the ps
    chief.close()
    assert not end.over()  # one look without the chief: it may be restarting
    assert end.over()
    restarted = startup._RunEnd(cluster, str(tmp_path))  # started on the finished run: its chief says so and ends
    assert not restarted.over() and not restarted.over()
