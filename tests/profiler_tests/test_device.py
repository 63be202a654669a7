"""Device strings and the metadata recorded with a profile."""

from __future__ import annotations

import pytest
import torch

from optimizer.records import DeviceInfo
from profiler.device import DeviceError, accelerator_name, describe_device, parse_device


def test_parse_cpu() -> None:
    assert parse_device("cpu") == torch.device("cpu")
    assert parse_device(" CPU ") == torch.device("cpu")


@pytest.mark.parametrize(
    ("spec", "message"),
    [("gpu", "not understood"), ("cuda:x", "not understood"), ("cpu:1", "takes no index")],
)
def test_parse_rejects(spec: str, message: str) -> None:
    with pytest.raises(DeviceError, match=message):
        parse_device(spec)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
def test_parse_cuda_without_cuda_is_a_clear_error() -> None:
    with pytest.raises(DeviceError, match="CUDA is not available"):
        parse_device("cuda:0")


def test_describe_cpu() -> None:
    info = describe_device(torch.device("cpu"), num_threads=1)
    assert info.kind == "cpu"
    assert info.name and info.name != "unknown CPU"
    assert info.num_threads == 1
    assert info.torch_version == torch.__version__
    assert info.memory_gb is None or info.memory_gb > 0
    assert info.cuda_version is None and info.compute_capability is None


@pytest.mark.parametrize(
    ("name", "preset"),
    [
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA GB200", "gb200"),
        ("NVIDIA GB300", "gb300"),
        ("NVIDIA GH200 480GB", "gh200"),
        ("NVIDIA B200", "b200"),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "rtx-pro-6000"),
        ("NVIDIA GeForce RTX 4090", "nvidia-geforce-rtx-4090"),
    ],
)
def test_accelerator_names(name: str, preset: str) -> None:
    assert accelerator_name(DeviceInfo(kind="cuda", name=name)) == preset
    assert accelerator_name(DeviceInfo(kind="cpu", name="AMD EPYC")) == "cpu"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_describe_cuda() -> None:
    info = describe_device(parse_device("cuda"))
    assert info.kind == "cuda" and info.name
    assert info.memory_gb and info.memory_gb > 1
    assert info.compute_capability and "." in info.compute_capability
    assert info.cuda_version == torch.version.cuda
