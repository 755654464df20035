"""The GPU paths guarded without a GPU: the auto and all-reduce rules under faked device
counts, NCCL refused with one line, the mixed-precision warnings, and benchmarks/gpu.py."""

import json
import logging
import os
import sys

import pytest

from tfdist import strategy
from tfdist.training import keras2 as keras_model
from tfdist.cluster import ClusterSpec, parse_tf_config
from tfdist.errors import StrategyError

from conftest import REPO, base_env

MIRRORED, MWM = strategy.MIRRORED, strategy.MULTI_WORKER_MIRRORED
CARVED = strategy.nccl_unavailable_reason(physical_gpus=1, logical_gpus=2, nccl_kernels=True)
NO_KERNELS = strategy.nccl_unavailable_reason(physical_gpus=4, logical_gpus=4, nccl_kernels=False)


def test_nccl_unavailable_reason():
    assert strategy.nccl_unavailable_reason(physical_gpus=8, logical_gpus=8, nccl_kernels=True) is None
    assert "2 GPUs are logical devices carved from 1 physical GPU" in CARVED
    assert "no NCCL kernels" in NO_KERNELS


@pytest.mark.parametrize(
    "name, kwargs, expected, reason",
    [
        # mirrored, auto: the rule's order
        (MIRRORED, dict(num_gpus=0), "reduce_to_one", "one replica"),
        (MIRRORED, dict(num_gpus=1), "reduce_to_one", "one replica"),
        (MIRRORED, dict(num_gpus=0, num_devices=2), "reduce_to_one", "2 of 2 replicas on CPU devices"),
        (MIRRORED, dict(num_gpus=1, num_devices=2), "reduce_to_one", "1 of 2 replicas on CPU"),
        (MIRRORED, dict(num_gpus=2, nccl_unavailable=CARVED), "reduce_to_one", "logical devices"),
        (MIRRORED, dict(num_gpus=4, nccl_unavailable=NO_KERNELS), "reduce_to_one", "no NCCL kernels"),
        (MIRRORED, dict(num_gpus=2), "nccl", "2 GPUs on one machine"),
        (MIRRORED, dict(num_gpus=8), "nccl", "8 GPUs"),
        # mirrored, by name
        (MIRRORED, dict(requested="hierarchical_copy", num_gpus=2, nccl_unavailable=CARVED), "hierarchical_copy", "by name"),
        (MIRRORED, dict(requested="reduce_to_one", num_gpus=8), "reduce_to_one", "by name"),
        (MIRRORED, dict(requested="nccl", num_gpus=4), "nccl", "by name"),
        # multi_worker_mirrored
        (MWM, dict(num_gpus=0), "ring", "no GPU replicas"),
        (MWM, dict(num_gpus=1), "nccl", "1 GPU replica"),
        (MWM, dict(num_gpus=4), "nccl", "4 GPU replica"),
        (MWM, dict(num_gpus=2, nccl_unavailable=CARVED), "ring", "logical devices"),
        (MWM, dict(requested="ring", num_gpus=4), "ring", "by name"),
        # strategies without an all-reduce
        (strategy.ONE_DEVICE, dict(num_gpus=1), "none", "one replica"),
        (strategy.CENTRAL_STORAGE, dict(num_gpus=2), "none", "parameter device"),
        (strategy.PARAMETER_SERVER, dict(requested="nccl", num_gpus=2), "none", "all_reduce='nccl' does not apply"),
    ],
)
def test_all_reduce_rule(name, kwargs, expected, reason):
    choice = strategy.choose_all_reduce(name, **kwargs)
    assert choice.name == expected, choice
    assert reason in choice.reason, choice


@pytest.mark.parametrize(
    "name, kwargs, message",
    [
        (MIRRORED, dict(requested="nccl", num_gpus=0), r"needs GPUs; received it with 0 GPU\(s\) among 1 replica"),
        (MIRRORED, dict(requested="nccl", num_gpus=0, num_devices=2), r"0 GPU\(s\) among 2 replica device"),
        (MIRRORED, dict(requested="nccl", num_gpus=2, nccl_unavailable=CARVED), "cannot run here: the 2 GPUs are logical"),
        (MIRRORED, dict(requested="ring", num_gpus=2), "mirrored does not support all_reduce='ring'"),
        (MIRRORED, dict(requested="hierarchical_copy", num_gpus=3), "even number of replicas; received 3 devices"),
        (MWM, dict(requested="nccl", num_gpus=0), "needs GPUs.*Fix: use all_reduce='ring' or 'auto'"),
        (MWM, dict(requested="nccl", num_gpus=2, nccl_unavailable=NO_KERNELS), "no NCCL kernels.*it picks ring"),
        (MWM, dict(requested="hierarchical_copy", num_gpus=2), "multi_worker_mirrored does not support"),
    ],
)
def test_all_reduce_refusals_are_one_line_with_a_fix(name, kwargs, message):
    with pytest.raises(StrategyError, match=message) as info:
        strategy.choose_all_reduce(name, **kwargs)
    text = str(info.value)
    assert "\n" not in text and "Fix:" in text


