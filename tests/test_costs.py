"""The cost model (pure: no process) and its history file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from precompile_executor import _costs
from precompile_executor._costs import CostKey, CostModel

pytestmark = pytest.mark.timeout(10)


def test_nothing_known_predicts_zero_so_submission_order_stays() -> None:
    assert CostModel().estimate(CostKey("m:f", "1")) == 0.0


def test_the_prior_is_used_until_the_same_call_is_observed() -> None:
    model = CostModel()
    assert model.estimate(CostKey("m:f", "a", prior_s=2.0)) == 2.0
    model.observe(CostKey("m:f", "a", prior_s=2.0), 5.0)
    assert model.estimate(CostKey("m:f", "a", prior_s=2.0)) == 5.0


def test_observations_calibrate_the_prior_of_unseen_calls() -> None:
    model = CostModel()
    model.observe(CostKey("m:f", "a", prior_s=1.0), 3.0)  # priors run 3x short here
    assert model.estimate(CostKey("m:f", "b", prior_s=2.0)) == pytest.approx(6.0)
    assert model.estimate(CostKey("m:g", "b", prior_s=2.0)) == 2.0  # another function: not


def test_a_function_mean_stands_in_for_unseen_calls_without_a_prior() -> None:
    model = CostModel()
    model.observe(CostKey("m:f", "a"), 1.0)
    model.observe(CostKey("m:f", "b"), 3.0)
    assert model.estimate(CostKey("m:f", "c")) == pytest.approx(2.0)
    assert model.estimate(CostKey("m:new", "c")) == 0.0  # unknown: the executor places it


def test_the_running_mean_weighs_recent_observations() -> None:
    model = CostModel()
    key = CostKey("m:f", "a")
    for seconds in (1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0):
        model.observe(key, seconds)
    model.observe(key, 11.0)
    assert model.estimate(key) == pytest.approx(1.0 + 10.0 * _costs.EWMA_ALPHA)


def test_bad_durations_are_ignored() -> None:
    model = CostModel()
    model.observe(CostKey("m:f", "a"), float("nan"))
    model.observe(CostKey("m:f", "a"), -1.0)
    assert model.estimate(CostKey("m:f", "a")) == 0.0


def test_the_model_keeps_at_most_max_keys_dropping_the_least_recent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_costs, "MAX_KEYS", 3)
    model = CostModel()
    for i in range(5):
        model.observe(CostKey("m:f", str(i)), float(i + 1))
    model.observe(CostKey("m:f", "2"), 3.0)  # recently seen again
    keys = model.to_json()["functions"]["m:f"]["keys"]
    assert sorted(keys) == ["2", "3", "4"]


def test_call_features_keep_plain_data_and_drop_paths_and_objects() -> None:
    key = _costs.call_features(((64, 32, 4), "/tmp/cache-123", object(), "fp16"), {"n": 3})
    assert key == "(64,32,4),'fp16',n=3"
    assert _costs.call_features((list(range(1000)),), {}) == ""  # too long: no key
    assert _costs.call_features(("x" * 300,), {}) == ""


def test_features_key_is_canonical() -> None:
    assert _costs.features_key({"b": 2, "a": 1}) == _costs.features_key({"a": 1, "b": 2})


def test_function_key_names_module_and_qualname() -> None:
    import functools

    assert _costs.function_key(json.dumps) == "json:dumps"
    assert _costs.function_key(functools.partial(json.dumps, indent=2)) == "json:dumps"


def test_triton_prior_grows_with_the_tile_and_shrinks_with_warps() -> None:
    prior = _costs.triton_prior_s
    small = prior({"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32}, num_warps=4)
    large = prior({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64}, num_warps=4)
    assert large > small > 0
    assert prior({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64}, num_warps=8) < large
    assert prior({}, num_warps=4) > 0


def test_history_round_trips_through_its_file(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "costs.json"
    model = CostModel(path)
    model.observe(CostKey("m:f", "a", prior_s=1.0), 4.0)
    model.save()
    assert not list(path.parent.glob(".costs-*"))  # the temporary file was renamed
    again = CostModel(path)
    assert again.estimate(CostKey("m:f", "a")) == 4.0
    assert again.estimate(CostKey("m:f", "b", prior_s=1.0)) == 4.0  # calibration kept too


def test_save_without_new_observations_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "costs.json"
    CostModel(path).save()
    assert not path.exists()


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        json.dumps({"version": 99}),
        json.dumps({"version": 1, "functions": 3}),
        json.dumps({"version": 1, "functions": {"m:f": {"mean": ["x", 1], "keys": {}}}}),
    ],
)
def test_a_corrupt_history_is_ignored_with_a_warning(tmp_path: Path, content: str) -> None:
    path = tmp_path / "costs.json"
    path.write_text(content)
    with pytest.warns(RuntimeWarning, match="cost history"):
        model = CostModel(path)
    assert model.estimate(CostKey("m:f", "a")) == 0.0
    model.observe(CostKey("m:f", "a"), 1.0)
    model.save()  # overwritten with a good one
    assert CostModel(path).estimate(CostKey("m:f", "a")) == 1.0


def test_shared_model_is_one_per_file(tmp_path: Path) -> None:
    path = tmp_path / "costs.json"
    assert _costs.shared_model(path) is _costs.shared_model(str(path))
    assert _costs.shared_model(path) is not _costs.shared_model(tmp_path / "other.json")
