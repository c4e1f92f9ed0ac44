"""The method registry is the one list every consumer reads."""

import os

import gin
import pytest

from configs import sweeps
from specdec_jax import decoding, main
from specdec_jax.decoding import registry
from specdec_jax.eval import harness, main_job, plots

GIN_METHODS = os.path.join(main.GIN_DIR, "methods")


def test_every_row_builds_validates_and_reports_its_knobs():
  for entry in registry.ENTRIES:
    method = entry.make()
    method.validate()
    assert set(method.knobs()) <= set(entry.knobs) | {"alpha"}, entry.name
    assert entry.kind in ("baseline", "speculative", "cascade",
                          "sequential")
    assert (entry.grid is None or set(entry.grid) <= set(entry.knobs))
  labels = [e.label for e in registry.ENTRIES]
  assert len(set(labels)) == len(labels)
  assert {e.name for e in registry.ENTRIES if e.greedy_only} == {
      "lossy_greedy", "bild"}
  assert registry.get("target_only").uses_drafter is False


def test_consumers_read_the_registry():
  assert set(decoding.METHODS) == set(registry.REGISTRY)
  assert plots.LABELS["token_v3"] == "SpecCascade [TokenV3]"
  assert harness.NO_GAMMA == {"target_only", "drafter_only", "token_cascade",
                              "seq_cascade", "oracle_diff", "oracle_opt"}
  assert main_job.DEFAULT_GRID["opt"] == {"alpha": [0.0, 1.0, 3.0]}
  paper = sweeps.get_config("paper_t5")
  assert set(paper.methods) == {e.name for e in registry.ENTRIES
                                if e.grid is not None}
  assert list(paper.methods.token_v1.alpha) == [0.0, 0.1, 0.2, 0.4, 0.6]


@pytest.mark.parametrize("name", sorted(registry.REGISTRY))
def test_each_method_has_a_gin_file_that_builds_it(name):
  path = os.path.join(GIN_METHODS, f"{name}.gin")
  assert os.path.isfile(path), f"gin/methods/{name}.gin is missing"
  gin.clear_config()
  try:
    gin.parse_config_file(path)
    built = gin.query_parameter("method_spec.name")
    assert built == name
    method = main.method_spec()
  finally:
    gin.clear_config()
  assert type(method) is type(registry.get(name).make())


def test_no_gin_method_file_without_a_registry_row():
  files = {f[:-4] for f in os.listdir(GIN_METHODS) if f.endswith(".gin")}
  assert files == set(registry.REGISTRY)


def test_misspelled_knob_is_rejected_at_parse_time():
  gin.clear_config()
  with pytest.raises(ValueError, match="doesn't have a parameter named "
                     "'alpah'"):
    gin.parse_config("method_spec.alpah = 0.3")
  gin.clear_config()


def test_unknown_knob_names_the_method_and_its_knobs():
  with pytest.raises(ValueError, match=r"unknown \['gamma'\]; its knobs are "
                     r"\['alpha', 'beta', 'tuned'\]"):
    decoding.make_method("lossy", gamma=3)
