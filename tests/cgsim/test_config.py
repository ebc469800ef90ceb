"""Config validation: each bad input names its field, the value and a fix."""

import json

import pytest

from cgsim.config import ConfigError, ManagerConfig, dense_spec_schedule
from cgsim.descriptors import Batch, BatchDescriptor, lora_case
from cgsim.spec.fit import compatible
from cgsim.modes import CUDAGraphMode as M


@pytest.mark.parametrize(
    "kwargs,field",
    [
        (dict(capture_sizes=()), "capture_sizes"),
        (dict(capture_sizes=(0, 4)), "capture_sizes"),
        (dict(capture_sizes=(-2,)), "capture_sizes"),
        (dict(capture_sizes=(2, 2)), "capture_sizes"),
        (dict(capture_sizes="1,2"), "capture_sizes"),
        (dict(max_num_reqs=0), "max_num_reqs"),
        (dict(decode_query_len=0), "decode_query_len"),
        (dict(lora_cases=(1, 2)), "lora_cases"),
        (dict(capture_sizes=(1, 64), max_capture_size=32), "max_capture_size"),
        (dict(decode_query_len=3, spec_schedule=((5, 8, 1), (1, 4, 2))), "spec_schedule"),
        (dict(decode_query_len=3, spec_schedule=((1, 8, 1), (4, 16, 2))), "spec_schedule"),
        (dict(decode_query_len=3, spec_schedule=((2, 8, 1),)), "spec_schedule"),
        (dict(decode_query_len=1, spec_schedule=((1, 8, 1),)), "spec_schedule"),
        (dict(mode="FULLISH"), "mode"),
        (dict(attention_support="sometimes"), "attention_support"),
        (dict(num_ubatches=0), "num_ubatches"),
        (dict(varlen_decode=True, decode_query_len=2, attention_support="UNIFORM_BATCH"), "varlen_decode"),
    ],
)
def test_bad_config_names_field_value_and_fix(kwargs, field):
    with pytest.raises(ConfigError) as info:
        ManagerConfig(**kwargs)
    assert info.value.field == field
    message = str(info.value)
    assert f"'{field}'" in message and ";" in message  # value and fix follow


def test_defaults_and_json_round_trip():
    c = ManagerConfig(capture_sizes=(1, 2, 4), decode_query_len=3, spec_schedule=((1, 2, 2), (3, 8, 0)))
    assert c.max_capture_size == 4
    assert ManagerConfig.from_json(json.loads(json.dumps(c.to_json()))) == c


def test_unknown_json_field_is_named():
    with pytest.raises(ConfigError, match="'capture_size'"):
        ManagerConfig.from_json({"capture_size": [1]})


def test_load_reports_bad_json(tmp_path):
    p = tmp_path / "c.json"
    p.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        ManagerConfig.load(str(p))
    with pytest.raises(ConfigError, match="cannot be read"):
        ManagerConfig.load(str(tmp_path / "missing.json"))


def test_dense_schedule_carries_and_clamps():
    dense = dense_spec_schedule(((1, 2, 4), (5, 6, 1)), 8, 3)
    assert dense[1:] == [3, 3, 3, 3, 1, 1, 1, 1]
    c = ManagerConfig(decode_query_len=3, max_num_reqs=8, spec_schedule=((1, 2, 2), (3, 8, 0)))
    assert c.scheduler_decode_query_lens() == (1, 3)
    assert c.scheduler_decode_query_len(2) == 3 and c.scheduler_decode_query_len(5) == 1


def test_batch_fields():
    b = Batch((3, 1, 2), num_active_loras=1)
    assert (b.num_reqs, b.num_tokens, b.max_query_len, b.uniform_token_count) == (3, 6, 3, None)
    assert Batch.uniform(4, 2).uniform_token_count == 2
    with pytest.raises(ValueError, match="query length"):
        Batch((0, 1))


def test_lora_case_mapping():
    assert lora_case(0, (0, 2, 4)) == 0
    assert lora_case(1, (0, 2, 4)) == 2
    assert lora_case(3, (0, 2, 4)) == 4
    assert lora_case(9, (0, 2, 4)) == 4  # clamped to the largest


def test_compatibility_rules():
    d = BatchDescriptor(M.FULL, 8, 4, 2)
    assert compatible(d, Batch.uniform(4, 2))
    assert compatible(d, Batch.uniform(3, 2))
    assert not compatible(d, Batch((2, 1)))  # not uniform
    assert not compatible(d, Batch.uniform(5, 1))  # too many requests / wrong length
    v = BatchDescriptor(M.FULL, 8, 8, None, 2)
    assert compatible(v, Batch((2, 1, 2))) and not compatible(v, Batch((3, 1)))
    p = BatchDescriptor(M.PIECEWISE, 8, None, num_active_loras=2)
    assert compatible(p, Batch((5, 3), num_active_loras=1), (0, 2))
    assert not compatible(p, Batch((5, 3)), (0, 2))
    assert not compatible(BatchDescriptor(M.FULL, 8, 4, 2, num_ubatches=2), Batch.uniform(4, 2))
