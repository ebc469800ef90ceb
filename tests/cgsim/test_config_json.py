"""The config's JSON, byte for byte: a finding's id is a hash of its
scenario's JSON, so every config written before keeps its text, engine
options included (each engine's keys at the top level, after the shared
fields, left out while the engine has no options), and every documented
finding loads with the id its file is named by, its scenario written again
unchanged."""

import json
from pathlib import Path

import pytest

from cgsim import engine_options
from cgsim.config import ConfigError, ManagerConfig
from cgsim.engine_options import EngineOptionsFormat, format_of_key, format_of_type
from cgsim.finding import Finding
from cgsim.scenario import Scenario, Step
from cgsim.spec.sglang_options import SglangOptions
from cgsim.spec.vllm_options import VllmOptions

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
        "decode_sizes": ManagerConfig(capture_sizes=(1, 2, 4, 8), decode_query_len=2,
                                      engine_options=(VllmOptions(decode_sizes=(4, 1, 2)),)),
        "sglang": ManagerConfig(mode="FULL", capture_sizes=(2, 4), max_num_reqs=4,
                                engine_options=(SglangOptions(dp_size=2, eagle_steps=3),)),
        "sglang_defaults": ManagerConfig(engine_options=(SglangOptions(),)),
        # Given in either order, the options keep the order their keys had as config fields.
        "both": ManagerConfig(capture_sizes=(8, 16), max_num_reqs=16, decode_query_len=3,
                              spec_schedule=((1, 4, 2), (5, 16, 1)), num_ubatches=2,
                              engine_options=(SglangOptions(disable_padding=True, full_prefill_max_req=2),
                                              VllmOptions(decode_sizes=(2, 1)))),
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


# -- engine options: errors as the config fields gave them, the accessor, the registry -----------

# What the config said of each bad input when the engine fields were its own (field, message).
WRITTEN_ERRORS = [
    ({"sglang": {"dp": 2}}, "sglang.dp", "config field 'sglang.dp' = 2: is not an SGLang option; use only "
     "default_bs_list, disable_padding, dp_size, eagle_steps, eagle_topk, full_prefill_max_req, record_nolora_graph"),
    ({"sglang": 3}, "sglang", "config field 'sglang' = 3: is not a JSON object; give an object such as "
     "{\"dp_size\": 2} or leave the field out"),
    ({"sglang": {"dp_size": 0}}, "sglang.dp_size", "config field 'sglang.dp_size' = 0: must be an integer >= 1; "
     "use 1 (no DP attention) or the number of DP attention ranks, e.g. 2"),
    ({"sglang": {"disable_padding": 1}}, "sglang.disable_padding",
     "config field 'sglang.disable_padding' = 1: is not true or false; use a JSON boolean"),
    ({"decode_sizes": [0, 1]}, "decode_sizes", "config field 'decode_sizes' = [0, 1]: must be distinct request "
     "counts >= 1; list each decode graph's request count once, or leave it out"),
    ({"decode_sizes": "x"}, "decode_sizes", "config field 'decode_sizes' = 'x': is not a list of integers; "
     "give decode_sizes as a list, e.g. [1, 2, 4]"),
    ({"decode_sizes": [1, 1]}, "decode_sizes", "config field 'decode_sizes' = [1, 1]: must be distinct request "
     "counts >= 1; list each decode graph's request count once, or leave it out"),
    ({"decode_sizes": [1, True]}, "decode_sizes",
     "config field 'decode_sizes' = [1, True]: has the non-integer True; use whole numbers"),
    ({"bogus": 1}, "bogus", "config field 'bogus' = 1: is not a config field; use only attention_split, "
     "attention_support, breakable, capture_sizes, compiled_piecewise, decode_query_len, decode_sizes, lora_cases, "
     "max_capture_size, max_num_reqs, mode, num_ubatches, sglang, spec_schedule, ubatch_threshold, varlen_decode"),
    ({"engine_options": []}, "engine_options", None),  # the field's name is no JSON key
]


@pytest.mark.parametrize("data,field,message", WRITTEN_ERRORS, ids=[e[1] + str(i) for i, e in
                                                                     enumerate(WRITTEN_ERRORS)])
def test_a_bad_engine_key_is_named_as_when_it_was_a_config_field(data, field, message):
    with pytest.raises(ConfigError) as err:
        ManagerConfig.from_json(data)
    assert err.value.field == field
    assert message is None or str(err.value) == message


