

def test_a_start_up_assertion_sglangs_rules_do_not_make_is_a_finding():
    # Only where sglang's rules leave no bs is capture_bs=[] a refusal of the config; here they leave bs 2.
    config = {"mode": "FULL_DECODE_ONLY", "capture_sizes": [22], "max_num_reqs": 1, "num_ubatches": 2,
              "ubatch_threshold": 2}
    assert "INIT-TOTAL" in violated_under("pool-not-aligned", config, [[1]])
