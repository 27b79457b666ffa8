"""Device resolution and the NVML meter. Without a GPU these run against tests/fake_nvml.py (labelled FAKE);
the test marked ``gpu`` runs the real NVML path wherever a GPU exists."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from functools import partial
from pathlib import Path

import pytest

from autotune.core.errors import DeviceError, InputError
from autotune.core.protocol import Outcome
from autotune.hardware.devices import gpu_count, resolve_device
from autotune.hardware.meters import NvmlMeter, RssMeter
from autotune.trials._shim import descendants
from autotune.trials.command import TrialCommand
from autotune.trials.measurement import MeasureSpec, measure
from autotune.trials.result import TrialResult
from autotune.trials.settings import TrialSettings

from conftest import EXAMPLES, SCRIPTS, MiB, in_a_fresh_interpreter
from fake_nvml import FakeGpu, FakeNvml, NVMLError


@pytest.fixture
def fake(tmp_path: Path) -> FakeNvml:
    return FakeNvml(
        gpus=[
            FakeGpu("GPU-aaaa", usage_file=tmp_path / "gpu0"),
            FakeGpu("GPU-bbbb", usage_file=tmp_path / "gpu1"),
        ],
        mig={"MIG-cccc": FakeGpu("MIG-cccc", name="FAKE MIG 1g.10gb", total=10 * 2**30)},
    )


@pytest.mark.parametrize(
    ("spec", "visible", "uuid"),
    [
        ("cuda", None, "GPU-aaaa"),
        ("cuda:1", None, "GPU-bbbb"),
        ("cuda:0", "1", "GPU-bbbb"),
        ("cuda:1", "1,0", "GPU-aaaa"),
        ("cuda:0", "GPU-bbbb", "GPU-bbbb"),
        ("cuda:0", "MIG-cccc", "MIG-cccc"),
        ("auto", "GPU-bbbb,GPU-aaaa", "GPU-bbbb"),
    ],
)
def test_cuda_visible_devices_maps_to_the_right_nvml_device(fake, spec, visible, uuid) -> None:
    environ = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    device = resolve_device(spec, environ, lambda: fake)
    assert device.uuid == uuid
    assert device.child_env() == {"CUDA_VISIBLE_DEVICES": uuid}


def test_a_mig_device_reports_its_own_memory(fake) -> None:
    device = resolve_device("cuda:0", {"CUDA_VISIBLE_DEVICES": "MIG-cccc"}, lambda: fake)
    assert (device.name, device.total_bytes) == ("FAKE MIG 1g.10gb", 10 * 2**30)


@pytest.mark.parametrize(
    ("spec", "visible", "message"),
    [
        ("cuda:2", None, "no device cuda:2: NVML sees 2 GPU"),
        ("cuda:1", "0", "no device cuda:1: CUDA_VISIBLE_DEVICES='0' lists 1"),
        ("cuda:0", "GPU-zzzz", "cannot open cuda:0 through NVML"),
        ("cuda:0", "banana", "neither an index nor a GPU-/MIG- UUID"),
    ],
)
def test_unknown_devices_are_clear_errors(fake, spec, visible, message) -> None:
    environ = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    with pytest.raises(DeviceError, match=message):
        resolve_device(spec, environ, lambda: fake)


def test_auto_falls_back_to_the_cpu_without_nvml_or_gpus() -> None:
    def no_nvml() -> None:
        raise DeviceError("NVML is not available")

    assert str(resolve_device("auto", {}, no_nvml)) == "cpu"
    assert str(resolve_device("auto", {}, lambda: FakeNvml())) == "cpu"
    with pytest.raises(DeviceError, match="NVML is not available"):
        resolve_device("cuda", {}, no_nvml)


def test_without_nvidias_driver_library_nvml_is_unavailable_before_its_bindings_are_imported() -> None:
    """The real load_nvml on a machine with no NVIDIA driver (CI): a one-line DeviceError naming the missing
    library, and the bindings (~50 ms of every `autotune best` on a CPU machine) never imported."""
    import ctypes

    from autotune.hardware.nvml import NVML_LIBRARY

    try:
        ctypes.CDLL(NVML_LIBRARY)
    except OSError:
        pass
    else:
        pytest.skip("NVIDIA's driver library is installed here")
    code = (
        "from autotune.core.errors import DeviceError\nfrom autotune.hardware.nvml import load_nvml\n"
        "try:\n    load_nvml()\nexcept DeviceError as e:\n    print(e)\n"
    )
    output = in_a_fresh_interpreter(code, not_imported=("pynvml",))
    assert output.startswith(
        f"NVML is not available (no NVIDIA driver or GPU?): {NVML_LIBRARY}: cannot open shared object file"
    ), output


@pytest.mark.parametrize("spec", ["gpu", "cuda:x", "cuda:-1", "tpu"])
def test_malformed_device_specs(spec) -> None:
    with pytest.raises(InputError, match=f"invalid device '{spec}'"):
        resolve_device(spec, {}, lambda: FakeNvml())


def _fake_gpu_trial(fake: FakeNvml, tmp_path: Path, device: str, visible: str | None, *flags: str):
    gpu = fake.nvmlDeviceGetHandleByUUID("GPU-bbbb")
    environ = {**os.environ, "FAKE_GPU_USAGE_FILE": str(gpu.usage_file)}
    environ.pop("CUDA_VISIBLE_DEVICES", None)
    if visible is not None:
        environ["CUDA_VISIBLE_DEVICES"] = visible
    spec = MeasureSpec(
        command=TrialCommand.parse([str(SCRIPTS / "fake_gpu_trial.py"), *flags]),
        batch_size=4,
        device=device,
        settings=TrialSettings(1, 3, 30, 60),
        cache_dir=tmp_path / "cache",
    )
    return measure(spec, environ, nvml=fake), gpu


def test_nvml_meter_sees_a_200ms_spike_above_the_idle_device(fake, tmp_path) -> None:
    result, gpu = _fake_gpu_trial(fake, tmp_path, "cuda:1", None, "--held-mib", "300", "--spike-mib", "500")
    assert result.outcome is Outcome.COMPLETE
    assert result.memory_method == "nvml"
    assert result.peak_bytes == 800 * MiB  # the device's idle 512 MiB is not the trial's
    assert result.device == "cuda:1"
    assert result.device_name == "FAKE NVIDIA H100 80GB HBM3"
    assert Path(str(gpu.usage_file) + ".env").read_text() == "GPU-bbbb"  # the trial ran where it was measured


def test_a_trial_pinned_by_uuid_in_cuda_visible_devices(fake, tmp_path) -> None:
    result, gpu = _fake_gpu_trial(
        fake, tmp_path, "cuda:0", "GPU-bbbb", "--held-mib", "100", "--spike-mib", "50"
    )
    assert result.peak_bytes == 150 * MiB
    assert Path(str(gpu.usage_file) + ".env").read_text() == "GPU-bbbb"


def on_the_gpu(
    script: Path, tmp_path: Path, batch: int = 1, settings: TrialSettings | None = None
) -> TrialResult:
    """One real trial of ``script`` on cuda:0, measured through real NVML."""
    spec = MeasureSpec(
        TrialCommand.parse([str(script)]),
        batch,
        device="cuda",
        settings=settings or TrialSettings(1, 3, 120, 300),
        cache_dir=tmp_path / "cache",
    )
    return measure(spec, dict(os.environ))


@pytest.mark.gpu
def test_real_nvml_measures_a_cuda_trial(tmp_path) -> None:
    from autotune.hardware.nvml import load_nvml

    try:
        load_nvml()
    except DeviceError as e:
        pytest.skip(f"no GPU here: {e}")
    script = tmp_path / "cuda_trial.py"
    script.write_text(
        "import torch, autotune\n"
        "x = torch.empty(1024 * 2**20, dtype=torch.uint8, device='cuda')\n"
        "for _ in range(10**9):\n    x.add_(1)\n    autotune.step()\n"
    )
    result = on_the_gpu(script, tmp_path)
    assert result.outcome is Outcome.COMPLETE
    assert result.memory_method == "nvml"
    # 1 GiB tensor plus a CUDA context of 250-700 MB (docs/reliability.md §8): NVML sees both, torch only the tensor.
    assert 1024 * MiB + 200 * MiB < result.peak_bytes < 1024 * MiB + 2048 * MiB
    assert result.torch_peak_allocated == 1024 * MiB


@pytest.mark.parametrize(("version", "warns"), [("11.5.3", True), ("13.0.1", False), (None, False)])
def test_an_old_pynvml_package_shadowing_the_bindings_is_named(monkeypatch, version, warns) -> None:
    import importlib.metadata
    import warnings

    from autotune.hardware import nvml

    def fake_version(name: str) -> str:
        if version is None:
            raise importlib.metadata.PackageNotFoundError(name)
        return version

    monkeypatch.setattr(importlib.metadata, "version", fake_version)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        nvml._warn_if_shadowed()
    messages = [str(w.message) for w in caught]
    assert bool(messages) is warns
    if warns:
        assert "pip uninstall pynvml" in messages[0] and "11.5.3" in messages[0]


def _holder(usage_file: Path | None, mib: int, processes: int = 1) -> subprocess.Popen[bytes]:
    """A stand-in for the shim: ``processes`` children, each holding ``mib`` MiB for 0.6 s once all of them
    hold it (declared in the FAKE GPU's usage file too, when given). They wait for each other: on a busy
    machine one interpreter started 0.6 s after the other, and the two never held their memory together."""
    child = (
        f"import os, sys, time; time.sleep(0.15); held = bytearray(b'1') * ({mib} << 20); "
        f"p = sys.argv[1]; p and open(p, 'w').write(f'{{os.getpid()}} {{{mib} << 20}}'); "
        "open(os.path.join(sys.argv[2], str(os.getpid())), 'w').close(); end = time.time() + 60; "
        f"exec('while len(os.listdir(sys.argv[2])) < {processes} and time.time() < end: time.sleep(0.01)'); "
        "time.sleep(0.6)"
    )
    ready = tempfile.mkdtemp(prefix="autotune-holders-")
    parent = (
        "import shutil, subprocess, sys; "
        f"[c.wait() for c in [subprocess.Popen([sys.executable, '-c', {child!r}, {str(usage_file or '')!r}, "
        f"{ready!r}]) for _ in range({processes})]]; shutil.rmtree({ready!r})"
    )
    return subprocess.Popen([sys.executable, "-c", parent])


def test_one_meter_measures_trial_after_trial(fake, tmp_path) -> None:
    """A job's meter is reused for each of its trials: nothing of a trial's reading may carry over to the next
    (it once did: the second trial saw no sample and the first trial's peak)."""
    gpu = fake.nvmlDeviceGetHandleByIndex(0)
    meter = NvmlMeter(fake, gpu)
    readings = []
    for mib in (300, 100, 200):
        proc = _holder(gpu.usage_file, mib)
        meter.start(partial(descendants, proc.pid))
        proc.wait()
        readings.append(meter.stop(0))
    assert [r.peak_bytes for r in readings] == [300 * MiB, 100 * MiB, 200 * MiB]
    assert all(r.samples > 10 for r in readings)
    rss = RssMeter(interval=0.02)
    peaks = []
    for mib in (120, 40):
        proc = _holder(None, mib, processes=2)  # two processes: the sampled rss-tree path
        rss.start(partial(descendants, proc.pid))
        proc.wait()
        reading = rss.stop(0)
        assert (reading.method, reading.processes) == ("rss-tree", 2)
        peaks.append(reading.peak_bytes)
    assert 2 * 120 * MiB < peaks[0] < 2 * 120 * MiB + 80 * MiB  # two interpreters of ~10 MiB each on top
    assert 2 * 40 * MiB < peaks[1] < 2 * 40 * MiB + 80 * MiB


def test_gpu_count_is_zero_without_nvml_and_an_nvml_failure_is_reported(fake) -> None:
    """Without NVML there is no GPU to count (0); NVML that fails while counting is an error, not 0 GPUs
    (the old count swallowed every exception, so a broken driver looked like a CPU-only machine)."""

    def no_nvml() -> FakeNvml:
        raise DeviceError("NVML is not available")

    assert gpu_count({}, no_nvml) == 0
    assert gpu_count({}, lambda: fake) == 2
    assert gpu_count({"CUDA_VISIBLE_DEVICES": "1"}, lambda: fake) == 1

    class Broken(FakeNvml):  # fake NVML (no GPU here): counting fails
        def nvmlDeviceGetCount(self) -> int:
            raise NVMLError("Unknown Error")

    with pytest.raises(DeviceError, match="NVML cannot count the GPUs: Unknown Error"):
        gpu_count({}, lambda: Broken())


def test_the_meter_waits_for_the_device_to_come_back_before_the_next_trial(fake, tmp_path) -> None:
    """FAKE NVML (no GPU here): the driver frees a killed trial's memory a moment after the process is
    gone. The meter's stop waits for it, so the next trial's baseline is the idle device; memory that
    never comes back is noted, after the settle time."""
    gpu = fake.nvmlDeviceGetHandleByIndex(0)
    meter = NvmlMeter(fake, gpu)
    for frees_after in (0.5, None):
        proc = _holder(gpu.usage_file, 100)
        meter.start(partial(descendants, proc.pid))
        proc.wait()
        # 60 of the trial's 100 MiB are still held by the driver after its exit (less than its peak: the
        # sampler, still running, may see them without changing the peak)
        gpu.idle_used += 60 * MiB
        if frees_after is not None:
            threading.Timer(frees_after, lambda: setattr(gpu, "idle_used", gpu.idle_used - 60 * MiB)).start()
        else:
            meter.SETTLE_SECONDS = 0.3
        stopping = time.monotonic()
        reading = meter.stop(0)
        waited = time.monotonic() - stopping
        assert reading.peak_bytes == 100 * MiB
        if frees_after is not None:
            assert frees_after - 0.1 < waited < frees_after + 2 and reading.note is None
        else:
            assert 0.3 <= waited < 2
            assert reading.note is not None and reading.note.startswith("the device stayed 60 MiB above")


def _real_nvml() -> None:
    from autotune.hardware.nvml import load_nvml

    try:
        load_nvml()
    except DeviceError as e:
        pytest.skip(f"no GPU here: {e}")


@pytest.mark.gpu
def test_a_cuda_out_of_memory_is_classified_oom(tmp_path) -> None:
    _real_nvml()
    script = tmp_path / "too_big.py"
    script.write_text(
        "import torch, autotune\nautotune.step()\nx = torch.empty(2**50, dtype=torch.uint8, device='cuda')\n"
    )
    result = on_the_gpu(script, tmp_path)
    assert (result.outcome, result.memory_method) == (Outcome.OOM, "nvml")


@pytest.mark.gpu
def test_after_a_killed_trial_the_next_starts_from_the_idle_device(tmp_path) -> None:
    """A trial holding 2 GiB is killed at its timeout; the next trial (holding 1 GiB) reads 1 GiB plus its
    CUDA context, not less: the baseline it was measured from is the idle device again."""
    _real_nvml()
    hog = tmp_path / "hog.py"
    hog.write_text(
        "import time, torch\nx = torch.empty(2 * 2**30, dtype=torch.uint8, device='cuda')\ntime.sleep(600)\n"
    )
    held = tmp_path / "held.py"
    held.write_text(
        "import torch, autotune\nx = torch.empty(2**30, dtype=torch.uint8, device='cuda')\n"
        "for _ in range(10**9):\n    x.add_(1)\n    autotune.step()\n"
    )
    killed = on_the_gpu(hog, tmp_path, settings=TrialSettings(1, 1, 20, 20))
    assert killed.outcome is Outcome.TIMEOUT
    after = on_the_gpu(held, tmp_path)
    assert after.outcome is Outcome.COMPLETE and after.memory_note is None
    assert 1024 * MiB + 200 * MiB < after.peak_bytes < 1024 * MiB + 2048 * MiB


@pytest.mark.gpu
def test_nvml_and_torch_s_counters_agree_on_three_batch_sizes(tmp_path) -> None:
    """NVML's whole-process peak minus torch's reserved peak is the CUDA context and library workspaces:
    the same at every batch size (docs/reliability.md: within 256 MiB), never negative."""
    _real_nvml()
    overheads = []
    for batch in (8, 32, 128):
        result = on_the_gpu(EXAMPLES / "gpt.py", tmp_path, batch, TrialSettings(2, 5, 300, 600))
        assert result.outcome is Outcome.COMPLETE and result.torch_peak_reserved is not None
        overheads.append(result.peak_bytes - result.torch_peak_reserved)
    assert min(overheads) > 0 and max(overheads) - min(overheads) < 256 * MiB, overheads


def _ranks(
    usage: dict[int, Path], mib: dict[int, int], local: dict[int, int]
) -> tuple[subprocess.Popen[bytes], Path]:
    """A stand-in for torchrun: one child per rank, each declaring ``mib[rank]`` on the FAKE GPU whose usage
    file is ``usage[rank]`` (appending: ranks may share a device) and writing its rank's progress file as
    the trial runtime does."""
    folder = usage[0].parent
    child = (
        "import json, os, sys, time; rank = int(sys.argv[1]); time.sleep(0.1); "
        "open(sys.argv[2], 'a').write(f'{os.getpid()} {int(sys.argv[3]) << 20}\\n'); "
        "json.dump({'steps': 0, 'rank': rank, 'local_rank': int(sys.argv[4]), 'world_size': int(sys.argv[5]), "
        "'pid': os.getpid()}, open(sys.argv[6] + f'/progress.rank-{rank}.json', 'w')); time.sleep(0.8)"
    )
    args = [
        [str(rank), str(usage[rank]), str(mib[rank]), str(local[rank]), str(len(mib)), str(folder)]
        for rank in sorted(mib)
    ]
    parent = (
        "import subprocess, sys; "
        f"[c.wait() for c in [subprocess.Popen([sys.executable, '-c', {child!r}, *a]) for a in {args!r}]]"
    )
    return subprocess.Popen([sys.executable, "-c", parent]), folder / "progress.json"


def test_each_rank_s_device_is_measured_and_ranks_sharing_one_are_summed(fake, tmp_path) -> None:
    """FAKE NVML: two GPUs, one rank each; then two ranks on one GPU (its used memory is their sum)."""
    from autotune.trials.ranks import RankWatch

    gpus = [fake.nvmlDeviceGetHandleByIndex(i) for i in range(2)]
    meter = NvmlMeter(fake, gpus, ["cuda:0", "cuda:1"])

    def measure_ranks(devices: dict[int, int], mib: dict[int, int]):  # rank -> GPU index, rank -> MiB
        for gpu in gpus:
            gpu.usage_file.write_text("")
        for old in gpus[0].usage_file.parent.glob("progress.rank-*.json"):
            old.unlink()
        proc, progress = _ranks({r: gpus[d].usage_file for r, d in devices.items()}, mib, devices)
        meter.start(partial(descendants, proc.pid), ranks=RankWatch(progress))
        proc.wait()
        return meter.stop(0)

    reading = measure_ranks({0: 0, 1: 1}, {0: 300, 1: 100})
    assert [(r.rank, r.device, r.peak_bytes) for r in reading.ranks] == [
        (0, "cuda:0", 300 * MiB),
        (1, "cuda:1", 100 * MiB),
    ]
    assert reading.peak_bytes == 300 * MiB  # the worst device, not the sum over devices

    reading = measure_ranks({0: 0, 1: 0}, {0: 200, 1: 150})  # local ranks 0 and 0: both on cuda:0
    assert [(r.rank, r.device, r.peak_bytes) for r in reading.ranks] == [
        (0, "cuda:0", 350 * MiB),
        (1, "cuda:0", 350 * MiB),
    ]
    assert reading.peak_bytes == 350 * MiB


def test_gpus_per_trial_groups_devices_and_pins_a_trial_to_all_of_its_gpus(fake) -> None:
    from autotune.hardware.devices import device_groups, resolve_trial_device

    assert device_groups(["cuda:0", "cuda:1", "cuda:2", "cuda:3"], 2) == ["cuda:0+1", "cuda:2+3"]
    with pytest.raises(InputError, match="does not divide the 3 GPU"):
        device_groups(["cuda:0", "cuda:1", "cuda:2"], 2)
    with pytest.raises(InputError, match="needs GPUs"):
        device_groups(["cpu"], 2)
    group = resolve_trial_device("auto", 2, {}, lambda: fake)
    assert str(group) == "cuda:0+1" and [str(d) for d in group.members] == ["cuda:0", "cuda:1"]
    assert group.child_env()["CUDA_VISIBLE_DEVICES"] == ",".join(g.uuid for g in fake.gpus[:2])
    assert group.total_bytes == min(g.total for g in fake.gpus[:2])
    with pytest.raises(DeviceError, match="shows 2 GPU"):
        resolve_trial_device("auto", 3, {}, lambda: fake)
    with pytest.raises(InputError, match="needs GPUs"):
        resolve_trial_device("cpu", 2, {}, lambda: fake)


@pytest.mark.gpu
def test_a_warm_process_on_a_gpu_is_stopped_at_the_budget_by_its_allocator_and_goes_on(tmp_path) -> None:
    """Real NVML and CUDA (issue 41, item 3): a script holding 256 MiB a sample on the GPU, three
    configurations in one warm process under a 3 GiB budget. Batch 2 fits; batch 16 (4 GiB) raises out of
    memory in the process at torch's allocator cap (the budget less what the process holds outside the
    allocator at rest), over-budget, and the process goes on; batch 4 fits, in the same process, its peak
    (CUDA context included) within 64 MiB of a process of its own."""
    from autotune.core.plans import Backend, Plan
    from autotune.hardware.meters import make_meter
    from autotune.hardware.nvml import load_nvml
    from autotune.trials.measurement import TrialJob
    from autotune.trials.warm import WarmProcess

    _real_nvml()
    script = tmp_path / "cuda_batches.py"
    script.write_text(
        "import torch, autotune\n"
        "batch = autotune.batch_size(1)\n"
        "for _ in range(100):\n"
        "    x = torch.ones(batch * 64 * 2**20, dtype=torch.float32, device='cuda')\n"
        "    del x\n"
        "    autotune.step()\n"
    )
    device = resolve_device("cuda:0", dict(os.environ), load_nvml)
    settings = TrialSettings(1, 3, 120, 300, tight=0)
    job = TrialJob(
        TrialCommand.parse([str(script)]), Backend.TORCH, device, make_meter(device), settings,
        tmp_path / "cache", dict(os.environ), ceiling=3 * 2**30,
    )  # fmt: skip
    warm = WarmProcess(job)
    try:
        readings = [warm.measure(batch, Plan.none()) for batch in (2, 16, 4)]
    finally:
        warm.close()
    assert [r.outcome for r in readings] == [Outcome.COMPLETE, Outcome.OVER_BUDGET, Outcome.COMPLETE]
    assert [r.warm_run for r in readings] == [1, 2, 3]
    assert "allocator's cap" in (readings[1].error or "")
    alone = on_the_gpu(script, tmp_path, batch=4, settings=settings)
    assert abs(readings[2].peak_bytes - alone.peak_bytes) <= 64 * MiB, (
        readings[2].peak_bytes,
        alone.peak_bytes,
    )