def test_the_accessor_gives_each_engines_value_or_none():
    sgl, vllm = SglangOptions(dp_size=2), VllmOptions(decode_sizes=(1, 2))
    c = ManagerConfig(engine_options=(sgl,))
    assert c.options(SglangOptions) is sgl and c.options(VllmOptions) is None
    both = c.with_options(vllm)
    assert both.options(VllmOptions) == vllm and both.options(SglangOptions) is sgl
    assert both.engine_options == (vllm, sgl)  # the registry's order, whatever the order given
    assert both == ManagerConfig(engine_options=[sgl, vllm]) and hash(both) == hash(ManagerConfig(
        engine_options=(vllm, sgl)))
    assert both.with_options(SglangOptions()).options(SglangOptions) == SglangOptions()
    assert ManagerConfig().options(SglangOptions) is None


@pytest.mark.parametrize("options,problem", [
    ((SglangOptions(), SglangOptions(dp_size=2)), "holds two SglangOptions values"),
    (({"dp_size": 2},), "is a dict, no registered engine options type"),
    (SglangOptions(), "is not a tuple of engine options values"),
])
def test_engine_options_that_are_not_one_registered_value_per_engine_are_refused(options, problem):
    with pytest.raises(ConfigError, match=problem) as err:
        ManagerConfig(engine_options=options)
    assert err.value.field == "engine_options"


def test_the_config_module_names_no_engine():
    source = (Path(__file__).resolve().parents[2] / "cgsim" / "config.py").read_text().lower()
    assert "vllm" not in source and "sglang" not in source


def _fake_format(options_type, keys):
    return EngineOptionsFormat(options_type, keys, lambda v: {}, lambda present: options_type())


class _Fake:
    pass


def test_the_registry_refuses_a_format_that_is_none_or_takes_anothers_key_or_type():
    sgl = format_of_type(SglangOptions)
    assert sgl is not None and format_of_key("sglang") is sgl and format_of_key("decode_sizes").options_type is VllmOptions
    assert format_of_key("mode") is None and format_of_type(_Fake) is None
    found = [sgl]
    assert "not a cgsim.engine_options.EngineOptionsFormat" in engine_options._problem(object(), found)
    assert "registers SglangOptions again" in engine_options._problem(_fake_format(SglangOptions, ("other",)), found)
    assert "claims the JSON key 'sglang'" in engine_options._problem(_fake_format(_Fake, ("sglang",)), found)
    assert "names no JSON key" in engine_options._problem(_fake_format(_Fake, ()), found)
    assert engine_options._problem(_fake_format(_Fake, ("fake",)), found) is None


def test_the_scenario_code_builds_each_engines_options_from_their_own_modules():
    from cgsim.scenario_code import scenario_code

    config = written_configs()["both"]
    scenario = Scenario(config, (Step.capture(),), ruleset="vllm-0.34")
    code = scenario_code(scenario)
    assert "from cgsim.spec.vllm_options import VllmOptions\nfrom cgsim.spec.sglang_options import SglangOptions" in code
    assert "engine_options=(VllmOptions(decode_sizes=(2, 1)), SglangOptions(disable_padding=True, " in code
    namespace: dict = {}
    exec(code, namespace)  # noqa: S102 - cgsim's own generated code
    assert namespace["scenario"] == scenario


def test_an_outside_format_that_does_not_load_is_named_where_its_key_is_read(monkeypatch):
    from importlib.metadata import EntryPoint

    broken = EntryPoint("myengine", "no_such_module_here:OPTIONS_FORMAT", engine_options.ENTRY_POINT_GROUP)
    monkeypatch.setattr(engine_options, "entry_points", lambda group: [broken])
    monkeypatch.setattr(engine_options, "_formats", None)
    monkeypatch.setattr(engine_options, "_broken", {})
    # cgsim's own engines still load, and configs with their options still read and write.
    assert ManagerConfig.from_json(json.loads(WRITTEN["both"])) == written_configs()["both"]
    with pytest.raises(ConfigError, match="engine options entry point myengine = 'no_such_module_here:"
                                          "OPTIONS_FORMAT' does not load: ModuleNotFoundError"):
        ManagerConfig.from_json({"myengine_key": 1})
