"""ServingConfig: validation (vLLM rules, KV capacity) and the strict JSON round trip."""

from __future__ import annotations

import json

import pytest

from optimizer.config import (
    CONFIG_SCHEMA_VERSION,
    ConfigError,
    InstanceConfig,
    KVLinkConfig,
    Role,
    RoutingPolicy,
    ServingConfig,
    ServingMode,
    SpecMethod,
    SpeculationConfig,
)
from optimizer.memory import kv_capacity_blocks
from optimizer.shapes import get_shape


def test_kv_capacity_follows_domain_formula_by_hand():
    # Llama-3.1-8B bf16 on an H100 (79.2 GiB as the device reports it) at 0.9: weights
    # 16.06 GB; kept out: the larger of the profile forward, 8192 tokens x (3 x 14336 +
    # 3 x 4096) values x 2 B, and the sampler's 256 x 128256 fp32 logits; plus 0.4 GiB
    # of non-torch memory.
    shape = get_shape("llama-3.1-8b")
    inst = InstanceConfig()
    forward = 8192 * (3 * 14336 + 3 * 4096) * 2
    assert forward > 256 * 128256 * 4
    reserve = forward + int(0.4 * 1024**3)
    free = 79.2 * 1024**3 * 0.9 - shape.weight_bytes(1) - reserve
    expected = int(free // (131072 * 16))  # 128 KiB per token, 16-token blocks
    assert kv_capacity_blocks(shape, inst) == expected
    cfg = ServingConfig.colocated("llama-3.1-8b", inst, num_replicas=3)
    (plan,) = cfg.roles()
    assert plan.role is Role.REPLICA and plan.count == 3 and plan.kv_blocks == expected
    assert cfg.num_gpus == 3


def test_disaggregated_roles_can_use_different_accelerators():
    cfg = ServingConfig.disaggregated(
        "llama-3.1-70b",
        prefill=InstanceConfig(accelerator="h100", tp=4, price_per_gpu_hour=3.0),
        decode=InstanceConfig(accelerator="h200", tp=2, price_per_gpu_hour=4.0),
        num_prefill=2,
        num_decode=3,
    )
    prefill, decode = cfg.roles()
    assert (prefill.role, decode.role) == (Role.PREFILL, Role.DECODE)
    assert decode.kv_blocks > 0 and cfg.num_gpus == 2 * 4 + 3 * 2
    assert cfg.price_per_hour() == pytest.approx(8 * 3.0 + 6 * 4.0)


def test_round_trip_through_json():
    cfg = ServingConfig.disaggregated(
        "llama-3.1-8b",
        speculation=SpeculationConfig(SpecMethod.DRAFT, 4, 0.8, draft_model="tiny-draft"),
        enable_prefix_caching=True,
        kv_link=KVLinkConfig(25.0, 0.1),
        routing=RoutingPolicy.LEAST_OUTSTANDING_TOKENS,
        max_model_len=8192,
    )
    data = json.loads(json.dumps(cfg.to_dict()))
    assert data["schema_version"] == CONFIG_SCHEMA_VERSION
    assert data["mode"] == "disaggregated" and data["speculation"]["method"] == "draft"
    assert ServingConfig.from_dict(data) == cfg
    colo = ServingConfig.colocated("qwen3-8b", InstanceConfig(tp=2, block_size=32))
    assert ServingConfig.from_dict(colo.to_dict()) == colo


def _base() -> dict:
    return ServingConfig.colocated("llama-3.1-8b").to_dict()


@pytest.mark.parametrize(
    "mutate,message",
    [
        (lambda d: d.update(colour="red"), r"config: unknown keys \['colour'\]"),
        (lambda d: d["replica"].update(tpp=2), r"config.replica: unknown keys \['tpp'\]"),
        (lambda d: d["replica"].update(tp="2"), r"config.replica.tp: expected an int, got str"),
        (lambda d: d["replica"].update(tp=2.0), r"config.replica.tp: expected an int"),
        (lambda d: d.update(enable_prefix_caching=1), r"enable_prefix_caching: expected a bool"),
        (lambda d: d.update(mode="hybrid"), r"config.mode: expected one of"),
        (lambda d: d["speculation"].update(method="medusa"), r"speculation.method: expected"),
        (lambda d: d.update(replica=[1]), r"config.replica: expected a mapping"),
        (lambda d: d.update(schema_version=99), r"schema_version: 99 is not supported"),
        (lambda d: d.pop("model"), r"config: .*model"),
    ],
)
def test_from_dict_rejects_bad_input_precisely(mutate, message):
    data = _base()
    mutate(data)
    with pytest.raises(ConfigError, match=message):
        ServingConfig.from_dict(data)


def test_from_dict_rejects_non_mapping():
    with pytest.raises(ConfigError, match="expected a mapping, got list"):
        ServingConfig.from_dict([])


@pytest.mark.parametrize(
    "build,message",
    [
        (lambda: ServingConfig.colocated("llama-3.1-70b"), "does not fit on h100 at tp=1"),
        (lambda: ServingConfig.colocated("llama-9000"), "config.model: unknown model shape"),
        (
            lambda: ServingConfig.colocated(
                "llama-3.1-8b", InstanceConfig(max_num_batched_tokens=128, max_num_seqs=256)
            ),
            r"max_num_batched_tokens \(128\) must be >= max_num_seqs \(256\)",
        ),
        (
            lambda: ServingConfig.colocated(
                "llama-3.1-8b",
                InstanceConfig(enable_chunked_prefill=False, max_num_batched_tokens=4096),
                max_model_len=8192,
            ),
            "with chunked prefill off",
        ),
        (
            lambda: ServingConfig.colocated("llama-3.1-8b", InstanceConfig(accelerator="tpu9")),
            "config.replica.accelerator: unknown accelerator 'tpu9'",
        ),
        (lambda: ServingConfig.colocated("llama-3.1-8b", InstanceConfig(tp=3)), "power of two"),
        (
            lambda: ServingConfig.colocated("llama-3.1-8b", InstanceConfig(tp=64)),
            "does not divide",
        ),
        (
            lambda: ServingConfig.colocated(
                "llama-3.1-8b", InstanceConfig(gpu_memory_utilization=1.5)
            ),
            r"gpu_memory_utilization: expected a value in \(0, 1\]",
        ),
        (
            lambda: ServingConfig.colocated(
                "llama-3.1-8b", speculation=SpeculationConfig(SpecMethod.EAGLE, 0)
            ),
            "needs num_speculative_tokens >= 1",
        ),
        (
            lambda: ServingConfig.colocated(
                "llama-3.1-8b", speculation=SpeculationConfig(num_speculative_tokens=3)
            ),
            "method is none",
        ),
        (
            lambda: ServingConfig.colocated(
                "llama-3.1-8b", speculation=SpeculationConfig(SpecMethod.EAGLE, 3, 1.2)
            ),
            r"acceptance_rate: expected a value in \[0, 1\]",
        ),
        (
            lambda: ServingConfig("llama-3.1-8b", ServingMode.DISAGGREGATED),
            "needs both prefill and decode",
        ),
        (
            lambda: ServingConfig("llama-3.1-8b", replica=InstanceConfig(), num_decode=1),
            "only for disaggregated mode",
        ),
        (
            lambda: ServingConfig.colocated("llama-3.1-8b", max_model_len=10_000_000),
            "exceeds the KV cache capacity",
        ),
        (
            lambda: ServingConfig.colocated("llama-3.1-8b", kv_link=KVLinkConfig(0.0)),
            "kv_link.bandwidth_gb_s: expected a positive number",
        ),
    ],
)
def test_invalid_configs_raise_clear_errors(build, message):
    with pytest.raises(ConfigError, match=message):
        build()


def test_tensor_parallelism_makes_a_big_model_fit():
    cfg = ServingConfig.colocated("llama-3.1-70b", InstanceConfig(tp=4))
    assert cfg.roles()[0].kv_blocks > 0 and cfg.num_gpus == 4


def test_hugging_face_ids_and_fp8_checkpoints_resolve_to_shapes(tmp_path):
    import json

    from optimizer.shapes import ShapeError, get_shape

    assert get_shape("meta-llama/Llama-3.1-70B") == get_shape("llama-3.1-70b")
    assert get_shape("Qwen/Qwen3-32B").name == "qwen3-32b"
    fp8 = get_shape("nvidia/Llama-3.1-8B-Instruct-FP8")
    assert fp8.quantization == "fp8" and fp8.name == "llama-3.1-8b"
    # A config.json: FP8 is in quantization_config, whatever torch_dtype says.
    cfg = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 1000,
           "torch_dtype": "bfloat16", "quantization_config": {"quant_method": "fp8"}}  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert get_shape(str(path)).quantization == "fp8"
    cfg["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "FP8"}
    path.write_text(json.dumps(cfg))
    assert get_shape(str(path)).quantization == "fp8"
    cfg["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": 128}
    path.write_text(json.dumps(cfg))
    assert get_shape(str(path)).quantization == "int4"  # issue 27: 4-bit weights are read
    cfg["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    path.write_text(json.dumps(cfg))
    with pytest.raises(ShapeError, match="quant_method 'bitsandbytes' is not supported"):
        get_shape(str(path))
    with pytest.raises(ShapeError, match="a Hugging Face id such as"):
        get_shape("some-org/unknown")


def test_more_dense_ids_resolve_to_their_dimensions():
    from optimizer.shapes import get_shape

    small = get_shape("Qwen/Qwen3-1.7B")  # 28 layers of 2048, 16 heads, 8 KV, tied
    assert (small.num_layers, small.hidden_size, small.num_heads, small.num_kv_heads) == (
        28, 2048, 16, 8,
    )  # fmt: skip
    assert small.tie_word_embeddings and small.num_params / 1e9 == pytest.approx(1.72, abs=0.01)
    big = get_shape("meta-llama/Llama-3.1-405B-Instruct")  # Meta's 405B, 126 layers
    assert big.num_layers == 126 and big.num_params / 1e9 == pytest.approx(405.9, abs=0.1)
    assert get_shape("Qwen/Qwen3-VL-32B-Instruct") == get_shape("qwen3-32b")  # its LM
    assert get_shape("Qwen/Qwen3-VL-2B-Instruct") == small
    mimo = get_shape("XiaomiMiMo/MiMo-7B-Base")  # 36 x 4096, 32/8 heads, 11008 wide
    assert (mimo.num_layers, mimo.intermediate_size, mimo.vocab_size) == (36, 11008, 151680)
    assert mimo.num_params / 1e9 == pytest.approx(7.62, abs=0.01)
    static = get_shape("Qwen/Qwen3-32B-FP8-Static-PerTensor")  # ModelOpt FP8, FP8 KV
    assert (static.quantization, static.kv_cache_dtype) == ("fp8", "fp8")


def test_config_precision_fields():
    fp8 = ServingConfig.colocated("nvidia/Llama-3.1-8B-Instruct-FP8")
    assert fp8.shape.quantization == "fp8" and fp8.checkpoint_quantization == "fp8"
    with pytest.raises(ConfigError, match="is an FP8 checkpoint; it cannot run unquantised"):
        ServingConfig.colocated("nvidia/Llama-3.1-8B-Instruct-FP8", quantization="none")
    with pytest.raises(ConfigError, match=r"config\.kv_cache_dtype: expected one of"):
        ServingConfig.colocated("llama-3.1-8b", kv_cache_dtype="int4")
    cfg = ServingConfig.colocated("llama-3.1-8b", quantization="fp8", kv_cache_dtype="fp8")
    assert ServingConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.shape.weight_bytes() < ServingConfig.colocated("llama-3.1-8b").shape.weight_bytes()


def test_num_replicas_follows_the_mode():
    # A disaggregated config as a user writes it: no num_replicas (issue 43).
    data = {
        "model": "llama-3.1-8b",
        "mode": "disaggregated",
        "num_prefill": 1,
        "num_decode": 2,
        "prefill": {"accelerator": "h100"},
        "decode": {"accelerator": "h100"},
    }
    cfg = ServingConfig.from_dict(data)
    assert cfg.num_replicas == 0 and cfg.num_gpus == 3
    assert cfg == ServingConfig.disaggregated(
        "llama-3.1-8b", InstanceConfig(), InstanceConfig(), num_prefill=1, num_decode=2
    )
    assert ServingConfig.from_dict(cfg.to_dict()) == cfg  # stored configs say num_replicas: 0
    assert ServingConfig.from_dict({**data, "num_replicas": 0}) == cfg
    built = ServingConfig(
        "llama-3.1-8b",
        ServingMode.DISAGGREGATED,
        prefill=InstanceConfig(),
        decode=InstanceConfig(),
        num_prefill=1,
        num_decode=2,
    )
    assert built == cfg
    # Colocated keeps one replica by default.
    colo = ServingConfig.from_dict({"model": "llama-3.1-8b", "replica": {}})
    assert colo.num_replicas == 1 and colo == ServingConfig.colocated("llama-3.1-8b")
    # An explicit replica count in disaggregated mode is still refused, by name.
    with pytest.raises(ConfigError, match=r"config\.num_replicas: 2 is only for colocated mode"):
        ServingConfig.from_dict({**data, "num_replicas": 2})
    with pytest.raises(ConfigError, match=r"config\.replica: only for colocated mode"):
        ServingConfig.from_dict({**data, "replica": {}})