@pytest.mark.parametrize(
    "config, gpus, name, all_reduce",
    [
        (None, 0, "one_device", "none"),
        (None, 1, "one_device", "none"),
        (None, 2, "mirrored", "nccl"),
        (None, 8, "mirrored", "nccl"),
        ({"cluster": {"worker": ["w:1", "w:2"]}, "task": {"type": "worker", "index": 0}}, 0, MWM, "ring"),
        ({"cluster": {"worker": ["w:1", "w:2"]}, "task": {"type": "worker", "index": 0}}, 4, MWM, "nccl"),
    ],
)
def test_auto_strategy_then_all_reduce_on_a_faked_gpu_machine(monkeypatch, config, gpus, name, all_reduce):
    """resolve_name and all_reduce_for read the device list through local_gpus/_gpu_facts only."""
    monkeypatch.setattr(strategy, "local_gpus", lambda: [f"/physical_device:GPU:{i}" for i in range(gpus)])
    monkeypatch.setattr(strategy, "_gpu_facts", lambda: (gpus, gpus, True))
    cluster = parse_tf_config(config) if config else ClusterSpec()
    choice = strategy.resolve_name("auto", cluster)
    assert choice.name == name
    assert strategy.all_reduce_for(choice.name).name == all_reduce


def test_explicit_devices_decide_mirrored_all_reduce(monkeypatch):
    monkeypatch.setattr(strategy, "local_gpus", lambda: ["/physical_device:GPU:0", "/physical_device:GPU:1"])
    monkeypatch.setattr(strategy, "_gpu_facts", lambda: (2, 2, True))
    assert strategy.all_reduce_for(MIRRORED, devices=["/gpu:0", "/gpu:1"]).name == "nccl"
    assert strategy.all_reduce_for(MIRRORED, devices=["/cpu:0", "/cpu:1"]).name == "reduce_to_one"
    with pytest.raises(StrategyError, match="needs GPUs"):
        strategy.all_reduce_for(MIRRORED, requested="nccl", devices=["/gpu:0", "/cpu:0"])
    # Two logical GPUs carved from one physical GPU: NCCL cannot run there.
    monkeypatch.setattr(strategy, "_gpu_facts", lambda: (1, 2, True))
    assert "logical devices" in strategy.all_reduce_for(MIRRORED).reason
    with pytest.raises(StrategyError, match="cannot run here"):
        strategy.all_reduce_for(MIRRORED, requested="nccl")


def test_this_cpu_machine_facts():
    """No GPU here: every GPU-only choice is refused and auto takes the CPU paths."""
    assert strategy.local_gpus() == []
    assert strategy.all_reduce_for(MIRRORED).name == "reduce_to_one"
    assert strategy.all_reduce_for(MWM).name == "ring"
    with pytest.raises(StrategyError, match="needs GPUs"):
        strategy.all_reduce_for(MWM, requested="nccl")


def test_communication_options_carry_the_choice():
    import tensorflow as tf

    options, chosen = strategy._communication_options(strategy.StrategyOptions(collective_timeout=5.0))
    assert chosen == "ring"  # what FitSummary.all_reduce reports
    assert options.implementation == tf.distribute.experimental.CommunicationImplementation.RING
    assert options.timeout_seconds == 5.0


def test_mirrored_logs_its_all_reduce_once(monkeypatch):
    monkeypatch.setattr(strategy, "_CREATED", {})  # made here, whatever other tests made before
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("tfdist")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        first = strategy.make_strategy("mirrored", cluster=ClusterSpec(), devices=["/cpu:0"])
        again = strategy.make_strategy("mirrored", cluster=ClusterSpec(), devices=["/cpu:0"])
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    assert first is again
    lines = [r.getMessage() for r in records if r.getMessage().startswith("all-reduce ")]
    assert lines == ["all-reduce reduce_to_one: one replica: nothing to all-reduce"], lines


