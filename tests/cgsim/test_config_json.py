"""The config's JSON, byte for byte: a finding's id is a hash of its
scenario's JSON, so every config written before keeps its text, engine
options included (each engine's keys at the top level, after the shared
fields, left out while the engine has no options), and every documented
finding loads with the id its file is named by, its scenario written again
unchanged."""

import json
from pathlib import Path

import pytest

from cgsim.config import ManagerConfig
from cgsim.finding import Finding
from cgsim.scenario import Scenario

DOCS = Path(__file__).resolve().parents[2] / "docs"

# Written by the config before engine options were values of their own (the
# JSON of each config below, json.dumps with its defaults).
WRITTEN = {
    "default": '{"mode": "FULL_AND_PIECEWISE", "capture_sizes": [1, 2, 4, 8], "max_num_reqs": 8, "max_capture_size": 8, "decode_query_len": 1, "spec_schedule": null, "lora_cases": [0], "breakable": false, "varlen_decode": false, "num_ubatches": 1, "ubatch_threshold": 32, "attention_support": "ALWAYS", "attention_split": true, "compiled_piecewise": true}',
    "decode_sizes": '{"mode": "FULL_AND_PIECEWISE", "capture_sizes": [1, 2, 4, 8], "max_num_reqs": 8, "max_capture_size": 8, "decode_query_len": 2, "spec_schedule": null, "lora_cases": [0], "breakable": false, "varlen_decode": false, "num_ubatches": 1, "ubatch_threshold": 32, "attention_support": "ALWAYS", "attention_split": true, "compiled_piecewise": true, "decode_sizes": [4, 1, 2]}',
    "sglang": '{"mode": "FULL", "capture_sizes": [2, 4], "max_num_reqs": 4, "max_capture_size": 4, "decode_query_len": 1, "spec_schedule": null, "lora_cases": [0], "breakable": false, "varlen_decode": false, "num_ubatches": 1, "ubatch_threshold": 32, "attention_support": "ALWAYS", "attention_split": true, "compiled_piecewise": true, "sglang": {"dp_size": 2, "disable_padding": false, "default_bs_list": false, "record_nolora_graph": true, "full_prefill_max_req": null, "eagle_topk": 1, "eagle_steps": 3}}',
    "sglang_defaults": '{"mode": "FULL_AND_PIECEWISE", "capture_sizes": [1, 2, 4, 8], "max_num_reqs": 8, "max_capture_size": 8, "decode_query_len": 1, "spec_schedule": null, "lora_cases": [0], "breakable": false, "varlen_decode": false, "num_ubatches": 1, "ubatch_threshold": 32, "attention_support": "ALWAYS", "attention_split": true, "compiled_piecewise": true, "sglang": {"dp_size": 1, "disable_padding": false, "default_bs_list": false, "record_nolora_graph": true, "full_prefill_max_req": null, "eagle_topk": 1, "eagle_steps": null}}',
    "both": '{"mode": "FULL_AND_PIECEWISE", "capture_sizes": [8, 16], "max_num_reqs": 16, "max_capture_size": 16, "decode_query_len": 3, "spec_schedule": [[1, 4, 2], [5, 16, 1]], "lora_cases": [0], "breakable": false, "varlen_decode": false, "num_ubatches": 2, "ubatch_threshold": 32, "attention_support": "ALWAYS", "attention_split": true, "compiled_piecewise": true, "decode_sizes": [2, 1], "sglang": {"dp_size": 1, "disable_padding": true, "default_bs_list": false, "record_nolora_graph": true, "full_prefill_max_req": 2, "eagle_topk": 1, "eagle_steps": null}}',
}


def written_configs() -> dict[str, ManagerConfig]:
    """The configs of WRITTEN, built in code."""
    return {
        "default": ManagerConfig(),
        "decode_sizes": ManagerConfig(capture_sizes=(1, 2, 4, 8), decode_query_len=2, decode_sizes=(4, 1, 2)),
        "sglang": ManagerConfig(mode="FULL", capture_sizes=(2, 4), max_num_reqs=4,
                                sglang={"dp_size": 2, "eagle_steps": 3}),
        "sglang_defaults": ManagerConfig(sglang={}),
        "both": ManagerConfig(capture_sizes=(8, 16), max_num_reqs=16, decode_query_len=3,
                              spec_schedule=((1, 4, 2), (5, 16, 1)), num_ubatches=2, decode_sizes=(2, 1),
                              sglang={"disable_padding": True, "full_prefill_max_req": 2}),
    }


@pytest.mark.parametrize("name", sorted(WRITTEN))
def test_a_config_writes_the_json_it_always_wrote(name):
    config = written_configs()[name]
    assert json.dumps(config.to_json()) == WRITTEN[name]


@pytest.mark.parametrize("name", sorted(WRITTEN))
def test_the_written_json_loads_as_the_config_and_writes_itself_again(name):
    loaded = ManagerConfig.from_json(json.loads(WRITTEN[name]))
    assert loaded == written_configs()[name]
    assert json.dumps(loaded.to_json()) == WRITTEN[name]


def test_a_key_given_as_null_is_the_key_left_out():
    for key in ("decode_sizes", "sglang"):
        assert ManagerConfig.from_json({key: None}) == ManagerConfig()


# The SGLang options (EAGLE's) that came after docs/sglang-findings/ was written, at their defaults.
SGLANG_OPTIONS_ADDED_LATER = {"eagle_topk": 1, "eagle_steps": None}

DOCUMENTED = sorted(p for folder in ("findings", "sglang-findings", "encoder-findings")
                    for p in (DOCS / folder).glob("*.json"))


def test_there_are_documented_findings_to_check():
    assert len(DOCUMENTED) > 20 and any("sglang" in json.dumps(json.loads(p.read_text())["scenario"])
                                        for p in DOCUMENTED)


@pytest.mark.parametrize("path", DOCUMENTED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_documented_finding_keeps_its_id_through_a_load_and_its_scenario_written_again(path):
    data = json.loads(path.read_text())
    finding = Finding.from_json(data)
    assert finding.id == data["id"] and path.stem.endswith(finding.id)  # sglang's files carry a prefix
    if data["scenario"].get("kind", "decode") != "decode":
        return  # the encoder's scenarios are no ManagerConfig's
    scenario = data["scenario"]
    again = Scenario.from_json(scenario).to_json()
    if "sglang" in scenario["config"] and scenario["config"]["sglang"].keys() < again["config"]["sglang"].keys():
        # SGLang options added after the finding was written come back at their defaults (a new id).
        added = {k: v for k, v in again["config"]["sglang"].items() if k not in scenario["config"]["sglang"]}
        assert added == SGLANG_OPTIONS_ADDED_LATER
        scenario = {**scenario, "config": {**scenario["config"],
                                           "sglang": {**scenario["config"]["sglang"], **added}}}
    assert again == scenario  # and so its id: finding_id sorts the keys
    assert json.dumps(again) == json.dumps(scenario) or list(data["scenario"]) == sorted(data["scenario"])