def test_env_shows_the_all_reduce_on_a_faked_gpu_machine(monkeypatch, capsys):
    from tfdist.cli import main

    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.setattr(strategy, "local_gpus", lambda: ["/physical_device:GPU:0", "/physical_device:GPU:1"])
    monkeypatch.setattr(strategy, "_gpu_facts", lambda: (2, 2, True))
    assert main(["env", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["gpus"], info["strategy"], info["all_reduce"]) == (2, "mirrored", "nccl")
    assert "2 GPUs on one machine" in info["all_reduce_reason"]
    assert main(["env"]) == 0
    assert "all-reduce: nccl  (2 GPUs on one machine: NCCL)" in capsys.readouterr().out


@pytest.mark.parametrize("extra, detail", [([], "0 GPU(s) among 1 replica"), (["--cpu-devices", "2"], "0 GPU(s) among 2 replica")])
def test_train_with_nccl_on_a_cpu_machine_exits_2_with_one_line(procs, tmp_path, extra, detail):
    code, out = procs.tfdist("train", "--strategy", "mirrored", "--all-reduce", "nccl", "--epochs", "1",
                             "--steps-per-epoch", "1", "--output-dir", str(tmp_path / "run"), *extra, timeout=120)
    assert code == 2, out[-3000:]
    assert "Traceback" not in out
    errors = [line for line in out.splitlines() if line.startswith("tfdist: error:")]
    assert len(errors) == 1, out[-3000:]
    assert "all_reduce='nccl' needs GPUs" in errors[0] and detail in errors[0] and "Fix:" in errors[0]
    assert not (tmp_path / "run" / "checkpoints").exists() or not os.listdir(tmp_path / "run" / "checkpoints")


@pytest.mark.parametrize(
    "precision, capabilities, expected",
    [
        ("float32", [], None),
        ("mixed_float16", [], "no GPU"),
        ("mixed_bfloat16", [], "no GPU"),
        ("mixed_float16", [(6, 1)], "compute capability 6.1: no Tensor Cores"),
        ("mixed_float16", [(8, 0), (6, 0)], "compute capability 6.0"),  # the slowest GPU decides
        ("mixed_float16", [(7, 0)], None),
        ("mixed_float16", [(9, 0)], None),
        ("mixed_bfloat16", [(7, 5)], "compute capability 7.5: bfloat16 math is fast from 8.0"),
        ("mixed_bfloat16", [(6, 0)], "compute capability 6.0"),
        ("mixed_bfloat16", [(8, 0)], None),
        ("mixed_bfloat16", [(9, 0), (9, 0)], None),
    ],
)
def test_precision_warning(precision, capabilities, expected):
    warning = keras_model.precision_warning(precision, gpu_capabilities=capabilities)
    if expected is None:
        assert warning is None
    else:
        assert expected in warning
    if warning and precision == "mixed_bfloat16" and capabilities and min(capabilities) >= (7, 0):
        assert "mixed_float16 is fast on this GPU" in warning


@pytest.mark.parametrize("capability, warned", [((6, 0), True), ((8, 6), False)])
def test_precision_policy_warns_under_faked_device_details(monkeypatch, capability, warned):
    import tensorflow as tf
    import tf_keras

    fake = tf.config.PhysicalDevice(name="/physical_device:GPU:0", device_type="GPU")
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: [fake] if kind == "GPU" else [])
    monkeypatch.setattr(tf.config.experimental, "get_device_details", lambda device: {"compute_capability": capability})
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("tfdist").addHandler(handler)
    try:
        with keras_model.precision_policy("mixed_float16"):
            assert tf_keras.mixed_precision.global_policy().name == "mixed_float16"
    finally:
        logging.getLogger("tfdist").removeHandler(handler)
    assert tf_keras.mixed_precision.global_policy().name == "float32"
    messages = [r.getMessage() for r in records if r.levelno == logging.WARNING]
    assert bool(messages) == warned, messages
    if warned:
        assert "compute capability 6.0" in messages[0]


def test_gpu_benchmark_without_a_gpu_says_so_and_exits_0(procs):
    code, out = procs.run([sys.executable, os.path.join(REPO, "benchmarks", "gpu.py"), "--quick"], timeout=120,
                          env=base_env())
    assert code == 0, out[-3000:]
    assert "no GPU" in out and "--allow-cpu" in out
    assert "Markdown" not in out  # nothing was measured


def test_gpu_benchmark_refuses_an_unknown_precision_in_one_line(procs):
    code, out = procs.run([sys.executable, os.path.join(REPO, "benchmarks", "gpu.py"), "--precisions", "float32,fp8"],
                          timeout=60, env=base_env())
    assert code == 2, out[-3000:]
    assert "--precisions: expected a comma-separated subset of float32, mixed_float16, mixed_bfloat16, got 'float32,fp8'" in out
    assert "Traceback" not in out
